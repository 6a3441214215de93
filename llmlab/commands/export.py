"""llmlab export: checkpoint -> a Hugging Face `transformers` directory."""

from pathlib import Path

from llmlab.errors import ConfigError

KEYS = ("ckpt", "format", "out", "overwrite")


def validate(cfg: dict) -> None:
    from llmlab.export import FORMATS

    for key in cfg:
        if key not in KEYS:
            raise ConfigError(f"{key}: unknown key; allowed: {', '.join(KEYS)}")
    if cfg.get("format") not in FORMATS:
        raise ConfigError(f"format: unknown '{cfg.get('format')}'; allowed: {', '.join(FORMATS)}")
    if not isinstance(cfg.get("overwrite"), bool):
        raise ConfigError(f"overwrite: expected true or false, got {cfg.get('overwrite')!r}")


def run(cfg: dict, run_dir: Path) -> None:
    import torch

    from llmlab import console
    from llmlab.export import FORMATS
    from llmlab.train.checkpoint import build_model, load_checkpoint

    validate(cfg)
    ckpt = load_checkpoint(cfg["ckpt"])
    model = build_model(ckpt, torch.device("cpu"))
    out = Path(str(cfg["out"])).expanduser() if cfg.get("out") else run_dir / "hf"
    res = FORMATS[cfg["format"]](ckpt, model, out, overwrite=bool(cfg["overwrite"]))
    console.out.print(f"exported {ckpt.path} as {res['architecture']} ({res['family']} family, "
                      f"{res['params']:,} parameters) to {res['out']}")
    for note in res["notes"]:
        console.out.print(f"note: {note}", style="yellow")
    console.out.print(f"load it with transformers.AutoModelForCausalLM.from_pretrained({str(res['out'])!r})",
                      style="dim")
