"""llmlab eval: checkpoint + data -> loss, perplexity, bits per byte, per-position loss, and
optionally an analysis (``analysis=attention``) and multiple-choice tasks (``tasks=[file.jsonl]``)."""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmlab.commands import Command
from llmlab.data.corpus import CORPUS
from llmlab.errors import ConfigError, UserError
from llmlab.eval.analysis import ANALYSIS
from llmlab.files import atomic_write_text
from llmlab.registry import Checked, bounded, choice, section
from llmlab.train.device import PRECISIONS

SPLITS = ("train", "val")


@dataclass
class EvalConfig(Checked):
    """``llmlab eval``'s settings; ``data`` and ``analysis`` come from their config groups."""

    ckpt: str | None = None  # a checkpoint directory, a run directory (its latest checkpoint), or a transformers directory (llama, qwen3, gpt2)
    weights: str = choice("raw", ("raw", "ema"))  # ema: the moving average a run trained with train.ema kept
    split: str = choice("val", SPLITS)
    text: str | None = None  # a text file to score instead of a split
    batch_size: int = bounded(8, at_least=1)
    max_batches: int | None = bounded(None, at_least=1)  # cap the batches scored (windows spread evenly over the data); null: all
    max_tokens: int | None = bounded(None, at_least=1)  # cap the tokens scored; null: the whole split
    device: str = "auto"
    precision: str = choice("auto", PRECISIONS)  # auto: bf16 on CUDA GPUs that have it and on CPUs with bf16 units, as train
    cache_dir: str | None = None
    tasks: list[str] = field(default_factory=list)  # multiple-choice tasks scored by likelihood: JSON-lines files or datasets sources
    data: Any = section()
    analysis: Any = section()

    def check(self, prefix: str) -> None:
        from llmlab.train.device import check_device

        check_device(self.device)
        if self.text is not None and self.data is not None:  # the text was scored and data= passed over
            raise ConfigError("text: give text= or data=, not both")
        if self.text is not None and self.split != "val":
            raise ConfigError(f"split: text= is scored whole; split={self.split} picks a split of the data, not of a "
                              "text")

    def max_windows(self, block: int) -> int | None:
        """The window cap from ``max_batches`` and ``max_tokens`` (the smaller wins)."""
        caps = []
        if self.max_batches is not None:
            caps.append(self.max_batches * self.batch_size)
        if self.max_tokens is not None:
            caps.append(max(1, self.max_tokens // block))
        return min(caps) if caps else None


def run(job: EvalConfig, run_dir: Path) -> None:
    from llmlab.files import checkpoint_arg

    checkpoint_arg(job.ckpt)  # a mistyped path is one line before torch loads
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    from rich.table import Table

    from llmlab import console
    from llmlab.data.batches import num_fixed_windows
    from llmlab.eval.data import eval_tokens
    from llmlab.eval.loss import bits_per_byte, evaluate_loss
    from llmlab.eval.plots import per_position_plot
    from llmlab.train.checkpoint import build_model, load_checkpoint
    from llmlab.train.device import autocast, keep_freed_memory, resolve_device, resolve_precision

    from llmlab.eval.tasks import task_files

    tasks = task_files(job.tasks)  # a malformed line is one line before the model loads
    ckpt = load_checkpoint(job.ckpt)
    if tasks and not ckpt.causal:
        raise UserError(f"tasks: {ckpt.path} is a masked-token model (objective={ckpt.objective}), which scores no "
                        "continuation; tasks need a left-to-right one (objective=clm)")
    device = resolve_device(job.device)
    precision = resolve_precision(job.precision, device)
    if device.type == "cpu":
        keep_freed_memory()  # each batch's activations: reuse the memory, as train does (a tenth of the page faults)
    model = build_model(ckpt, device, job.weights)
    tokens, nbytes, source = eval_tokens(ckpt, job.text, job.split, job.data, job.cache_dir)
    block = model.max_seq_len
    if len(tokens) < block + 1:  # the model's context is fixed here: more text is the only remedy
        key = "text" if job.text else "data" if job.data else "split"
        raise UserError(f"{key}: {source} has {len(tokens):,} tokens, fewer than one window of {block + 1:,} (the "
                        f"model's context of {block:,} and the token after it); give more text")
    cap = job.max_windows(block)
    n_windows = num_fixed_windows(tokens, block, cap)
    with Progress(TextColumn("[bold]eval"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console.err) as progress:
        task = progress.add_task("eval", total=n_windows)
        res = evaluate_loss(model, tokens, block, job.batch_size, device, autocast(device, precision),
                            cap, on_batch=lambda n: progress.advance(task, n))
    causal = model.objective.causal
    # bits per byte: the loss per token over the source's bytes per token (a masked-token loss
    # describes no compression of the text, so it gets none)
    bpb = bits_per_byte(res["loss"], len(tokens), nbytes) if causal else None
    per_position = res.pop("per_position")
    result = {"ckpt": str(ckpt.path), "step": ckpt.state.get("step"), "weights": job.weights, "source": source,
              "objective": ckpt.objective, "tokens_scored": res["tokens"],
              "windows": res["windows"], "loss": res["loss"], "ppl": res["ppl"], "accuracy": res["accuracy"],
              "bpb": bpb, "bytes_per_token": nbytes / max(1, len(tokens)), "device": str(device),
              "precision": precision}
    table = Table(title=f"eval: {ckpt.path}", title_justify="left")
    columns = ("data", "tokens", "loss", "ppl", "accuracy", "bits/byte") if causal else \
        ("data", "masked tokens", "masked loss", "ppl", "masked accuracy")
    for col in columns:
        table.add_column(col, justify="left" if col == "data" else "right")
    row = [source, f"{res['tokens']:,}", f"{res['loss']:.4f}", f"{res['ppl']:.2f}", f"{res['accuracy']:.3f}"]
    table.add_row(*row, *([f"{bpb:.4f}"] if causal else []))
    console.out.print(table)
    atomic_write_text(run_dir / "per_position.json", json.dumps({"source": source, **per_position}))
    what = "loss" if causal else "masked-token loss"
    per_position_plot(per_position, run_dir / "per_position.png", f"{what} by position: {source}, {ckpt.path.name}")
    if tasks:
        result["tasks"] = run_tasks(tasks, model, ckpt.tokenizer(), device, autocast(device, precision))
    out = run_dir / "eval.json"
    atomic_write_text(out, json.dumps(result, indent=2))
    console.out.print(f"results: {out}; loss by position: {run_dir / 'per_position.png'}")
    if job.analysis is not None:
        run_analysis(job, ckpt, model, tokens, device, run_dir)


def run_tasks(tasks: dict, model, tokenizer, device, amp) -> dict:
    """Each task's accuracies, and a table of them."""
    from rich.table import Table

    from llmlab import console
    from llmlab.eval.tasks import score_task

    scored = {name: score_task(model, tokenizer, questions, device, amp) for name, questions in tasks.items()}
    table = Table(title="tasks: accuracy by likelihood (95% interval)", title_justify="left")
    for col in ("task", "questions", "acc", "acc_norm", "chance"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for name, s in scored.items():
        table.add_row(name, f"{s['n']:,}", f"{s['acc']:.3f} [{s['acc_ci95'][0]:.3f}, {s['acc_ci95'][1]:.3f}]",
                      f"{s['acc_norm']:.3f} [{s['acc_norm_ci95'][0]:.3f}, {s['acc_norm_ci95'][1]:.3f}]",
                      f"{s['chance']:.3f}")
    console.out.print(table)
    return scored


def run_analysis(job: EvalConfig, ckpt, model, tokens, device, run_dir: Path) -> None:
    from llmlab import console
    from llmlab.eval.data import eval_tokens

    analysis = ANALYSIS.build(job.analysis)
    if job.text:
        sources = {"text": tokens}
    else:  # both splits of the same data
        sources = {s: tokens if s == job.split else eval_tokens(ckpt, None, s, job.data, job.cache_dir)[0]
                   for s in ("train", "val")}
    attn = ckpt.spec.get("attention", {}).get("kind", "?")
    result = analysis.run(model, sources, ckpt.tokenizer(), job.batch_size, device, run_dir,
                          f"{attn}, {ckpt.path.name}")
    from rich.table import Table
    table = Table(title=f"attention ({attn}): mean over layers and heads", title_justify="left")
    for col in ("split", "windows", "entropy (bits)", "support", "normalised support", "attended share",
                "diversity (EMD)"):
        table.add_column(col, justify="left" if col == "split" else "right")
    for split, s in result["splits"].items():
        m = s["mean"]
        table.add_row(split, str(s["windows"]), f"{m['entropy_bits']:.3f}", f"{m['support']:.2f}",
                      f"{m['normalized_support']:.3f}", f"{m['attended_share']:.3f}", f"{m['diversity_emd']:.2f}")
    console.out.print(table)
    console.out.print(f"analysis: {run_dir / 'attention.json'} and {len(result['figures'])} figures in {run_dir}")


COMMAND = Command("eval", EvalConfig, run, sections={"data": CORPUS, "analysis": ANALYSIS})
SCHEMA = COMMAND.schema
