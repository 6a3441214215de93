"""The hold-out check of each IsoFLOP study under both surface forms.

Each study's report.json (bench/results/NAME/report.json, written by `llmlab report`) holds
its groups: the runs' losses per seed, parameters and FLOPs per token, and its scaling
section, whose per-budget sizes are the non-embedding parameter counts of the group sizes.
From these the design cells are rebuilt (a run's tokens taken as its budget over its FLOPs per
token, which a run's whole steps round down by under one step), and `llmlab.study.holdout.holdout` runs on them
with `surface=chinchilla` (E + A/N^a + B/D^b) and `surface=kaplan` (size and tokens
interact): fitted without the largest budget, each predicts that budget's best loss. The
`auto` rows are the form `surface=auto` picks (a nested hold-out on the smaller budgets) and
that form's figures. The `frontier` rows are the second route beside the surfaces: the best loss
at each smaller budget whose sizes bracket it, fitted by a power law in C with no floor
(`llmlab.study.frontier.Frontier`), extrapolated to the largest budget.

    python -m bench.holdout_forms                       # the committed studies, a few minutes
    python -m bench.holdout_forms isoflop isoflop-gpu   # some of them

The frontier's route (``frontier``, the report's default) is the fitted line moved by the
ladder's drift (`llmlab.study.calibration.Drift`): measured on the other families' studies
only (`family`), so that no study helps predict itself, and its spread added to the seed
interval. ``frontier_lobo`` is the line with its seed interval widened by its own
leave-one-budget-out error instead, ``frontier_seed`` the seed interval alone, for comparison.
``summary.drift`` is the drift over every study, the figure the report uses
(`llmlab.study.calibration.LAB_DRIFT`). The pooled ``summary`` says, per route, what a study can stand
behind: ``coverage`` (the share of held-out observations inside their 95% interval),
``halfwidth`` (the median relative half-width of those intervals), ``sign_p`` (a two-sided sign
test of the errors: a small value is a fit biased to one side), ``order_cases`` (pairs of
variants, within a study, whose predicted order at the held-out budget is decided: the gap's
interval excludes 0) and ``order_agrees`` (of those, the observed order is the predicted one),
``nstar_cases`` and ``nstar_agrees`` (the predicted compute-optimal size within one grid step of
the size observed best), and ``default``: the route the report uses unless told otherwise.

Results: bench/results/holdout_forms.json (per study and variant, each form's prediction,
its 95% interval, the observed best loss, the error, and the fits' values on a bound).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import sys
import time

import numpy as np

from bench.common import RESULTS, machine
from llmlab.study import calibration as cal
from llmlab.files import atomic_write_text

STUDIES = ("isoflop", "isoflop-5budgets", "isoflop-1e12-3seeds", "isoflop-lr-5e11", "isoflop-lr", "isoflop-lr-1e12",
           "isoflop-2seeds", "isoflop-1e12", "isoflop-gpu", "isoflop-gpu-b8", "isoflop-gpu-deep", "branch-study", "branch-study-gqa", "branch-study-norm-pos")
SIZE = re.compile(r"(?:^| )model\.d_model=(\d+)(?: |$)")
BUDGET = re.compile(r"(?:^| )train\.max_flops=(\S+)(?: |$)")


def cells(report: dict, size: str = "params") -> dict[str, list]:
    """The study's design cells per variant, from its report.json; N as ``size`` measures it
    (``flops``: the group's FLOPs per token / 6, `llmlab report scaling.size=flops`)."""
    from llmlab.names import parse_flops
    from llmlab.study.surface import Cell

    section = report["scaling"]
    out = {}
    plain = ("all runs", "defaults")  # a variant that sets none of what sets the others apart
    theirs = {w for label in section["variants"] if label not in plain for w in label.split()}
    for label, v in section["variants"].items():
        words = set(label.split())
        mine = [g for g in report["groups"] if (not set(g["group"].split()) & theirs if label in plain
                                                 else words <= set(g["group"].split()))]
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
                n = float(n) if size == "params" else fpt / 6
                built.append(Cell(n, b["budget"] / fpt, b["budget"], fpt, b["budget"], losses))
        out[label] = built
    return out


DEFAULT_ROUTE = "frontier"  # the route the report's hold-out and decisions lead with


def family(study: str) -> str:
    """Studies that share runs, a design or a machine form a family: the CPU IsoFLOP studies,
    their learning-rate reruns, the GPU studies, the branch studies. The drift a study is scored
    with is measured on the other families only, so that no study helps predict itself."""
    return ("branch" if study.startswith("branch-study") else "gpu" if "-gpu" in study
            else "lr" if study.startswith("isoflop-lr") else "isoflop")


def ladder(rows: list[dict], leave_out: str | None = None) -> "cal.Drift":
    """The drift (`calibration.Drift`) of the line's held-out errors over ``rows`` (each
    variant's runs counted once), without the family ``leave_out``."""
    have = [r for r in rows if r.get("frontier_lobo") and "why" not in r["frontier_lobo"] and not r.get("same_runs_as")
            and family(r["study"]) != leave_out]
    cases = [(math.log(r["frontier_lobo"]["observed"] / r["frontier_lobo"]["predicted"]), r["frontier_lobo"]["distance"])
             for r in have]
    span = (min(r["frontier_lobo"]["fitted_from"] for r in have), max(r["budget"] for r in have))
    return cal.drift_of(cases, span)


def pooled(rows: list[dict], form: str) -> dict:
    """A route's figures over every study and variant (see the module's docstring)."""
    from scipy.stats import binomtest

    usable = [r for r in rows if r.get(form) and "why" not in r[form] and r[form].get("interval")]
    have = [r for r in usable if not r.get("same_runs_as")]  # a variant's runs count once in the pooled figures
    errors = [r[form]["error"] for r in have]
    above = sum(e > 0 for e in errors)
    half = [(r[form]["interval"][1] - r[form]["interval"][0]) / 2 / r[form]["predicted"] for r in have]
    orders = []
    for study in dict.fromkeys(r["study"] for r in usable):  # every pair of a study is its own decision
        mine = [r for r in usable if r["study"] == study]
        for a, b in itertools.combinations(mine, 2):
            seed = {"seed_interval": None}
            o = cal.order({**seed, **a[form], "seed_interval": a[form].get("seed_interval") or a[form]["interval"]},
                          {**seed, **b[form], "seed_interval": b[form].get("seed_interval") or b[form]["interval"]})
            if o is not None:
                orders.append(o)
    steps = [r[form]["size_steps"] for r in have if r[form].get("size_steps") is not None]
    return {"cases": len(have), "without": len(rows) - len(usable), "repeated": len(usable) - len(have),
            "within_interval": sum(r[form]["within_interval"] for r in have),
            "coverage": sum(r[form]["within_interval"] for r in have) / len(have) if have else None,
            "halfwidth": float(np.median(half)) if half else None,
            "sign_p": float(binomtest(above, len(errors)).pvalue) if errors else None, "above": above,
            "mean_error": float(np.mean(errors)) if errors else None,
            "mean_abs_error": float(np.mean(np.abs(errors))) if errors else None,
            "within_1pct": sum(abs(e) <= 0.01 for e in errors),
            "on_a_bound": sum(bool(r[form].get("at_bounds")) for r in have),
            "order_pairs": len(orders), "order_cases": sum(o["decided"] for o in orders),
            "order_agrees": sum(o["decided"] and o["agrees"] for o in orders),
            "order_agrees_undecided": sum(not o["decided"] and o["agrees"] for o in orders),
            "nstar_cases": len(steps), "nstar_agrees": sum(s <= 1 for s in steps)}


def main() -> None:
    from llmlab.errors import ConfigError
    from llmlab.study import holdout as ho
    from llmlab.study import surface as su

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("studies", nargs="*", default=list(STUDIES), help="names under bench/results/")
    args = ap.parse_args()
    start = time.perf_counter()
    rows = []
    for study in args.studies:
        path = RESULTS / study / "report.json"
        try:
            report = json.loads(path.read_text())
            built_all, by_flops = cells(report), cells(report, "flops")
        except (OSError, ValueError, KeyError, TypeError, AttributeError, ConfigError) as e:  # a missing or hand-edited file
            sys.exit(f"bench.holdout_forms: {path}: not a report with a scaling section ({type(e).__name__}: {e})")
        for label, built in built_all.items():
            budgets = sorted({c.budget for c in built})
            row = {"study": study, "variant": label, "budget": budgets[-1], "runs": sum(len(c.losses) for c in built)}
            for form, size in [(f, "params") for f in su.FORMS] + [(f, "flops") for f in su.FORMS]:
                route = form if size == "params" else f"{form}_flops"  # N = FLOPs per token / 6
                h = ho.holdout(label, built if size == "params" else by_flops[label], budgets, su.BOOTSTRAPS, form)
                row[route] = {k: h[k] for k in ("predicted", "interval", "observed", "error", "within_interval",
                                               "predicted_size", "observed_size", "size_steps")}
                row[route]["at_bounds"] = h["surface"]["at_bounds"]
                row[route]["surface"] = {k: h["surface"][k] for k in ("e", "a", "alpha", "b", "beta", "rmse")}
                print(f"{study:18s} {label[-22:]:>22s} {route:17s} predicted {h['predicted']:.4f} "
                      f"[{h['interval'][0]:.4f}, {h['interval'][1]:.4f}] observed {h['observed']:.4f} "
                      f"{h['error']:+.2%}{'' if h['within_interval'] else ' outside'}"
                      + (f"; on a bound: {', '.join(row[route]['at_bounds'])}" if row[route]["at_bounds"] else ""),
                      flush=True)
            f = ho.frontier_holdout(built, budgets, su.BOOTSTRAPS)  # the second route: no surface, no floor
            row["frontier_lobo"] = f if f is None or "why" in f else {
                **{k: f[k] for k in ("predicted", "interval", "seed_interval", "misspecification", "lobo_rms", "reach",
                                     "observed", "error", "within_interval", "gamma", "distance")},
                "lobo": {f"{b:.6g}": e for b, e in f["lobo"].items()}, "at_bounds": [], "fitted_from": f["fitted_on"][0]}
            if f is not None and "why" not in f:
                lo, hi = f["seed_interval"]
                row["frontier_seed"] = {**row["frontier_lobo"], "interval": f["seed_interval"],
                                        "within_interval": lo <= f["observed"] <= hi}

            print(f"{study:18s} {label[-22:]:>22s} line       "
                  + (f"n/a ({f['why'] if f else 'fewer than 3 budgets'})" if f is None or "why" in f else
                     f"predicted {f['predicted']:.4f} [{f['interval'][0]:.4f}, {f['interval'][1]:.4f}] observed "
                     f"{f['observed']:.4f} {f['error']:+.2%}{'' if f['within_interval'] else ' outside'}"), flush=True)
            chosen = ho.choose_form(built, budgets)  # surface=auto: chosen without the largest budget
            row["auto"] = {**row[chosen["form"]], "form": chosen["form"], "nested_errors": chosen.get("errors")}
            print(f"{study:18s} {label[-22:]:>22s} auto       chose {chosen['form']}"
                  + (" (nested: " + ", ".join(f"{f} {e:+.2%}" for f, e in chosen["errors"].items()) + ")"
                     if "errors" in chosen else f" ({chosen['why']})"), flush=True)
            twin = next((r for r in rows if r["variant"] == label and r["budget"] == row["budget"]
                         and r["runs"] == row["runs"] and r.get("frontier_lobo") == row.get("frontier_lobo")
                         and r["chinchilla"]["observed"] == row["chinchilla"]["observed"]), None)
            if twin is not None:  # the same runs, reported again beside another variant (bench.branch_study --compare)
                row["same_runs_as"] = twin["study"]
            rows.append(row)
    lab = ladder(rows)
    for row in rows:  # the drift route: the line moved by the drift of the other families' studies
        f = row.get("frontier_lobo")
        if f is None or "why" in f:
            row["frontier"] = f
            continue
        drift = ladder(rows, leave_out=family(row["study"]))
        predicted, interval, seed = cal.drifted(f["predicted"], f["seed_interval"], drift, f["distance"])
        row["frontier"] = {**f, "predicted": predicted, "interval": interval, "line": f["predicted"], "seed_interval": seed,
                           "error": f["observed"] / predicted - 1,
                           "within_interval": interval[0] <= f["observed"] <= interval[1],
                           "drift": {**drift.as_dict(), "left_out": family(row["study"])}}
        print(f"{row['study']:18s} {row['variant'][-22:]:>22s} frontier   predicted {predicted:.4f} "
              f"[{interval[0]:.4f}, {interval[1]:.4f}] observed {f['observed']:.4f} {row['frontier']['error']:+.2%}"
              f"{'' if row['frontier']['within_interval'] else ' outside'} (drift {drift.rate:+.4f} per ln C, "
              f"{family(row['study'])} left out)", flush=True)
    for row in rows:  # the frontier says nothing of sizes: its route's compute-optimal size is the chosen surface's
        for route in ("frontier", "frontier_lobo", "frontier_seed"):
            if row.get(route) and "why" not in row[route]:
                row[route].update({k: row["auto"][k] for k in ("predicted_size", "observed_size", "size_steps")})
    summary = {form: pooled(rows, form) for form in (*su.FORMS, *(f"{f}_flops" for f in su.FORMS), "auto", "frontier",
                                                       "frontier_lobo", "frontier_seed")}
    summary["default"] = DEFAULT_ROUTE
    summary["drift"] = lab.as_dict()
    print(f"the ladder's drift over every study: {lab.rate:+.5f} per ln C (sd {lab.sd:.5f}, {lab.studies} variant-studies, "
          f"{lab.budgets[0]:.3g} to {lab.budgets[1]:.3g} FLOPs); llmlab.study.calibration.LAB_DRIFT should say the same")
    for form, s in summary.items():
        if form in ("default", "drift"):
            continue
        if not s["cases"]:
            print(f"{form}: no case")
            continue
        print(f"{form}: coverage {s['coverage']:.2f} ({s['within_interval']} of {s['cases']}), median half-width "
              f"{s['halfwidth']:.2%}, sign test p {s['sign_p']:.3f} (mean error {s['mean_error']:+.2%}); orders decided "
              f"{s['order_cases']}, right {s['order_agrees']}; N* within a grid step {s['nstar_agrees']} of "
              f"{s['nstar_cases']}" + (f"; {s['without']} without one" if s["without"] else ""))
    print(f"default route: {DEFAULT_ROUTE}")
    out = RESULTS / "holdout_forms.json"
    atomic_write_text(out, json.dumps({"benchmark": "holdout_forms", "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "machine": machine(), "command": "python -m bench.holdout_forms " + " ".join(args.studies),
                               "wall_s": round(time.perf_counter() - start, 1), "summary": summary, "rows": rows},
                              indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
