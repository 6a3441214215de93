"""An IsoFLOP study whose fitted budgets are cooldown branches, and a held-out budget it never
saw: what `llmlab report`'s hold-out section and `bench.holdout_forms` judge a study by.

Each variant at each size and seed is one run at the largest fitted budget whose
``sched.branch_flops`` are the smaller ones (`llmlab.train.branches`): every size is trained
once across the budgets it appears in. The held-out budget (``--holdout``, at least 4x the
largest fitted one) is run on its own at sizes around its optimum, with more seeds. Every run
is bench.isoflop's (muP, the same fixed settings and variants) with ``sched=wsd``, one warm-up
in steps (``--warmup``: a branch keeps its long run's) and fp32.

    python -m bench.branch_study --jobs 2      # about an hour on 2 CPU cores
    python -m bench.branch_study --jobs 2 --work /tmp/study   # resumable: finished runs are kept

Results: bench/results/NAME.json (each run's CPU and wall seconds, the study's design, the
report's scaling section) and bench/results/NAME/ (report.md, report.json, scaling.png); NAME is
``--name``, branch-study by default. `python -m bench.holdout_forms` includes it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import RESULTS, child_env, cpu_timed, write_result
from bench.isoflop import FIXED, VARIANTS


def numbers(text: str, kind=float) -> list:
    return [kind(x) for x in text.split(",") if x]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="mha,mla", help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--compare", default="", help="variants whose runs an earlier study left in --work (the same "
                    "design): they join the report without running again")
    ap.add_argument("--sizes", default="8,16,24,32,48", help="model.d_model values at every fitted budget")
    ap.add_argument("--budgets", default="2.5e10,5e10,1e11,2.5e11", help="the fitted budgets (train.max_flops)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--holdout", type=float, default=1e12, help="the held-out budget")
    ap.add_argument("--holdout-sizes", default="24,32,48")
    ap.add_argument("--holdout-seeds", default="0,1,2,3,4")
    ap.add_argument("--warmup", type=int, default=5, help="sched.warmup of every run, in steps")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (each with one thread when more than one)")
    ap.add_argument("--name", default="branch-study")
    ap.add_argument("--work", type=Path, help="run here (default: a temporary folder); finished runs are kept")
    args = ap.parse_args()
    budgets = sorted(numbers(args.budgets))
    *smaller, top = budgets
    if args.holdout < 4 * top:
        sys.exit(f"bench.branch_study: --holdout {args.holdout:g} is less than 4x the largest fitted budget {top:g}")
    env = child_env(**({"OMP_NUM_THREADS": "1"} if args.jobs > 1 else {}))
    work = args.work or Path(tempfile.mkdtemp(prefix="llmlab-branch-study-"))
    work.mkdir(parents=True, exist_ok=True)
    common = [*FIXED, "sched=wsd", f"sched.warmup={args.warmup}", "precision=fp32"]
    runs = []  # (name, words), the longest first
    for variant in args.variants.split(","):
        for n in numbers(args.holdout_sizes, int):
            for seed in numbers(args.holdout_seeds, int):
                runs.append((f"{variant}/held-d{n}-s{seed}", [*VARIANTS[variant], f"model.d_model={n}", f"seed={seed}",
                                                               f"train.max_flops={args.holdout:g}"]))
    for variant in args.variants.split(","):
        for n in numbers(args.sizes, int):
            for seed in numbers(args.seeds, int):
                runs.append((f"{variant}/d{n}-s{seed}", [*VARIANTS[variant], f"model.d_model={n}", f"seed={seed}",
                                                          f"train.max_flops={top:g}",
                                                          f"sched.branch_flops=[{','.join(f'{b:g}' for b in smaller)}]"]))
    cpu_timed("branch_study", ["tokenize", *[w for w in FIXED if w.startswith("tokenizer")]], work, env)  # the data once
    t0 = time.perf_counter()

    def one(item):
        name, words = item
        cost = cpu_timed("branch_study", ["train", *common, *words, f"hydra.run.dir={work / 'runs' / name}"], work, env)
        print(f"{name}: {cost['cpu_s']:.0f} s CPU, {cost['wall_s']:.0f} s", flush=True)
        return name, cost

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        costs = dict(pool.map(one, runs))
    wall = time.perf_counter() - t0
    out = work / f"report-{args.name}"
    reported = [*args.variants.split(","), *filter(None, args.compare.split(","))]
    cpu_timed("branch_study", ["report", *(str(work / "runs" / v) for v in reported), f"out={out}", "surface=auto"],
              work, env)
    report = json.loads((out / "report.json").read_text())
    keep = RESULTS / args.name
    keep.mkdir(parents=True, exist_ok=True)
    for name in ("report.md", "report.json", "scaling.png"):
        if (out / name).is_file():
            shutil.copyfile(out / name, keep / name)
    fitted_cpu = sum(c["cpu_s"] for name, c in costs.items() if "/held-" not in name)
    held_cpu = sum(c["cpu_s"] for name, c in costs.items() if "/held-" in name)
    write_result(args.name, {
        "command": "python -m bench.branch_study " + " ".join(sys.argv[1:]),
        "design": {"variants": args.variants.split(","), "compared_with": list(filter(None, args.compare.split(","))),
                   "sizes": numbers(args.sizes, int), "budgets": budgets,
                   "seeds": numbers(args.seeds, int), "holdout": args.holdout,
                   "holdout_sizes": numbers(args.holdout_sizes, int), "holdout_seeds": numbers(args.holdout_seeds, int),
                   "warmup": args.warmup, "fixed": common},
        "runs": len(runs),
        "fitted_cpu_s": round(fitted_cpu, 1), "holdout_cpu_s": round(held_cpu, 1), "wall_s": round(wall, 1),
        "costs": costs, "holdout": report.get("scaling", {}).get("holdout"),
        "decisions": report.get("scaling", {}).get("decisions")})


if __name__ == "__main__":
    main()
