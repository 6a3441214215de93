"""llmlab sample: checkpoint + prompt(s) -> text; one prompt streams to stdout. With
``draft=<ckpt>`` or ``spec.mtp=true``, speculative decoding (exact). The decoding itself is
`llmlab.sample.session`'s; here are the settings, the prompts and what is printed."""

import collections
import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmlab.commands import Command
from llmlab.errors import ConfigError
from llmlab.files import open_append
from llmlab.registry import Checked, bounded, choice, parse_dataclass
from llmlab.train.device import PRECISIONS

@dataclass
class SpeculativeConfig:
    """``spec.*``: speculative decoding, with ``draft=<ckpt>`` or the model's MTP heads."""

    k: int = bounded(4, at_least=1)  # tokens drafted per round
    mtp: bool = False  # true: self-speculative decoding with the model's own MTP heads (no draft)
    compare: bool = True  # also time plain decoding of the same tokens, and report the speed-up
    min_confidence: float = bounded(0.0, at_least=0, at_most=1)  # stop a round's drafting after a token the draft gave less than this probability
    draft_vocab: int | None = bounded(None, at_least=1)  # N: the draft proposes only the N most frequent training tokens (a cheaper head); null: all


@dataclass
class SampleConfig(Checked):
    """``llmlab sample``'s settings."""

    ckpt: str | None = None  # a checkpoint directory, a run directory (its latest checkpoint), or a transformers directory (llama, qwen3, gpt2)
    weights: str = choice("raw", ("raw", "ema"))  # ema: the moving average a run trained with train.ema kept
    prompt: Any = "def "  # a string, or a list: prompt='[def ,class ]'
    prompt_file: str | None = None  # prompts from a file: one per line (.txt) or {"prompt": ...} per line (.jsonl)
    max_new_tokens: int = 200
    temperature: float = 0.8  # 0: greedy
    top_k: int | None = 50  # null: no top-k filter
    top_p: float = 0.95  # nucleus sampling; 1.0: off
    min_p: float = 0.0  # drop tokens below min_p x the top token's probability; 0: off
    repetition_penalty: float = 1.0  # > 1 discourages tokens already in the text (CTRL); 1: off
    stop_at_eos: bool = True  # stop a sample at <|endoftext|>
    num_samples: int = bounded(1, at_least=1)  # samples per prompt
    seed: int = bounded(0, at_least=0)
    device: str = "auto"
    precision: str = choice("auto", PRECISIONS)  # auto: bf16 on CUDA GPUs that have it, else fp32 (CPU decoding too)
    pack_weights: Any = "auto"  # auto | true | false: CPU decoding with weights laid out anew (auto: the layout each model measures fastest in; true: oneDNN's)
    threads: Any = "auto"  # auto | N: CPU threads of decoding (auto: all of torch's, less the share of the CPUs other processes use, read every 0.25 s; N: N throughout)
    cuda_graph: bool = True  # on CUDA, each new token's kernels replayed as one recorded CUDA graph (plain decoding of mha, gqa and mqa with dense FFNs); false: launched one by one
    draft: str | None = None  # a smaller checkpoint (same tokenizer) for speculative decoding
    spec: SpeculativeConfig = field(default_factory=SpeculativeConfig)

    def check(self, prefix: str) -> None:
        from llmlab.model.config import check_pack
        from llmlab.sample.settings import check_threads
        from llmlab.train.device import check_device

        sampling_config(dataclasses.asdict(self))  # its own checks, with sample's top-level keys
        check_device(self.device)
        check_pack(self.pack_weights)
        check_threads(self.threads)
        prompt = self.prompt
        if self.prompt_file is None and not (isinstance(prompt, str) or (
                isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt))):
            raise ConfigError("prompt: must be a string or a list of strings (\"\" starts from <|endoftext|>)")
        if self.prompt_file is not None and prompt != SampleConfig.prompt:  # one of them was left unused, in silence
            raise ConfigError("prompt: give prompt= or prompt_file=, not both")
        if self.spec.mtp and self.draft is not None:
            raise ConfigError("spec.mtp: self-speculative decoding uses no draft; drop draft= or spec.mtp=true")
        if self.spec.draft_vocab is not None and self.draft is None:
            raise ConfigError("spec.draft_vocab: shortlists a draft model's tokens; pass draft=<ckpt> or drop it")


SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_k", "top_p", "min_p", "repetition_penalty")


def sampling_config(cfg: dict):
    from llmlab.sample.settings import SamplingConfig
    return parse_dataclass(SamplingConfig, {k: cfg[k] for k in SAMPLING_KEYS if k in cfg}, "")


def read_prompts(job: "SampleConfig") -> list[str]:
    from llmlab.errors import UserError

    if job.prompt_file is None:
        return [job.prompt] if isinstance(job.prompt, str) else list(job.prompt)
    path = Path(os.path.expanduser(job.prompt_file))
    if not path.is_file():
        raise UserError(f"prompt_file: {path} is not a file")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise UserError(f"prompt_file: {path} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    if path.suffix == ".jsonl":
        prompts = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                prompts.append(str(json.loads(line)["prompt"]))
            except (ValueError, KeyError, TypeError) as e:
                raise UserError(f"prompt_file: {path}:{n} is not a JSON object with a \"prompt\" ({e})") from e
    else:
        prompts = [line for line in lines if line.strip()]
    if not prompts:
        raise UserError(f"prompt_file: {path} holds no prompts")
    return prompts


def causal_checkpoint(path, key: str):
    from llmlab.errors import UserError
    from llmlab.train.checkpoint import load_checkpoint

    ckpt = load_checkpoint(path)
    if not ckpt.causal:
        raise UserError(f"{key}: {ckpt.path} was trained with objective={ckpt.objective} (bidirectional); "
                        "sampling needs a causal model (objective=clm)")
    return ckpt


def decode_layouts(models, pack) -> tuple[collections.Counter, Path | None]:
    """How many layers of ``models`` decode in each layout (`llmlab.model.packing`), and, where
    ``pack`` is "auto" and every model's layout was measured by an earlier run, the file that
    kept them (None: measured now, or not "auto"). Layouts measured now go into that file
    (the llmlab cache's `LAYOUT_FILE`) for the next run; a damaged file is said in one line
    and written anew."""
    from llmlab import console
    from llmlab.data.prepare import cache_root
    from llmlab.files import what_became, write_kept
    from llmlab.model.packing import LAYOUT_FILE, chosen_linears, layout_key, read_layouts, should_pack

    if pack != "auto" or not should_pack(models, pack):  # another device, autocast: nothing to measure
        return collections.Counter(chosen_linears(models, pack).values()), None
    path = cache_root() / LAYOUT_FILE
    known, note = read_layouts(path)
    before = dict(known)
    layouts = collections.Counter(chosen_linears(models, pack, known=known).values())
    if known != before or note:
        written = write_kept(path, known)
        if note:
            console.err.print(what_became(note, written), style="yellow")
    return layouts, path if all(layout_key(m) in before for m in models) else None


def layouts_said(layouts: collections.Counter, kept: Path | None, layers: int) -> str:
    """What the header line says of `decode_layouts`: "" where every layer decodes by
    ``F.linear`` as it is."""
    from llmlab.model.packing import CASTS

    cast = next((c for c in CASTS.values() if c in layouts), None)
    if cast is not None:
        return f", weights cast to {cast} once (autocast would cast them at every step)"
    if not layouts:
        return ""
    said = (f", packed weights ({next(iter(layouts))}" if len(layouts) == 1 and layouts.total() == layers else
            f", packed weights ({', '.join(f'{k} {v}' for k, v in layouts.items())} of {layers} layers")
    return said + (f"; as measured before, kept in {kept})" if kept else ")")


def run(job: SampleConfig, run_dir: Path) -> None:
    from llmlab.files import checkpoint_arg

    checkpoint_arg(job.ckpt)  # a mistyped path is one line before torch loads
    if job.draft is not None:
        checkpoint_arg(job.draft, "draft")
    import torch

    found = torch.get_num_threads()
    if job.threads != "auto":
        torch.set_num_threads(job.threads)  # before the layouts are measured: they are kept by thread count
    try:
        _run(job, run_dir)
    finally:  # as it was (the command may run inside another program: a test, a notebook)
        torch.set_num_threads(found)


def _run(job: SampleConfig, run_dir: Path) -> None:
    import torch

    from llmlab import console
    from llmlab.errors import UserError
    from llmlab.sample.session import StreamWriter, decode_prompts, draft_shortlist
    from llmlab.sample.threads import ThreadPicker
    from llmlab.train.checkpoint import build_model
    from llmlab.train.device import autocast, resolve_device, resolve_precision

    sampling = sampling_config(dataclasses.asdict(job))
    device = resolve_device(job.device)
    picker = ThreadPicker.for_decoding(device, job.threads)  # its first reading of the load covers the loading
    ckpt = causal_checkpoint(job.ckpt, "ckpt")
    # decoding in bf16 was measured slower than fp32 on a CPU with bf16 units too (bench.decode_vs_hf,
    # AVX-512 BF16: 521 against 810 tokens/s at 1.7M, level at 22.9M): auto keeps fp32 there
    amp = autocast(device, resolve_precision(job.precision, device, cpu_bf16=False))
    model = build_model(ckpt, device, job.weights)
    tok = ckpt.tokenizer()
    spec = job.spec  # the speculative-decoding settings (not a model spec)
    draft = draft_vocab = None
    if job.draft is not None:
        dckpt = causal_checkpoint(job.draft, "draft")
        if dckpt.tokenizer_path.read_bytes() != ckpt.tokenizer_path.read_bytes():
            raise UserError(f"draft: {dckpt.path} uses another tokenizer than ckpt={ckpt.path}; "
                            "a draft must share the target's tokenizer")
        draft = build_model(dckpt, device)
        draft_vocab = draft_shortlist(spec.draft_vocab, dckpt, ckpt)
    elif spec.mtp and not len(model.mtp):
        raise UserError(f"spec.mtp: {ckpt.path} has no MTP heads (model.mtp_heads=0); train with model.mtp_heads=N "
                        "or pass draft=<ckpt>")
    prompts = read_prompts(job)
    n = job.num_samples
    eos_id = tok.eos_id if job.stop_at_eos else None
    encoded = [tok.encode(p) or ([tok.eos_id] if tok.eos_id is not None else [0]) for p in prompts]
    window = min([model.max_seq_len] + ([draft.max_seq_len] if draft is not None else []))
    if (longer := [i for i, ids in enumerate(encoded) if len(ids) > window]):
        named = ", ".join(str(i + 1) for i in longer[:5]) + (", ..." if len(longer) > 5 else "")
        which = ("the prompt is" if len(prompts) == 1 else
                 f"prompt {named} of {len(prompts)} is" if len(longer) == 1 else
                 f"{len(longer)} of the {len(prompts)} prompts ({named}) are")
        console.err.print(f"prompt: {which} longer than the model's context of {window:,} tokens (the longest "
                          f"{max(len(encoded[i]) for i in longer):,}): the model sees only the last {window:,}",
                          style="yellow", highlight=False)
    gen = torch.Generator(device=device).manual_seed(job.seed)
    speculative = draft is not None or spec.mtp
    stop = f", min_confidence={spec.min_confidence:g}" if spec.min_confidence else ""
    stop += f", draft vocabulary {len(draft_vocab):,} tokens" if draft_vocab is not None else ""
    how = (f", speculative: draft {Path(job.draft)}, k={spec.k}{stop}" if draft is not None
           else f", self-speculative with {len(model.mtp)} MTP heads" if speculative else "")
    if device.type == "cuda" and not speculative:
        from llmlab.sample.graphs import why_not
        blocked = "cuda_graph=false" if not job.cuda_graph else why_not(model, model.new_cache(1, 1))
        how += ", CUDA graph decoding" if blocked is None else f", kernels launched one by one ({blocked})"
    with amp, torch.no_grad():
        models = [model, *([draft] if draft is not None else [])]
        layouts, kept = decode_layouts(models, job.pack_weights)
        layers = sum(type(m) is torch.nn.Linear for m in models for m in m.modules())
        packed = layouts_said(layouts, kept, layers)
    what = f"step {ckpt.state['step']}" if ckpt.state.get("step") is not None else f"from its {ckpt.spec_file}"
    console.err.print(f"{ckpt.path} ({what}), {device}{packed}{how}", style="dim")

    stream = len(prompts) == 1 and n == 1
    writer = StreamWriter(tok) if stream else None
    if stream:
        sys.stdout.write(prompts[0])
        sys.stdout.flush()
    done = decode_prompts(model, tok, encoded, n, sampling, eos_id, gen, draft=draft, mtp=spec.mtp, k=spec.k,
                          min_confidence=spec.min_confidence, draft_vocab=draft_vocab, compare=spec.compare,
                          pack=job.pack_weights, amp=amp, writer=writer, graphs=job.cuda_graph, threads=picker)
    if stream:
        sys.stdout.write(done.completions[0][1][len(writer.printed):] + "\n")
    else:
        for j, (i, text) in enumerate(done.completions):
            sys.stdout.write(f"--- prompt {i + 1}/{len(prompts)}, sample {j % n + 1}/{n} ---\n{prompts[i]}{text}\n")
    sys.stdout.flush()
    console.err.print(done.line, style="dim")
    settings = {k: v for k, v in dataclasses.asdict(job).items() if k != "ckpt"}
    with open_append(run_dir / "samples.jsonl") as f:
        for i, text in done.completions:
            f.write(json.dumps({"ckpt": str(ckpt.path), "prompt": prompts[i], "completion": text,
                                "settings": settings}) + "\n")
        f.write(json.dumps({"stats": done.record}) + "\n")


COMMAND = Command("sample", SampleConfig, run)
SCHEMA = COMMAND.schema
