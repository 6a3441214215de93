"""An IsoFLOP study on this machine, run through llmlab itself, in two rounds.

1. Planning: each variant at a few sizes and budgets, one seed (`llmlab train -m`), then
   `llmlab report`, whose scaling section fits L(N, D) and prints the next grid: at each
   budget, the sizes centred on the fitted optimum N*.
2. The study: at each of the study's budgets, that variant's centred sizes, two seeds; then
   `llmlab report` over all of them: the surface per variant, the compute-optimal sizes, the
   IsoFLOP cross-check, the crossing and the hold-out check (the fit without the largest
   budget predicts that budget's best loss).

Every run uses muP (``model.parametrization=mup``, base width 32, untied head, the learning
rate 8e-3 that ``bench.mup_transfer`` found best at widths 64 and 128), a warm-up of 5% of the
run (the default of a ``train.max_flops`` run), and widths that follow ``model.d_model`` (MLA's
latent d/2, its rotary and head dims d/4, a GELU FFN of 4 d), so each variant is the same
design at every size. The budgets are small (5e10 to 5e11 FLOPs) so that the whole study,
planning included, fits in well under an hour of 2 CPU cores: at these budgets the
compute-optimal models are tiny (d_model 16 to 48, 2 layers, vocabulary 512).

    python -m bench.isoflop                                    # about 30 minutes on 2 CPU cores
    python -m bench.isoflop --budgets 5e10,1e11,2e11,5e11 --seeds 0,1 --keep /tmp/isoflop-runs

Results: bench/results/isoflop.json (the study's scaling section, the plan, each run's figures,
the wall time of each round) and bench/results/isoflop/ (report.md, report.json, scaling.png).
A run's loss does not depend on how busy the machine was (same seed, same FLOPs, same steps);
the wall times do.
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

from omegaconf import OmegaConf

from bench.common import RESULTS, write_result

FIXED = ["logger=none", "train.ckpt_every=0", "train.sample_tokens=0", "train.eval_every=0",
         "train.eval_windows=256", "model.n_layers=2", "model.n_heads=4", "model.max_seq_len=128", "train.batch_size=16",
         "tokenizer.vocab_size=512", "model/ffn=gelu", "model.tie_embeddings=false", "model.parametrization=mup", "model.mup_base_width=32",
         "optim.lr=8e-3", "optim.weight_decay=0.0"]
VARIANTS = {
    "mha": ["model/attention=mha"],
    "mla": ["model/attention=mla", "attention.kv_rank=d_model/2", "attention.rope_dim=d_model/4",
            "attention.nope_dim=d_model/4", "attention.v_dim=d_model/4"],
}


def finished(sweep: Path) -> bool:
    """A sweep that ran to its end (it writes its report last)."""
    return (sweep / "report.json").exists()


def run(words: list[str], cwd: Path, env: dict) -> float:
    sweep = next((w.split("=", 1)[1] for w in words if w.startswith("hydra.sweep.dir=")), None)
    if sweep and finished(cwd / sweep):
        print(f"{sweep}: finished before, kept")
        return 0.0
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "llmlab", *words], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"llmlab {' '.join(words)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="mha,mla", help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--plan-sizes", default="16,32,64", help="model.d_model values of the planning round")
    ap.add_argument("--plan-budgets", default="5e10,5e11", help="train.max_flops values of the planning round")
    ap.add_argument("--budgets", default="5e10,1e11,2e11,5e11", help="train.max_flops values of the study")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--lr", help="optim.lr for every run (default: the one in FIXED)")
    ap.add_argument("--keep", type=Path, help="copy the runs here (to report on them again)")
    ap.add_argument("--work", type=Path, help="run in this directory (default: a temporary one) and skip every "
                    "sweep that already finished there, so an interrupted study resumes")
    args = ap.parse_args()
    repo = Path(__file__).resolve().parent.parent
    fixed = FIXED + ([f"optim.lr={args.lr}"] if args.lr else [])
    names = args.variants.split(",")
    with tempfile.TemporaryDirectory(prefix="llmlab-bench-isoflop-") as tmp:
        root = args.work or Path(tmp)
        env = {**os.environ, "LLMLAB_CACHE": str(root / "cache"), "PYTHONPATH": str(repo), "TERM": "dumb"}
        walls, commands = {}, []
        plan_dirs = []
        for name in names:
            words = ["train", "-m", *VARIANTS[name], f"model.d_model={args.plan_sizes}",
                     f"train.max_flops={args.plan_budgets}", "seed=0", *fixed]
            commands.append("llmlab " + " ".join(words))
            walls[f"plan {name}"] = run([*words, f"hydra.sweep.dir=plan/{name}"], root, env)
            plan_dirs.append(f"plan/{name}")
        run(["report", *plan_dirs, "out=plan-report", "hydra.run.dir=plan-report-run"], root, env)
        plan = json.loads((root / "plan-report" / "report.json").read_text())["scaling"]
        budgets = [float(b) for b in args.budgets.split(",")]
        study_dirs, grids = [], {}
        for name, plan_dir in zip(names, plan_dirs):
            # at each study budget, the sizes centred on the planning fit's N* there
            for b, sizes in plan_grid(root / plan_dir, budgets).items():
                done = root / f"study/{name}-{b:g}"
                if finished(done):  # what that sweep ran
                    sizes = sorted({int(OmegaConf.load(p)["model"]["d_model"]) for p in done.glob("*/config.yaml")})
                grids.setdefault(name, {})[f"{b:g}"] = sizes
                words = ["train", "-m", *VARIANTS[name], f"model.d_model={','.join(map(str, sizes))}",
                         f"train.max_flops={b:g}", f"seed={args.seeds}", *fixed]
                commands.append("llmlab " + " ".join(words))
                sub = f"study/{name}-{b:g}"
                walls[f"study {name} {b:g}"] = run([*words, f"hydra.sweep.dir={sub}"], root, env)
                study_dirs.append(sub)
        out = RESULTS / "isoflop"
        shutil.rmtree(out, ignore_errors=True)
        run(["report", *study_dirs, f"out={out}", "hydra.run.dir=study-report-run"], root, env)
        report = json.loads((out / "report.json").read_text())
        if args.keep:
            for d in ("plan", "study"):
                shutil.copytree(root / d, args.keep / d, dirs_exist_ok=True)
        jobs = []
        for summary in sorted((root / "study").glob("*/*/summary.json")):
            s = json.loads(summary.read_text())
            jobs.append({"job": f"{summary.parent.parent.name}/{summary.parent.name}", **{k: s.get(k) for k in (
                "val_loss", "steps", "tokens", "flops", "max_flops", "params_non_embedding", "flops_per_token",
                "wall_s", "tokens_per_s", "tokens_per_s_other_load")}})
    print((out / "report.md").read_text())
    write_result("isoflop", {"commands": commands, "wall_s": {k: round(v, 1) for k, v in walls.items()},
                             "total_wall_s": round(sum(walls.values()), 1), "plan": {"scaling": plan, "grids": grids},
                             "scaling": report.get("scaling"), "jobs": jobs})


def plan_grid(plan_dir: Path, budgets: list[float]) -> dict[float, list[int]]:
    """The planning runs' next grid at the study's budgets (which need not be the planning
    round's): the report's scaling section, asked at those budgets."""
    from llmlab.eval import scaling_report as sr
    from llmlab.eval.runs import find_runs

    section = sr.scaling_section(find_runs([plan_dir]), at_budgets=budgets)
    (grids,) = section["next_grid"].values()
    return {g["budget"]: [int(x) for x in g["sizes"]] for g in grids}


if __name__ == "__main__":
    main()
