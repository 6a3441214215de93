"""The hold-out check of each IsoFLOP study under both surface forms.

Each study's report.json (bench/results/NAME/report.json, written by `llmlab report`) holds
its groups: the runs' losses per seed, parameters and FLOPs per token, and its scaling
section, whose per-budget sizes are the non-embedding parameter counts of the group sizes.
From these the design cells are rebuilt (a run's tokens taken as its budget over its FLOPs per
token, which a run's whole steps round down by under one step), and `llmlab.eval.scaling_report.holdout` runs on them
with `surface=chinchilla` (E + A/N^a + B/D^b) and `surface=kaplan` (size and tokens
interact): fitted without the largest budget, each predicts that budget's best loss. The
`auto` rows are the form `surface=auto` picks (a nested hold-out on the smaller budgets) and
that form's figures. The `frontier` rows are the second route beside the surfaces: the best loss
at each smaller budget whose sizes bracket it, fitted by a power law in C with no floor
(`llmlab.eval.scaling.Frontier`), extrapolated to the largest budget.

    python -m bench.holdout_forms                       # the committed studies, a few minutes
    python -m bench.holdout_forms isoflop isoflop-gpu   # some of them

Results: bench/results/holdout_forms.json (per study and variant, each form's prediction,
its 95% interval, the observed best loss, the error, and the fits' values on a bound).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import RESULTS, machine

STUDIES = ("isoflop", "isoflop-5budgets", "isoflop-1e12-3seeds", "isoflop-lr-5e11", "isoflop-lr", "isoflop-lr-1e12",
           "isoflop-2seeds", "isoflop-1e12", "isoflop-gpu", "isoflop-gpu-b8", "isoflop-gpu-deep")
SIZE = re.compile(r"(?:^| )model\.d_model=(\d+)(?: |$)")
BUDGET = re.compile(r"(?:^| )train\.max_flops=(\S+)(?: |$)")


def cells(report: dict) -> dict[str, list]:
    """The study's design cells per variant, from its report.json."""
    from llmlab.eval import scaling as sc
    from llmlab.names import parse_flops

    section = report["scaling"]
    out = {}
    for label, v in section["variants"].items():
        words = set(label.split())
        mine = [g for g in report["groups"] if words <= set(g["group"].split())]
        by_budget: dict[float, list] = {}
        for g in mine:
            budget = parse_flops(BUDGET.search(g["group"]).group(1), "train.max_flops")
            by_budget.setdefault(budget, []).append(g)
        built = []
        for b in v["per_budget"]:
            groups = sorted(by_budget.get(b["budget"], []), key=lambda g: int(SIZE.search(g["group"]).group(1)))
            if len(groups) != len(b["sizes"]):
                sys.exit(f"bench.holdout_forms: {label} at {b['budget']:g}: {len(groups)} groups, "
                         f"{len(b['sizes'])} sizes in the scaling section")
            for g, n in zip(groups, b["sizes"]):  # both in order of size
                fpt, losses = float(g["flops_per_token"]), tuple(float(x) for x in g["val_loss_values"])
                if not (math.isfinite(fpt) and fpt > 0) or not losses or not all(map(math.isfinite, losses)):
                    raise ValueError(f"group {g['group']!r}: flops_per_token {g['flops_per_token']!r} and "
                                     f"val_loss_values {g['val_loss_values']!r}: want a positive number and finite losses")
                built.append(sc.Cell(float(n), b["budget"] / fpt, b["budget"], fpt, b["budget"], losses))
        out[label] = built
    return out


def main() -> None:
    from llmlab.errors import ConfigError
    from llmlab.eval import scaling as sc
    from llmlab.eval import scaling_report as sr

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("studies", nargs="*", default=list(STUDIES), help="names under bench/results/")
    args = ap.parse_args()
    start = time.perf_counter()
    rows = []
    for study in args.studies:
        path = RESULTS / study / "report.json"
        try:
            built_all = cells(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, ConfigError) as e:  # a missing or hand-edited file
            sys.exit(f"bench.holdout_forms: {path}: not a report with a scaling section ({type(e).__name__}: {e})")
        for label, built in built_all.items():
            budgets = sorted({c.budget for c in built})
            row = {"study": study, "variant": label, "budget": budgets[-1], "runs": sum(len(c.losses) for c in built)}
            for form in sc.FORMS:
                h = sr.holdout(label, built, budgets, sc.BOOTSTRAPS, form)
                row[form] = {k: h[k] for k in ("predicted", "interval", "observed", "error", "within_interval")}
                row[form]["at_bounds"] = h["surface"]["at_bounds"]
                row[form]["surface"] = {k: h["surface"][k] for k in ("e", "a", "alpha", "b", "beta", "rmse")}
                print(f"{study:18s} {label[-22:]:>22s} {form:10s} predicted {h['predicted']:.4f} "
                      f"[{h['interval'][0]:.4f}, {h['interval'][1]:.4f}] observed {h['observed']:.4f} "
                      f"{h['error']:+.2%}{'' if h['within_interval'] else ' outside'}"
                      + (f"; on a bound: {', '.join(row[form]['at_bounds'])}" if row[form]["at_bounds"] else ""),
                      flush=True)
            f = sr.frontier_holdout(built, budgets, sc.BOOTSTRAPS)  # the second route: no surface, no floor
            row["frontier"] = f if f is None or "why" in f else {
                **{k: f[k] for k in ("predicted", "interval", "observed", "error", "within_interval", "gamma")},
                "at_bounds": []}
            print(f"{study:18s} {label[-22:]:>22s} frontier   "
                  + (f"n/a ({f['why'] if f else 'fewer than 3 budgets'})" if f is None or "why" in f else
                     f"predicted {f['predicted']:.4f} [{f['interval'][0]:.4f}, {f['interval'][1]:.4f}] observed "
                     f"{f['observed']:.4f} {f['error']:+.2%}{'' if f['within_interval'] else ' outside'}"), flush=True)
            chosen = sr.choose_form(built, budgets)  # surface=auto: chosen without the largest budget
            row["auto"] = {**row[chosen["form"]], "form": chosen["form"], "nested_errors": chosen.get("errors")}
            print(f"{study:18s} {label[-22:]:>22s} auto       chose {chosen['form']}"
                  + (" (nested: " + ", ".join(f"{f} {e:+.2%}" for f, e in chosen["errors"].items()) + ")"
                     if "errors" in chosen else f" ({chosen['why']})"), flush=True)
            rows.append(row)
    summary = {}
    for form in (*sc.FORMS, "auto", "frontier"):
        have = [r for r in rows if r.get(form) and "why" not in r[form]]
        summary[form] = {"mean_abs_error": float(np.mean([abs(r[form]["error"]) for r in have])) if have else None,
                         "mean_error": float(np.mean([r[form]["error"] for r in have])) if have else None,
                         "within_interval": sum(r[form]["within_interval"] for r in have),
                         "within_1pct": sum(abs(r[form]["error"]) <= 0.01 for r in have),
                         "on_a_bound": sum(bool(r[form]["at_bounds"]) for r in have), "cases": len(have),
                         "without": len(rows) - len(have)}
    for form, s in summary.items():
        if not s["cases"]:
            print(f"{form}: no case")
            continue
        print(f"{form}: mean |error| {s['mean_abs_error']:.2%} (mean {s['mean_error']:+.2%}); within the interval "
              f"{s['within_interval']} of {s['cases']}, within 1% {s['within_1pct']}, a value on a bound {s['on_a_bound']}"
              + (f"; {s['without']} without one" if s["without"] else ""))
    out = RESULTS / "holdout_forms.json"
    out.write_text(json.dumps({"benchmark": "holdout_forms", "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "machine": machine(), "command": "python -m bench.holdout_forms " + " ".join(args.studies),
                               "wall_s": round(time.perf_counter() - start, 1), "summary": summary, "rows": rows},
                              indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
