"""llmlab report: sweep or run directories -> grouped statistics, Markdown, JSON and a PNG."""

import json
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
    from rich.table import Table

    from llmlab import console
    from llmlab.eval import report as R
    from llmlab.eval.plots import curves_plot

    validate(cfg)
    runs = R.find_runs([str(r) for r in cfg["runs"]])
    result = R.build_report(runs, cfg.get("baseline"))
    out = Path(str(cfg["out"])).expanduser() if cfg.get("out") else run_dir
    out.mkdir(parents=True, exist_ok=True)
    figure = None
    curves = R.curves(runs)
    if curves:
        curves_plot(curves, out / "report.png", "training tokens", "validation loss",
                    "validation loss: mean over seeds, band = min..max")
        figure = "report.png"
    (out / "report.md").write_text(R.markdown(result, figure))
    (out / "report.json").write_text(json.dumps(result, indent=2))

    table = Table(title=f"{len(runs)} runs in {len(result['groups'])} groups "
                        f"(val loss: mean ± 95% CI over seeds; matched tokens {result['matched_tokens'] or 'n/a'})",
                  title_justify="left")
    for col in R.COLUMNS:
        table.add_column(col, justify="left" if col == "group" else "right",
                         **({"overflow": "fold", "min_width": 20} if col == "group" else {}))
    for row in R.table_rows(result):
        table.add_row(*row)
    console.out.print(table)
    if result["comparisons"]:
        ct = Table(title=f"paired by seed against {result['baseline']}", title_justify="left")
        for col in R.COMPARE_COLUMNS:
            ct.add_column(col, justify="left" if col == "group" else "right",
                          **({"overflow": "fold", "min_width": 20} if col == "group" else {}))
        for row in R.compare_rows(result):
            ct.add_row(*row)
        console.out.print(ct)
    console.out.print(f"report: {out / 'report.md'}" + (f", {out / 'report.png'}" if figure else ""))
