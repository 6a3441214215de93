"""llmlab report: sweep or run directories -> grouped statistics, Markdown, JSON and a PNG."""

import json
from pathlib import Path

from llmlab.errors import ConfigError

KEYS = ("runs", "baseline", "out")
WIDE = 240


def validate(cfg: dict) -> None:
    for key in cfg:
        if key not in KEYS:
            raise ConfigError(f"{key}: unknown key; allowed: {', '.join(KEYS)}")
    runs = cfg.get("runs")
    if not isinstance(runs, list) or not runs:
        raise ConfigError("runs: give at least one sweep or run directory (llmlab report DIR ...)")


def run(cfg: dict, run_dir: Path) -> None:
    validate(cfg)
    out = Path(str(cfg["out"])).expanduser() if cfg.get("out") else run_dir
    write_report([str(r) for r in cfg["runs"]], cfg.get("baseline"), out)


def write_report(dirs: list[str | Path], baseline, out: Path, unfinished: dict[Path, str] | None = None) -> dict:
    """Find the finished runs under ``dirs``, write report.md, report.json and report.png to
    ``out``, print the tables; return the report. ``llmlab report`` and the end of a train
    sweep both come here; a sweep passes its jobs that did not finish (directory -> why),
    which the files list after the tables."""
    from rich.console import Console
    from rich.table import Table

    from llmlab import console
    from llmlab.eval import report as R
    from llmlab.eval.plots import curves_plot

    runs = R.find_runs(dirs)
    others = [R.read_overrides(path) for path in unfinished or {}]
    result = R.build_report(runs, baseline, others)
    if unfinished:
        result["unfinished"] = {path.name: why for path, why in unfinished.items()}
    out.mkdir(parents=True, exist_ok=True)
    figure = None
    curves = R.curves(runs, others)
    if curves:
        curves_plot(curves, out / "report.png", "training tokens", "validation loss",
                    "validation loss: mean over seeds, band = min..max")
        figure = "report.png"
    (out / "report.md").write_text(R.markdown(result, figure))
    (out / "report.json").write_text(json.dumps(result, indent=2))

    matched = "n/a" if result["matched_tokens"] is None else f"{result['matched_tokens']:,.0f}"
    # a terminal folds the tables to fit; a log file gets them whole (rich would assume 80 columns)
    show = console.out if console.out.is_terminal else Console(width=WIDE, highlight=False, markup=False,
                                                               quiet=console.out.quiet)
    table = Table(title=f"{R.plural(len(runs), 'run')} in {R.plural(len(result['groups']), 'group')} "
                        f"(val loss: mean ± 95% CI over seeds; matched tokens {matched})",
                  title_justify="left")
    for col in R.COLUMNS:
        table.add_column(col, justify="left" if col == "group" else "right", overflow="fold",
                         **({"min_width": 20} if col == "group" else {}))
    for row in R.table_rows(result):
        table.add_row(*row)
    show.print(table)
    if result["comparisons"]:
        ct = Table(title=f"paired by seed against {result['baseline']}", title_justify="left")
        for col in R.COMPARE_COLUMNS:
            ct.add_column(col, justify="left" if col == "group" else "right", overflow="fold",
                          **({"min_width": 20} if col == "group" else {}))
        for row in R.compare_rows(result):
            ct.add_row(*row)
        show.print(ct)
    console.out.print(f"report: {out / 'report.md'}" + (f", {out / 'report.png'}" if figure else ""))
    return result
