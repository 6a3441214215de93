"""llmlab sample: checkpoint + prompt(s) -> text; one prompt streams to stdout. With
``draft=<ckpt>`` or ``spec.mtp=true``, speculative decoding (exact).

The command's settings, prompts, both decoders and the speed comparison that pairs them sit
together: the comparison reruns the same prompts through the other path."""

import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmlab.errors import ConfigError
from llmlab.registry import bounded, choice, parse_dataclass, settings_lines, store_schema
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
class SampleConfig:
    """``llmlab sample``'s settings."""

    ckpt: str | None = None  # a checkpoint directory, or a run directory (its latest checkpoint)
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
    seed: int = 0
    device: str = "auto"
    precision: str = choice("auto", PRECISIONS)
    pack_weights: Any = "auto"  # auto | true | false: CPU decoding with oneDNN-prepacked weights (x86-64: auto is on)
    draft: str | None = None  # a smaller checkpoint (same tokenizer) for speculative decoding
    spec: SpeculativeConfig = field(default_factory=SpeculativeConfig)

    def check(self, prefix: str) -> None:
        from llmlab.model.packing import check_pack
        from llmlab.train.device import resolve_device

        sampling_config(dataclasses.asdict(self))  # its own checks, with sample's top-level keys
        resolve_device(self.device)
        check_pack(self.pack_weights)
        prompt = self.prompt
        if self.prompt_file is None and not (isinstance(prompt, str) or (
                isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt))):
            raise ConfigError("prompt: must be a string or a list of strings (\"\" starts from <|endoftext|>)")
        if self.spec.mtp and self.draft is not None:
            raise ConfigError("spec.mtp: self-speculative decoding uses no draft; drop draft= or spec.mtp=true")
        if self.spec.draft_vocab is not None and self.draft is None:
            raise ConfigError("spec.draft_vocab: shortlists a draft model's tokens; pass draft=<ckpt> or drop it")


SCHEMA = store_schema("sample", SampleConfig)
SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_k", "top_p", "min_p", "repetition_penalty")


def sampling_config(cfg: dict):
    from llmlab.sample.generate import SamplingConfig
    return parse_dataclass(SamplingConfig, {k: cfg[k] for k in SAMPLING_KEYS if k in cfg}, "")


def validate(cfg: dict) -> None:
    parse_dataclass(SCHEMA, cfg, "")


def help_settings() -> list[str]:
    return settings_lines(SCHEMA)


def read_prompts(cfg: dict) -> list[str]:
    from llmlab.errors import UserError

    if cfg.get("prompt_file") is None:
        prompt = cfg["prompt"]
        return [prompt] if isinstance(prompt, str) else list(prompt)
    path = Path(str(cfg["prompt_file"])).expanduser()
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


def run(cfg: dict, run_dir: Path) -> None:
    import torch

    from llmlab import console
    from llmlab.errors import UserError
    from llmlab.model.packing import should_pack
    from llmlab.train.checkpoint import build_model
    from llmlab.train.device import autocast, resolve_device, resolve_precision

    validate(cfg)
    sampling = sampling_config(cfg)
    ckpt = causal_checkpoint(cfg["ckpt"], "ckpt")
    device = resolve_device(str(cfg["device"]))
    amp = autocast(device, resolve_precision(str(cfg["precision"]), device))
    model = build_model(ckpt, device)
    tok = ckpt.tokenizer()
    spec_cfg = cfg["spec"]  # the speculative-decoding settings (not a model spec)
    draft = draft_vocab = None
    if cfg.get("draft") is not None:
        dckpt = causal_checkpoint(cfg["draft"], "draft")
        if dckpt.tokenizer_path.read_bytes() != ckpt.tokenizer_path.read_bytes():
            raise UserError(f"draft: {dckpt.path} uses another tokenizer than ckpt={ckpt.path}; "
                            "a draft must share the target's tokenizer")
        draft = build_model(dckpt, device)
        draft_vocab = draft_shortlist(spec_cfg.get("draft_vocab"), dckpt, ckpt)
    elif spec_cfg["mtp"] and not len(model.mtp):
        raise UserError(f"spec.mtp: {ckpt.path} has no MTP heads (model.mtp_heads=0); train with model.mtp_heads=N "
                        "or pass draft=<ckpt>")
    prompts = read_prompts(cfg)
    n = int(cfg["num_samples"])
    eos_id = tok.eos_id if cfg.get("stop_at_eos", True) else None
    encoded = [tok.encode(p) or ([tok.eos_id] if tok.eos_id is not None else [0]) for p in prompts]
    gen = torch.Generator(device=device).manual_seed(int(cfg["seed"]))
    speculative = draft is not None or spec_cfg["mtp"]
    stop = f", min_confidence={spec_cfg['min_confidence']:g}" if spec_cfg.get("min_confidence") else ""
    stop += f", draft vocabulary {len(draft_vocab):,} tokens" if draft_vocab is not None else ""
    how = (f", speculative: draft {Path(cfg['draft'])}, k={spec_cfg['k']}{stop}" if draft is not None
           else f", self-speculative with {len(model.mtp)} MTP heads" if speculative else "")
    pack = cfg.get("pack_weights", "auto")
    with amp, torch.no_grad():
        packed = ", packed weights" if should_pack([model, *([draft] if draft is not None else [])], pack) else ""
    console.err.print(f"{ckpt.path} (step {ckpt.state.get('step')}), {device}{packed}{how}", style="dim")

    stream = len(prompts) == 1 and n == 1
    writer = StreamWriter(tok) if stream else None
    if stream:
        sys.stdout.write(prompts[0])
        sys.stdout.flush()
    t0 = time.perf_counter()
    with amp:
        if speculative:
            results, stats = _speculative(model, draft, encoded, n, sampling, spec_cfg["k"], eos_id, gen, writer,
                                          float(spec_cfg.get("min_confidence", 0.0)), pack, draft_vocab)
        else:
            results, stats = _plain(model, encoded, n, sampling, eos_id, gen, writer, pack)
    elapsed = time.perf_counter() - t0
    completions = [(i, _completion(tok, row, eos_id)) for i, row in results]
    if stream:
        rest = completions[0][1][len(writer.printed):]
        sys.stdout.write(rest + "\n")
    else:
        for j, (i, text) in enumerate(completions):
            sys.stdout.write(f"--- prompt {i + 1}/{len(prompts)}, sample {j % n + 1}/{n} ---\n{prompts[i]}{text}\n")
    sys.stdout.flush()
    new_tokens = stats["new_tokens"]
    ttft = stats["first_token_s"]
    line = (f"{new_tokens} tokens in {elapsed:.2f}s: {new_tokens / max(elapsed, 1e-9):,.1f} tokens/s; "
            f"time to first token {ttft * 1000:.0f} ms" if ttft is not None else f"{new_tokens} tokens")
    record = {"new_tokens": new_tokens, "seconds": elapsed, "tokens_per_s": new_tokens / max(elapsed, 1e-9),
              "first_token_s": ttft}
    if speculative:
        line += (f"; acceptance {stats['acceptance']:.1%}, {stats['tokens_per_forward']:.2f} tokens per target "
                 f"forward")
        record.update({k: stats[k] for k in ("acceptance", "tokens_per_forward", "rounds")})
        if spec_cfg["compare"]:
            with amp:
                base = _compare(model, encoded, n, sampling, results, stats, gen, device, pack)
            base["speedup"] = base["plain_seconds"] / max(elapsed, 1e-9)
            record.update(base)
            same = ("; same tokens as plain greedy" if base["identical"] else "; differs from plain greedy") \
                if sampling.temperature == 0 else ""
            line += f"; plain decoding {base['plain_tokens_per_s']:,.1f} tokens/s, speed-up {base['speedup']:.2f}x{same}"
    console.err.print(line, style="dim")
    with open(run_dir / "samples.jsonl", "a") as f:
        for i, text in completions:
            f.write(json.dumps({"ckpt": str(ckpt.path), "prompt": prompts[i], "completion": text,
                                "settings": {k: v for k, v in cfg.items() if k != "ckpt"}}) + "\n")
        f.write(json.dumps({"stats": record}) + "\n")


class StreamWriter:
    """Prints a single sample's text as its tokens arrive, holding back a partial character."""

    def __init__(self, tok):
        self.tok, self.ids, self.printed = tok, [], ""

    def __call__(self, token: int) -> None:
        self.ids.append(int(token))
        text = self.tok.decode(self.ids, skip_special=True)
        if text.endswith("\ufffd"):  # a multi-byte character is not complete yet
            return
        sys.stdout.write(text[len(self.printed):])
        sys.stdout.flush()
        self.printed = text


def _completion(tok, row: list[int], eos_id) -> str:
    if eos_id is not None and eos_id in row:
        row = row[:row.index(eos_id)]
    return tok.decode(row, skip_special=True)


def _plain(model, encoded, n, sampling, eos_id, gen, writer, pack="auto"):
    """Prompts of one token length share a batch (no padding, so every row is exact)."""
    import torch

    from llmlab.sample.generate import generate

    device = next(model.parameters()).device
    by_length: dict[int, list[int]] = {}
    for i, ids in enumerate(encoded):
        by_length.setdefault(len(ids), []).append(i)
    results: dict[int, list[list[int]]] = {}
    first: list[float] = []
    new_tokens = 0
    t0 = time.perf_counter()

    def on_token(toks):
        if not first:
            first.append(time.perf_counter() - t0)
        if writer is not None:
            writer(int(toks[0]))

    for length, members in by_length.items():
        x = torch.tensor([encoded[i] for i in members for _ in range(n)], device=device)
        out = generate(model, x, sampling, eos_id=eos_id, generator=gen, on_token=on_token, pack=pack)
        rows = out[:, length:].tolist()
        for r, i in enumerate(m for m in members for _ in range(n)):
            results.setdefault(i, []).append(rows[r])
            new_tokens += len(rows[r][:rows[r].index(eos_id) + 1] if eos_id in rows[r] else rows[r])
    ordered = [(i, row) for i in range(len(encoded)) for row in results[i]]
    return ordered, {"new_tokens": new_tokens, "first_token_s": first[0] if first else None}


def draft_shortlist(n, dckpt, ckpt):
    """``spec.draft_vocab``: the ``n`` tokens most frequent in the draft's training data (or,
    for a draft saved without token counts, the target's); None for all."""
    from llmlab.errors import UserError
    from llmlab.sample.speculative import frequent_tokens

    if n is None:
        return None
    counts = dckpt.token_counts()
    counts = counts if counts is not None else ckpt.token_counts()
    if counts is None:
        raise UserError(f"spec.draft_vocab: neither draft={dckpt.path} nor ckpt={ckpt.path} holds token counts "
                        "(token_counts.safetensors, saved by llmlab train); drop spec.draft_vocab or train again")
    if n >= len(counts):
        return None
    return frequent_tokens(counts, n)


def _speculative(model, draft, encoded, n, sampling, k, eos_id, gen, writer, min_confidence=0.0, pack="auto",
                 draft_vocab=None):
    """One sequence at a time: each row accepts a different number of drafts per round."""
    from llmlab.sample.speculative import speculative_generate

    results, totals, first = [], {"proposed": 0, "accepted": 0, "forwards": 0, "rounds": 0, "new": 0}, None
    for i, ids in enumerate(encoded):
        for _ in range(n):
            out, st = speculative_generate(model, ids, sampling, k, draft, eos_id, gen, writer, min_confidence, pack,
                                           draft_vocab)
            results.append((i, out[len(ids):]))
            first = st.first_token_s if first is None else first
            totals["proposed"] += st.proposed
            totals["accepted"] += st.accepted
            totals["forwards"] += st.target_forwards
            totals["rounds"] += st.rounds
            totals["new"] += st.new_tokens
    return results, {"new_tokens": totals["new"], "first_token_s": first, "rounds": totals["rounds"],
                     "acceptance": totals["accepted"] / max(1, totals["proposed"]),
                     "tokens_per_forward": totals["new"] / max(1, totals["forwards"])}


def _compare(model, encoded, n, sampling, results, stats, gen, device, pack="auto") -> dict:
    """Plain decoding of as many tokens per sequence as the speculative run made, timed."""
    import dataclasses

    import torch

    from llmlab.sample.generate import generate

    t0 = time.perf_counter()
    identical = True
    for (i, row) in results:
        cfg = dataclasses.replace(sampling, max_new_tokens=len(row))
        x = torch.tensor([encoded[i]], device=device)
        out = generate(model, x, cfg, generator=gen, pack=pack)[0, len(encoded[i]):].tolist()
        identical = identical and out == row
    plain_s = time.perf_counter() - t0
    return {"plain_seconds": plain_s, "plain_tokens_per_s": stats["new_tokens"] / max(plain_s, 1e-9),
            "identical": identical}
