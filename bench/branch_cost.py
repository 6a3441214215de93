"""What cooldown branches save: the points of an IsoFLOP study (sizes x budgets x seeds), each
trained as its own run, against the same points as branches (`sched.branch_flops`) of one run
per size and seed at the largest budget.

Every run is bench.isoflop's (muP, the same fixed settings and variant) with ``sched=wsd`` and
one warm-up in steps for all (``--warmup``): a branch keeps its long run's warm-up
(`llmlab.train.branches`), so a study that branches fixes its warm-up in steps, short beside
its smallest budget's run (a FLOP-budget run's default, 5% of the run, would give the
smallest branches the long run's warm-up, several times their own). With it, each branch is
the run of its budget, so the two routes must give the same losses (in fp32 on the CPU, bit for
bit) and differ in their cost only. The runs go one at a time, each with one thread, and each
is timed by the CPU time of its process (user + system: with one thread, no time spent spinning
while another process holds the core, so a busy machine changes it less than the wall time),
with the wall time beside it.

    python -m bench.branch_cost                                   # about 10 minutes on 2 CPU cores
    python -m bench.branch_cost --sizes 16,32 --budgets 5e10,1e11,2e11 --seeds 0,1

Results: bench/results/branch_cost.json (each point's loss both ways, the CPU and wall seconds of
each route, their ratio).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench.common import child_env, cpu_timed, write_result
from bench.isoflop import FIXED, VARIANTS


def val_loss(run_dir: Path) -> float:
    return float(json.loads((run_dir / "summary.json").read_text())["val_loss"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default="mha", help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--sizes", default="16,24,32", help="model.d_model values")
    ap.add_argument("--budgets", default="5e10,1e11,2e11,4e11", help="train.max_flops values; the largest is the long run's")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--warmup", type=int, default=10, help="sched.warmup of every run, in steps")
    ap.add_argument("--name", default="branch_cost")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    budgets = sorted(float(b) for b in args.budgets.split(","))
    seeds = [int(s) for s in args.seeds.split(",")]
    *smaller, top = budgets
    common = [*FIXED, *VARIANTS[args.variant], "sched=wsd", f"sched.warmup={args.warmup}", "precision=fp32"]
    env = child_env(OMP_NUM_THREADS="1")
    points, plain_t, branch_t = [], [], []
    with tempfile.TemporaryDirectory(prefix="llmlab-branch-cost-") as tmp:
        work = Path(tmp)
        # the data once, so that neither route pays for its preparation
        cpu_timed("branch_cost", ["tokenize", *[w for w in FIXED if w.startswith("tokenizer")]], work, env)
        for n in sizes:
            for seed in seeds:
                long = work / "branched" / f"d{n}-s{seed}"
                branched = [f"train.max_flops={top:g}", f"sched.branch_flops=[{','.join(f'{b:g}' for b in smaller)}]"]
                cost = cpu_timed("branch_cost", ["train", *common, f"model.d_model={n}", f"seed={seed}", *branched,
                                                 f"hydra.run.dir={long}"], work, env)
                branch_t.append(cost)
                print(f"d_model {n} seed {seed}: one run with {len(smaller)} branches: {cost['cpu_s']:.0f} s CPU",
                      flush=True)
                branch_dirs = {float(json.loads((p / "summary.json").read_text())["max_flops"]): p
                               for p in (long / "branches").iterdir()}
                for budget in budgets:
                    alone = work / "plain" / f"d{n}-s{seed}-{budget:g}"
                    cost = cpu_timed("branch_cost", ["train", *common, f"model.d_model={n}", f"seed={seed}",
                                                     f"train.max_flops={budget:g}", f"hydra.run.dir={alone}"], work, env)
                    plain_t.append(cost)
                    branched = long if budget == top else branch_dirs[budget]
                    points.append({"d_model": n, "seed": seed, "budget": budget, "plain": val_loss(alone),
                                   "branch": val_loss(branched), "plain_cpu_s": cost["cpu_s"]})
                    print(f"  {budget:g}: loss {points[-1]['plain']:.4f} on its own, {points[-1]['branch']:.4f} as a "
                          f"branch ({cost['cpu_s']:.0f} s CPU on its own)", flush=True)
    plain_cpu, branch_cpu = sum(c["cpu_s"] for c in plain_t), sum(c["cpu_s"] for c in branch_t)
    diffs = [p["branch"] - p["plain"] for p in points if p["budget"] != top]
    same = sum(p["branch"] == p["plain"] for p in points)
    result = {"command": "python -m bench.branch_cost " + " ".join(sys.argv[1:]), "variant": args.variant,
              "sizes": sizes, "budgets": budgets, "seeds": seeds,
              "plain": {"cpu_s": round(plain_cpu, 1), "wall_s": round(sum(c["wall_s"] for c in plain_t), 1),
                        "runs": len(plain_t)},
              "branched": {"cpu_s": round(branch_cpu, 1), "wall_s": round(sum(c["wall_s"] for c in branch_t), 1),
                           "runs": len(branch_t)},
              "cpu_ratio": round(branch_cpu / plain_cpu, 3),
              "branch_minus_plain": {"mean": sum(diffs) / len(diffs), "min": min(diffs), "max": max(diffs)} if diffs
              else None,
              "identical_losses": same, "points": points}
    print(f"{len(points)} points: {plain_cpu:.0f} s CPU as runs of their own, {branch_cpu:.0f} s as branches "
          f"({result['cpu_ratio']:.2f}x); {same} of {len(points)} losses identical both ways")
    write_result(args.name, result)


if __name__ == "__main__":
    main()
