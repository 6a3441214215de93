"""llmlab report: sweep or run directories -> grouped statistics, Markdown, JSON and a PNG."""

from pathlib import Path

from llmlab.errors import ConfigError

KEYS = ("runs", "baseline", "out")


def validate(cfg: dict) -> None:
    for key in cfg:
        if key not in KEYS:
            raise ConfigError(f"{key}: unknown key; allowed: {', '.join(KEYS)}")
    runs = cfg.get("runs")
    if not isinstance(runs, list) or not runs:
        raise ConfigError("runs: give at least one sweep or run directory (llmlab report DIR ...)")


def run(cfg: dict, run_dir: Path) -> None:
    from llmlab.eval.report import write_report

    validate(cfg)
    out = Path(str(cfg["out"])).expanduser() if cfg.get("out") else run_dir
    write_report([str(r) for r in cfg["runs"]], cfg.get("baseline"), out)
