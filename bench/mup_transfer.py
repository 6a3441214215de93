"""Learning-rate transfer under muP: does the best ``optim.lr`` stay put as the width grows?

One `llmlab train -m` sweep over three widths and four learning rates (a factor of 2 apart),
under the standard parametrization and under ``model.parametrization=mup`` (base width: the
smallest), one seed, a fixed number of steps. For each parametrization and width, the
learning rate with the lowest final validation loss; the transfer holds when that best rate
moves by at most one grid step across the widths (Yang et al. 2022 show it for muP and not
for the standard parametrization).

    python -m bench.mup_transfer                        # about 10 minutes on 2 CPU cores
    python -m bench.mup_transfer --widths 32,64,128 --lrs 2e-3,4e-3,8e-3,1.6e-2 --steps 200

Results: bench/results/mup_transfer.json (every run's loss, the best rate per width, and the
shift in grid steps). The losses do not depend on how busy the machine was.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import child_env, write_result

FIXED = ["optim=adamw", "logger=none", "train.ckpt_every=0", "train.sample_tokens=0", "train.eval_every=0", "train.eval_windows=128",
         "model.n_layers=2", "model.n_heads=4", "model.max_seq_len=128", "train.batch_size=16",
         "tokenizer.vocab_size=2048", "model/ffn=gelu", "model.tie_embeddings=false", "optim.weight_decay=0.0"]


def best_rates(jobs: list[dict], widths: list[int], lrs: list[float]) -> dict:
    """Per parametrization: the best rate at each width and how far it moves, in grid steps."""
    out = {}
    for param in ("standard", "mup"):
        best = {}
        for w in widths:
            runs = [j for j in jobs if j["parametrization"] == param and j["d_model"] == w and j["val_loss"] is not None
                    and math.isfinite(j["val_loss"])]
            if runs:
                best[w] = min(runs, key=lambda j: j["val_loss"])["lr"]
        index = [lrs.index(best[w]) for w in widths if w in best]
        out[param] = {"best_lr": {str(w): lr for w, lr in best.items()},
                      "shift_in_grid_steps": max(index) - min(index) if index else None}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", default="32,64,128", help="model.d_model values; the smallest is muP's base width")
    ap.add_argument("--lrs", default="2e-3,4e-3,8e-3,1.6e-2", help="optim.lr values, smallest first")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    lrs = [float(x) for x in args.lrs.split(",")]
    axes = ["model.parametrization=standard,mup", f"model.d_model={args.widths}", f"optim.lr={args.lrs}"]
    settings = [*FIXED, f"model.mup_base_width={min(widths)}", f"train.steps={args.steps}", f"seed={args.seed}",
                "sched.warmup_share=0.05"]
    with tempfile.TemporaryDirectory(prefix="llmlab-bench-mup-") as tmp:
        env = child_env(LLMLAB_CACHE=str(Path(tmp) / "cache"), TERM="dumb")
        t = time.perf_counter()
        sweep = subprocess.run([sys.executable, "-m", "llmlab", "train", "-m", *axes, *settings, "hydra.sweep.dir=sweep"],
                               cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t
        if sweep.returncode:
            raise SystemExit(f"the sweep failed:\n{sweep.stderr[-3000:]}")
        jobs = []
        from omegaconf import OmegaConf

        for summary in sorted((Path(tmp) / "sweep").glob("*/summary.json")):
            s = json.loads(summary.read_text())
            overrides = dict(o.split("=", 1) for o in OmegaConf.load(summary.parent / ".hydra" / "overrides.yaml"))
            jobs.append({"parametrization": overrides["model.parametrization"], "d_model": int(overrides["model.d_model"]),
                         "lr": float(overrides["optim.lr"]), "val_loss": s.get("val_loss"), "wall_s": s.get("wall_s")})
    result = best_rates(jobs, widths, lrs)
    for param, r in result.items():
        print(f"{param}: best optim.lr per width {r['best_lr']}; moves {r['shift_in_grid_steps']} grid step(s)")
    write_result("mup_transfer", {"command": "llmlab train -m " + " ".join([*axes, *settings]), "sweep_wall_s": round(wall, 1),
                                  "widths": widths, "lrs": lrs, "steps": args.steps, **result, "jobs": jobs})


if __name__ == "__main__":
    main()
