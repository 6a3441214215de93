"""The search behind the default recipe: a small sweep at one compute budget, run through
llmlab's own sweep and report (``select=best_lr``), beside ``xz -9`` on the validation split.

    python -m bench.default_search                               # the recorded search
    python -m bench.default_search --budget 2e13 --axes model.d_model=192,256 optim.lr=3e-3,6e-3
    python -m bench.default_search --name default_search_width --budget 1.76e13 \
        --axes model.d_model=96,112,128,144,160,176,192 --overrides sched.warmup=50   # its own file

Every job trains for the same FLOPs (``train.max_flops``), so the ranking does not depend on
how busy the machine was; the wall times it records do, and carry the machine's other load.
Results: bench/results/default_search.json (or --name's); the sweep's report.md is printed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import child_env, write_result
from bench.train_default import xz_bits_per_byte

AXES = ["model.d_model=192,256", "optim.lr=3e-3,6e-3"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", default="2e13", help="training FLOPs per job (train.max_flops)")
    ap.add_argument("--axes", nargs="*", default=AXES, help="sweep axes, Hydra syntax")
    ap.add_argument("--overrides", nargs="*", default=[], help="fixed settings for every job")
    ap.add_argument("--name", default="default_search", help="the result's name: bench/results/NAME.json")
    args = ap.parse_args()
    fixed = ["logger=none", "train.ckpt_every=0", "train.sample_tokens=0", f"train.max_flops={args.budget}",
             *args.overrides]
    with tempfile.TemporaryDirectory(prefix="llmlab-bench-search-") as tmp:
        env = child_env(LLMLAB_CACHE=str(Path(tmp) / "cache"), TERM="dumb")
        t = time.perf_counter()
        sweep = subprocess.run([sys.executable, "-m", "llmlab", "train", "-m", *args.axes, *fixed,
                                "hydra.sweep.dir=sweep"], cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t
        if sweep.returncode:
            raise SystemExit(f"the sweep failed:\n{sweep.stderr[-3000:]}")
        jobs = []
        for summary in sorted((Path(tmp) / "sweep").glob("*/summary.json")):
            s = json.loads(summary.read_text())
            jobs.append({"job": summary.parent.name, "val_loss": s["val_loss"], "val_bpb": s["val_bpb"],
                         "steps": s["steps"], "tokens": s["tokens"], "params": s["params"],
                         "flops_per_token": s["flops_per_token"], "wall_s": s["wall_s"],
                         "tokens_per_s": s["tokens_per_s"], "tokens_per_s_other_load": s.get("tokens_per_s_other_load")})
        # each cell's best learning rate where the sweep has a learning-rate axis; else every run
        select = ["select=best_lr"] if any(a.startswith("optim.lr=") for a in args.axes) else []
        report_words = ["report", "sweep", *select, "out=report", "hydra.run.dir=report"]
        report_run = subprocess.run([sys.executable, "-m", "llmlab", *report_words], cwd=tmp, env=env,
                                    capture_output=True, text=True)
        if report_run.returncode:  # the runs are still written down below
            print(f"llmlab {' '.join(report_words)} failed:\n{report_run.stderr[-3000:]}", file=sys.stderr)
            report = {}
        else:
            report = json.loads((Path(tmp) / "report" / "report.json").read_text())
            print((Path(tmp) / "report" / "report.md").read_text())
    xz = xz_bits_per_byte({"kind": "pysource"})
    best = min(jobs, key=lambda j: j["val_loss"])
    result = {"command": "llmlab train -m " + " ".join([*args.axes, *fixed]), "report": "llmlab " + " ".join(report_words[:-2]),
              "budget_flops": float(args.budget), "sweep_wall_s": round(wall, 1), "jobs": jobs,
              "lr_choices": report.get("lr_choices"), "best": best, **xz,
              "note": "val_bpb: the periodic evaluation's windows (train.eval_windows), not the whole split"}
    print(f"best: {best['job']}: val bpb {best['val_bpb']:.3f} (xz -9: {xz['xz9_bpb']:.3f})")
    write_result(args.name, result)


if __name__ == "__main__":
    main()
