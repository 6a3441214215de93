"""llmlab export: checkpoint -> a Hugging Face `transformers` directory."""

import os
from dataclasses import dataclass
from pathlib import Path

from llmlab.commands import Command
from llmlab.errors import ConfigError
from llmlab.registry import Checked, choice


@dataclass
class ExportConfig(Checked):
    """``llmlab export``'s settings."""

    ckpt: str | None = None  # a checkpoint directory, a run directory (its latest checkpoint), or a transformers directory (llama, qwen3, gpt2)
    format: str = "hf"  # hf: a Hugging Face transformers directory
    out: str | None = None  # the directory to write; null: <this command's run dir>/hf
    overwrite: bool = False  # replace a non-empty out directory
    weights: str = choice("raw", ("raw", "ema"))  # ema: the moving average a run trained with train.ema kept

    def check(self, prefix: str) -> None:
        from llmlab.export import FORMATS
        if self.format not in FORMATS:
            raise ConfigError(f"format: unknown '{self.format}'; allowed: {', '.join(FORMATS)}")


def run(job: ExportConfig, run_dir: Path) -> None:
    from llmlab.files import checkpoint_arg

    checkpoint_arg(job.ckpt)  # a mistyped path is one line before torch loads
    import torch

    from llmlab import console
    from llmlab.export import exporter
    from llmlab.train.checkpoint import build_model, load_checkpoint

    ckpt = load_checkpoint(job.ckpt)
    model = build_model(ckpt, torch.device("cpu"), job.weights)
    out = Path(os.path.expanduser(job.out)) if job.out else run_dir / "hf"
    res = exporter(job.format)(ckpt, model, out, overwrite=job.overwrite)
    console.out.print(f"exported {ckpt.path} as {res['architecture']} ({res['family']} family, "
                      f"{res['params']:,} parameters) to {res['out']}")
    for note in res["notes"]:
        console.out.print(f"note: {note}", style="yellow")
    console.out.print(f"load it with transformers.AutoModelForCausalLM.from_pretrained({str(res['out'])!r})",
                      style="dim")


COMMAND = Command("export", ExportConfig, run)
SCHEMA = COMMAND.schema
