"""llmlab eval: checkpoint + data -> loss, perplexity, bits per byte."""

import json
from pathlib import Path

from llmlab.errors import ConfigError

KEYS = ("ckpt", "split", "text", "batch_size", "max_tokens", "device", "precision", "cache_dir", "data")


def validate(cfg: dict) -> None:
    for key in cfg:
        if key not in KEYS:
            raise ConfigError(f"{key}: unknown key; allowed: {', '.join(KEYS)}")
    if cfg.get("split") not in ("train", "val"):
        raise ConfigError(f"split: unknown '{cfg.get('split')}'; allowed: train, val")
    if not isinstance(cfg.get("batch_size"), int) or cfg["batch_size"] < 1:
        raise ConfigError(f"batch_size: must be an integer >= 1, got {cfg.get('batch_size')!r}")
    if cfg.get("max_tokens") is not None and (not isinstance(cfg["max_tokens"], int) or cfg["max_tokens"] < 1):
        raise ConfigError(f"max_tokens: must be an integer >= 1 or null, got {cfg['max_tokens']!r}")
    if cfg.get("data") is not None:
        from llmlab.data.corpus import CORPUS
        CORPUS.config(cfg["data"], "data")


def run(cfg: dict, run_dir: Path) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    from rich.table import Table

    from llmlab import console
    from llmlab.eval.data import eval_tokens
    from llmlab.eval.loss import bits_per_byte, evaluate_loss
    from llmlab.data.batches import num_fixed_windows
    from llmlab.train.checkpoint import build_model, load_checkpoint
    from llmlab.train.device import autocast, resolve_device, resolve_precision

    validate(cfg)
    ckpt = load_checkpoint(cfg["ckpt"])
    device = resolve_device(str(cfg["device"]))
    precision = resolve_precision(str(cfg["precision"]), device)
    model = build_model(ckpt, device)
    tokens, nbytes, source = eval_tokens(ckpt, cfg)
    block = model.max_seq_len
    max_windows = None if cfg.get("max_tokens") is None else max(1, cfg["max_tokens"] // block)
    n_windows = num_fixed_windows(tokens, block, max_windows)
    with Progress(TextColumn("[bold]eval"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console.err) as progress:
        task = progress.add_task("eval", total=n_windows)
        res = evaluate_loss(model, tokens, block, int(cfg["batch_size"]), device, autocast(device, precision),
                            max_windows, on_batch=lambda n: progress.advance(task, n))
    causal = model.objective.causal
    # bits per byte describe next-token prediction; a masked-token loss reports accuracy instead
    bpb = bits_per_byte(res["loss"], len(tokens), nbytes) if causal else None
    result = {"ckpt": str(ckpt.path), "step": ckpt.state.get("step"), "source": source,
              "objective": (ckpt.spec.get("objective") or {}).get("kind", "clm"), "tokens_scored": res["tokens"],
              "loss": res["loss"], "ppl": res["ppl"], "accuracy": res["accuracy"], "bpb": bpb,
              "bytes_per_token": nbytes / max(1, len(tokens)), "device": str(device), "precision": precision}
    table = Table(title=f"eval: {ckpt.path}", title_justify="left")
    columns = ("data", "tokens", "loss", "ppl", "accuracy", "bits/byte") if causal else \
        ("data", "masked tokens", "masked loss", "ppl", "masked accuracy")
    for col in columns:
        table.add_column(col, justify="left" if col == "data" else "right")
    row = [source, f"{res['tokens']:,}", f"{res['loss']:.4f}", f"{res['ppl']:.2f}", f"{res['accuracy']:.3f}"]
    table.add_row(*row, *([f"{bpb:.4f}"] if causal else []))
    console.out.print(table)
    out = run_dir / "eval.json"
    out.write_text(json.dumps(result, indent=2))
    console.out.print(f"results: {out}")
