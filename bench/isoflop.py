"""A real IsoFLOP study on this machine: two attention variants, three sizes, three budgets and
two seeds through `llmlab train -m` at matched FLOPs (``train.max_flops``), then `llmlab report`
with its scaling section (surface fit, compute-optimal sizes, IsoFLOP cross-check, crossings,
scaling.png).

    python -m bench.isoflop                                   # about an hour on 2 CPU cores
    python -m bench.isoflop --variants mha,gqa --sizes 48,96,192 --budgets 1e12,3e12,1e13 --seeds 0

Results: bench/results/isoflop.json (the report's scaling section and each run's figures), and
bench/results/isoflop/ (report.md, scaling.png). Each job's losses do not depend on how busy
the machine was (same seed, same FLOPs, same steps); the wall times do.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import RESULTS, write_result

FIXED = ["logger=none", "train.ckpt_every=0", "train.sample_tokens=0", "train.eval_every=0", "train.eval_windows=64",
         "model.n_layers=2", "model.n_heads=4", "model.max_seq_len=128", "tokenizer.vocab_size=2048"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="mha,mla", help="model/attention kinds")
    ap.add_argument("--sizes", default="64,128,256", help="model.d_model values")
    ap.add_argument("--budgets", default="1e12,3e12,1e13", help="train.max_flops values")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--overrides", nargs="*", default=FIXED, help="settings shared by every job")
    ap.add_argument("--keep", type=Path, help="copy the sweep's run directories here (to report on them again)")
    args = ap.parse_args()
    repo = Path(__file__).resolve().parent.parent
    axes = [f"model/attention={args.variants}", f"model.d_model={args.sizes}", f"train.max_flops={args.budgets}",
            f"seed={args.seeds}"]
    with tempfile.TemporaryDirectory(prefix="llmlab-bench-isoflop-") as tmp:
        env = {**os.environ, "LLMLAB_CACHE": str(Path(tmp) / "cache"), "PYTHONPATH": str(repo), "TERM": "dumb"}
        t = time.perf_counter()
        sweep = subprocess.run([sys.executable, "-m", "llmlab", "train", "-m", *axes, *args.overrides,
                                "hydra.sweep.dir=sweep"], cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t
        if sweep.returncode:
            raise SystemExit(f"the sweep failed:\n{sweep.stderr[-3000:]}")
        out = RESULTS / "isoflop"
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "llmlab", "report", "sweep", f"out={out}", "hydra.run.dir=report"],
                       cwd=tmp, env=env, check=True)
        report = json.loads((out / "report.json").read_text())
        if args.keep:
            shutil.copytree(Path(tmp) / "sweep", args.keep, dirs_exist_ok=True)
        jobs = []
        for summary in sorted((Path(tmp) / "sweep").glob("*/summary.json")):
            s = json.loads(summary.read_text())
            jobs.append({"job": summary.parent.name, **{k: s.get(k) for k in (
                "val_loss", "steps", "tokens", "flops", "max_flops", "params_non_embedding", "flops_per_token",
                "wall_s", "tokens_per_s", "tokens_per_s_other_load")}})
    print((out / "report.md").read_text())
    write_result("isoflop", {"command": "llmlab train -m " + " ".join([*axes, *args.overrides]),
                             "sweep_wall_s": round(wall, 1), "scaling": report.get("scaling"), "jobs": jobs})


if __name__ == "__main__":
    main()
