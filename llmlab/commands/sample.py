"""llmlab sample: checkpoint + prompt -> text, streamed to stdout."""

import json
import sys
import time
from pathlib import Path

from llmlab.errors import ConfigError

KEYS = ("ckpt", "prompt", "max_new_tokens", "temperature", "top_k", "top_p", "num_samples", "seed", "device",
        "precision")


def sampling_config(cfg: dict):
    from llmlab.registry import parse_dataclass
    from llmlab.sample.generate import SamplingConfig
    return parse_dataclass(SamplingConfig, {k: cfg[k] for k in ("max_new_tokens", "temperature", "top_k", "top_p")
                                            if k in cfg}, "")


def validate(cfg: dict) -> None:
    for key in cfg:
        if key not in KEYS:
            raise ConfigError(f"{key}: unknown key; allowed: {', '.join(KEYS)}")
    sampling_config(cfg).check("")
    if not isinstance(cfg.get("num_samples"), int) or cfg["num_samples"] < 1:
        raise ConfigError(f"num_samples: must be an integer >= 1, got {cfg.get('num_samples')!r}")
    if cfg.get("prompt") is None:
        raise ConfigError("prompt: must be a string (\"\" starts from <|endoftext|>)")


def run(cfg: dict, run_dir: Path) -> None:
    import torch

    from llmlab import console
    from llmlab.errors import UserError
    from llmlab.sample.generate import generate
    from llmlab.train.checkpoint import build_model, load_checkpoint
    from llmlab.train.device import resolve_device

    validate(cfg)
    sampling = sampling_config(cfg)
    ckpt = load_checkpoint(cfg["ckpt"])
    objective = (ckpt.spec.get("objective") or {}).get("kind", "clm")
    if objective != "clm":
        raise UserError(f"ckpt: {ckpt.path} was trained with objective={objective} (bidirectional); "
                        "sampling needs a causal model (objective=clm)")
    device = resolve_device(str(cfg["device"]))
    model = build_model(ckpt, device)
    tok = ckpt.tokenizer()
    prompt = str(cfg["prompt"])
    ids = tok.encode(prompt) or ([tok.eos_id] if tok.eos_id is not None else [0])
    n = int(cfg["num_samples"])
    x = torch.tensor([ids] * n, device=device)
    gen = torch.Generator(device=device).manual_seed(int(cfg["seed"]))
    console.err.print(f"{ckpt.path} (step {ckpt.state.get('step')}), {device}", style="dim")

    stream = n == 1
    produced: list[int] = []
    printed = ""
    first_token_at: list[float] = []

    def on_token(tok_ids):
        nonlocal printed
        if not first_token_at:
            first_token_at.append(time.perf_counter())
        if not stream:
            return
        produced.append(int(tok_ids[0]))
        text = tok.decode(produced, skip_special=True)
        if text.endswith("\ufffd"):  # a multi-byte character is not complete yet
            return
        sys.stdout.write(text[len(printed):])
        sys.stdout.flush()
        printed = text

    if stream:
        sys.stdout.write(prompt)
        sys.stdout.flush()
    t0 = time.perf_counter()
    out = generate(model, x, sampling, eos_id=tok.eos_id, generator=gen, on_token=on_token)
    elapsed = time.perf_counter() - t0
    completions = []
    for row in out[:, len(ids):].tolist():
        if tok.eos_id is not None and tok.eos_id in row:
            row = row[:row.index(tok.eos_id)]
        completions.append(tok.decode(row, skip_special=True))
    if stream:
        rest = completions[0][len(printed):]
        sys.stdout.write(rest + "\n")
    else:
        for i, text in enumerate(completions):
            sys.stdout.write(f"--- sample {i + 1}/{n} ---\n{prompt}{text}\n")
    sys.stdout.flush()
    new_tokens = (out.shape[1] - len(ids)) * n
    ttft = (first_token_at[0] - t0) if first_token_at else float("nan")
    console.err.print(f"{new_tokens} tokens in {elapsed:.2f}s: {new_tokens / max(elapsed, 1e-9):,.1f} tokens/s; "
                      f"time to first token {ttft * 1000:.0f} ms", style="dim")
    with open(run_dir / "samples.jsonl", "a") as f:
        for text in completions:
            f.write(json.dumps({"ckpt": str(ckpt.path), "prompt": prompt, "completion": text,
                                "settings": {k: cfg[k] for k in KEYS if k != "ckpt"}}) + "\n")
