"""An IsoFLOP study on this machine, run through llmlab itself, in two rounds.

1. Planning: each variant at a few sizes and budgets, one seed (`llmlab train -m`), then
   `llmlab report`, whose scaling section fits L(N, D) and prints the next grid: at each
   budget, the sizes centred on the fitted optimum N*.
2. The study: at each of the study's budgets, that variant's centred sizes, three seeds; then
   `llmlab report` over all of them: the surface per variant, the compute-optimal sizes, the
   IsoFLOP cross-check, the frontier, the crossing and the hold-out check (fitted without the
   largest budget, the surface and the frontier each predict that budget's best loss).
3. Re-centring (``--recentre``, one round): where that report finds a budget's grid
   off-centre, the size one ``--multiple`` past the end nearer the optimum is run too, and the
   report is written again.

Every run uses muP (``model.parametrization=mup``, base width 32, untied head, the learning
rate 8e-3 that ``bench.mup_transfer`` found best at widths 64 and 128; at width 32 its best was
1.6e-2, its grid's end, so ``--lr 8e-3,1.6e-2,3.2e-2,6.4e-2`` runs every cell at each rate
and the reports keep each cell's best, ``select=best_lr``), a warm-up of 5% of the
run (the default of a ``train.max_flops`` run), and widths that follow ``model.d_model`` (MLA's
latent d/2, its rotary and head dims d/4, a GELU FFN of 4 d), so each variant is the same
design at every size. The budgets are small (5e10 to 5e11 FLOPs) so that the whole study,
planning included, fits in well under an hour of 2 CPU cores: at these budgets the
compute-optimal models are tiny (d_model 8 to 48, 2 layers, vocabulary 512).

    python -m bench.isoflop --jobs 2          # 18 minutes on 2 CPU cores (make bench-long)
    python -m bench.isoflop --budgets 5e10,1e11,2e11,5e11 --seeds 0,1 --keep /tmp/isoflop-runs

On one CUDA GPU, ten times the budgets, three seeds and a corpus that no run repeats (the
installed packages' sources), 84 runs in under 8 minutes of an H100 (bench/results/isoflop-gpu/):

    python -m bench.isoflop --jobs 8 --name isoflop-gpu --plan-sizes 16,32,64 --plan-budgets 5e11,1e12 \
        --budgets 5e11,1e12,2e12,5e12 --seeds 0,1,2 --set device=cuda --set precision=fp32 \
        --set data.root=$(python -c 'import site; print(site.getsitepackages()[0])') --set tokenizer.train_bytes=32000000

Each run of the study (a variant at one size and budget, one seed) is its own ``llmlab train -m``
process, ``--jobs`` at a time, the longest first. The sizes a study chose are kept in
``grids.json`` of its ``--work`` directory, so a resumed study runs the same grid;
``--grids FILE`` gives them instead of a planning round.

Results: bench/results/NAME.json (the study's scaling section, the plan, each run's figures,
the wall time of each sweep) and bench/results/NAME/ (report.md, report.json, scaling.png);
NAME is ``--name``, isoflop by default.
A run's loss does not depend on how busy the machine was (same seed, same FLOPs, same steps);
the wall times do.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NoReturn


from bench.common import RESULTS, child_env, write_result

FIXED = ["optim=adamw", "logger=none", "train.ckpt_every=0", "train.sample_tokens=0", "train.eval_every=0",
         "train.eval_windows=256", "model.n_layers=2", "model.n_heads=4", "model.max_seq_len=128", "train.batch_size=16",
         "tokenizer.vocab_size=512", "model/ffn=gelu", "model.tie_embeddings=false", "model.parametrization=mup", "model.mup_base_width=32",
         "optim.lr=8e-3", "optim.weight_decay=0.0"]
VARIANTS = {
    "mha": ["model/attention=mha"],
    "mla": ["model/attention=mla", "attention.kv_rank=d_model/2", "attention.rope_dim=d_model/4",
            "attention.nope_dim=d_model/4", "attention.v_dim=d_model/4"],
    "gqa": ["model/attention=gqa", "attention.kv_heads=2"],  # two key/value heads for the four query heads
    "post": ["model/attention=mha", "norm=post"],  # normalised after each residual sum
    "nope": ["model/attention=mha", "pos=none"],  # no position signal but the causal mask
}


def finished(sweep: Path) -> bool:
    """A sweep that ran to its end (it writes its report last)."""
    return (sweep / "report.json").exists()


def run(words: list[str], cwd: Path, env: dict) -> float | None:
    sweep = next((w.split("=", 1)[1] for w in words if w.startswith("hydra.sweep.dir=")), None)
    if sweep and finished(cwd / sweep):
        print(f"{sweep}: finished before, kept", flush=True)
        return 0.0
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "llmlab", *words], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode:
        if sweep:  # one failed sweep: said, and the study goes on without it
            print(f"{sweep}: FAILED\n{done.stderr[-1500:]}", flush=True)
            return None
        raise SystemExit(f"llmlab {' '.join(words)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    wall = time.perf_counter() - t
    if sweep:
        print(f"{sweep}: {wall:.0f} s", flush=True)
    return wall


def run_all(sweeps: list[tuple[str, list[str]]], cwd: Path, env: dict, jobs: int) -> dict[str, float | None]:
    """Each (name, words) as its own ``llmlab`` process, ``jobs`` at a time, the longest
    first (the order given); the wall time of each (None: it failed)."""
    if jobs <= 1:
        return {name: run(words, cwd, env) for name, words in sweeps}
    with ThreadPoolExecutor(jobs) as pool:
        walls = {name: pool.submit(run, words, cwd, env) for name, words in sweeps}
        return {name: w.result() for name, w in walls.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="mha,mla", help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--plan-sizes", default="16,32,64", help="model.d_model values of the planning round")
    ap.add_argument("--plan-budgets", default="5e10,5e11", help="train.max_flops values of the planning round")
    ap.add_argument("--budgets", default="5e10,1e11,2e11,5e11", help="train.max_flops values of the study")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--multiple", type=int, default=8, help="the study's sizes are multiples of this (32 with "
                    "model.n_layers=d_model/32, so that every size has whole layers at the same aspect ratio)")
    ap.add_argument("--points", type=int, default=3, help="sizes per budget in the study's grid, centred on the "
                    "planning fit's optimum (4 or 5 leave room for a planning fit that is a little off)")
    ap.add_argument("--lr", help="optim.lr for every run (default: the one in FIXED), or several, comma-separated: "
                    "every cell runs each, and the reports keep each cell's best (select=best_lr)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="one more override for every run (device=cuda, data.root=DIR, ...), or another value "
                    "for one of the fixed ones (train.batch_size=8); repeatable")
    ap.add_argument("--jobs", type=int, default=1, help="sweeps run at once (one process each); on one GPU, "
                    "tiny models leave it idle most of a step, so several share it well")
    ap.add_argument("--name", default="isoflop", help="results: bench/results/NAME.json and bench/results/NAME/")
    ap.add_argument("--keep", type=Path, help="copy the runs here (to report on them again)")
    ap.add_argument("--surface", default="chinchilla", help="the reports' surface (llmlab report surface=...): "
                    "chinchilla, kaplan where size and tokens interact, or auto (per variant, by a nested hold-out)")
    ap.add_argument("--recentre", type=int, default=1, help="rounds that, where the study's report finds a budget's "
                    "grid off-centre, add one size (a --multiple step past the end nearer the fitted optimum) and "
                    "report again (0: none)")
    ap.add_argument("--grids", type=Path, help="a JSON file of the study's sizes, {variant: {budget: [d_model, ...]}}: "
                    "the planning round is skipped")
    ap.add_argument("--work", type=Path, help="run in this directory (default: a temporary one) and skip every "
                    "sweep that already finished there, so an interrupted study resumes")
    args = ap.parse_args()
    lrs = lr_values(args.lr)
    if len(lrs) > 1 and any(w.startswith("optim.lr=") for w in args.set):
        sys.exit("bench.isoflop: --set optim.lr: the learning rates are --lr's; give them there")
    extra = ([f"optim.lr={lrs[0]}"] if len(lrs) == 1 else []) + args.set
    # a --set of a key FIXED sets (train.batch_size=8) replaces it; several rates: each sweep its own
    replaced = {e.split("=", 1)[0] for e in extra} | ({"optim.lr"} if len(lrs) > 1 else set())
    fixed = [w for w in FIXED if w.split("=", 1)[0] not in replaced] + extra
    # several rates: each sweep its rate, its directory named by it, and each cell's best kept
    rates = [([f"optim.lr={lr}"], f"-lr{lr}") for lr in lrs] if len(lrs) > 1 else [([], "")]
    select = "best_lr" if len(lrs) > 1 else "all"
    names = args.variants.split(",")
    start = time.perf_counter()
    plan_sizes = [int(d) for d in args.plan_sizes.split(",")]
    plan_budgets = [float(b) for b in args.plan_budgets.split(",")]
    budgets = [float(b) for b in args.budgets.split(",")]
    if not args.grids and (min(len(plan_sizes), len(plan_budgets)) < 2 or len(plan_sizes) * len(plan_budgets) < 5):
        sys.exit(f"bench.isoflop: --plan-sizes {args.plan_sizes} --plan-budgets {args.plan_budgets}: too few runs for "
                 "the planning fit (it needs 2 sizes, 2 budgets and 5 runs); allowed: 3 sizes or more and 2 budgets "
                 "or more, or --grids")
    if args.recentre < 0:
        sys.exit(f"bench.isoflop: --recentre: {args.recentre} rounds; allowed: 0 (none) or more")
    for given_twice in {f"{b:g}" for b in budgets if budgets.count(b) > 1}:  # two processes would share a run directory
        sys.exit(f"bench.isoflop: --budgets: {given_twice} is given twice")
    given = read_grids(args.grids, names, budgets) if args.grids else None  # checked before any run starts
    with tempfile.TemporaryDirectory(prefix="llmlab-bench-isoflop-") as tmp:
        root = args.work or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        # jobs at once share the cores: each its share of threads (torch's default is every core,
        # and 16 jobs x 16 threads that wait by spinning crowd out the work), unless set by hand
        threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // args.jobs))
        env = child_env(LLMLAB_CACHE=str(root / "cache"), TERM="dumb", OMP_NUM_THREADS=threads)
        walls, commands = {}, []
        # the data once, before processes that would wait on its lock
        walls["tokenize"] = run(["tokenize", *[w for w in fixed if w.startswith(("data.", "tokenizer."))],
                                 "hydra.run.dir=tokenize-run"], root, env)
        # one sweep per variant, size and budget, so that they can run at once
        plan: list[tuple[str, list[str]]] = []
        for name in names if not args.grids else []:
            for d in plan_sizes:
                for b in plan_budgets:
                    for rate, tag in rates:
                        words = train_words(name, d, b, "0", [*fixed, *rate])
                        commands.append("llmlab " + " ".join(words))
                        plan.append((f"plan {name} d{d} {b:g}{tag}", [*words, f"hydra.sweep.dir=plan/{name}-d{d}-{b:g}{tag}"]))
        walls.update(run_all(sorted(plan, key=lambda p: -cost(p[1])), root, env, args.jobs))
        plan_dirs = {name: [f"plan/{name}-d{d}-{b:g}{tag}" for d in plan_sizes for b in plan_budgets for _, tag in rates]
                     for name in names}
        plan_dirs = {name: [d for d in dirs if (root / d).exists()] for name, dirs in plan_dirs.items()}
        plan_scaling = None
        if not args.grids:
            run(["report", *[d for dirs in plan_dirs.values() for d in dirs], "out=plan-report", f"select={select}",
                 f"surface={args.surface}", "hydra.run.dir=plan-report-run"], root, env)
            plan_scaling = json.loads((root / "plan-report" / "report.json").read_text())["scaling"]
        study: list[tuple[str, list[str]]] = []
        grids: dict = {}
        chosen = root / "grids.json"  # what the first try chose: a resumed study keeps it
        if given is not None:
            grids = given
            save_grids(chosen, grids)
        elif chosen.exists():
            grids = read_grids(chosen, names, budgets)
        else:
            for name in names:
                # at each study budget, the sizes centred on the planning fit's N* there
                for b, sizes in plan_grid([root / d for d in plan_dirs[name]], budgets, args.multiple, args.points,
                                           select).items():
                    grids.setdefault(name, {})[f"{b:g}"] = sizes
            save_grids(chosen, grids)
        def sweeps(cells: list[tuple[str, float, int]]) -> list[tuple[str, list[str]]]:
            """Each (variant, budget, d_model) cell's seeds, each seed its own process, so that
            the longest cell's seeds run side by side."""
            out = []
            for name, b, d in cells:
                for rate, tag in rates:
                    words = train_words(name, d, b, args.seeds, [*fixed, *rate])
                    commands.append("llmlab " + " ".join(words))
                    for seed in args.seeds.split(","):
                        one = [w if not w.startswith("seed=") else f"seed={seed}" for w in words]
                        out.append((f"study {name} d{d} {b:g} seed {seed}{tag}",
                                    [*one, f"hydra.sweep.dir=study/{name}-{b:g}-d{d}-seed{seed}{tag}"]))
            return out

        def report_on(studied: list[tuple[str, list[str]]]) -> dict:
            shutil.rmtree(out, ignore_errors=True)
            dirs = [w.split("=", 1)[1] for _, words in studied for w in words if w.startswith("hydra.sweep.dir=")
                    if (root / w.split("=", 1)[1]).exists()]
            run(["report", *dirs, f"out={out}", f"select={select}", f"surface={args.surface}", "hydra.run.dir=study-report-run"],
                root, env)
            return json.loads((out / "report.json").read_text())

        out = RESULTS / args.name
        study = sweeps([(name, b, d) for name in names for b in budgets for d in grids[name][f"{b:g}"]])
        walls.update(run_all(sorted(study, key=lambda s: -cost(s[1])), root, env, args.jobs))
        report = report_on(study)
        added: list[dict] = []
        for _ in range(args.recentre):
            more = recentre(report.get("scaling"), grids, names, args.multiple)
            if not more:
                break
            for m in more:
                print(f"recentre: {m['variant']} at {m['budget']:g}: {m['why']}", flush=True)
                if m["d_model"] is not None:
                    grids[m["variant"]][f"{m['budget']:g}"] = sorted({*grids[m["variant"]][f"{m['budget']:g}"],
                                                                      m["d_model"]})
            added += more
            save_grids(chosen, grids)  # a resumed study runs the grid as extended
            extra = sweeps([(m["variant"], m["budget"], m["d_model"]) for m in more if m["d_model"] is not None])
            if not extra:
                break
            walls.update(run_all(sorted(extra, key=lambda s: -cost(s[1])), root, env, args.jobs))
            study += extra
            report = report_on(study)
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
    write_result(args.name, {"commands": commands, "jobs_at_once": args.jobs,
                             "wall_s": {k: round(v, 1) if v is not None else "failed" for k, v in walls.items()},
                             "total_wall_s": round(time.perf_counter() - start, 1),
                             "plan": {"scaling": plan_scaling, "grids": grids}, "recentred": added,
                             "scaling": report.get("scaling"),
                             "jobs": jobs})


def train_words(name: str, d: int, budget: float, seeds: str, fixed: list[str]) -> list[str]:
    """``llmlab train -m``'s words for one variant at one size and budget."""
    return ["train", "-m", *VARIANTS[name], f"model.d_model={d}", f"train.max_flops={budget:g}", f"seed={seeds}", *fixed]


def lr_values(text: str | None) -> list[str]:
    """--lr's rates, as given (they name the sweeps); anything not a positive number stops the
    bench with one line."""
    if text is None:
        return []
    values = [v.strip() for v in text.split(",")]
    for v in values:
        try:
            ok = math.isfinite(float(v)) and float(v) > 0
        except ValueError:
            ok = False
        if not ok:
            sys.exit(f"bench.isoflop: --lr: {v!r} is not a learning rate; allowed: positive numbers, comma-separated")
    for twice in {v for v in values if values.count(v) > 1}:
        sys.exit(f"bench.isoflop: --lr: {twice} is given twice")
    return values


def cost(words: list[str]) -> float:
    """A sweep's relative running time, to start the longest first: its budget over its width
    (a small model's step costs about as much as a larger one's). Each sweep has one seed."""
    value = {w.split("=", 1)[0]: w.split("=", 1)[1] for w in words if "=" in w}
    return float(value["train.max_flops"]) / int(value["model.d_model"])


def read_grids(path: Path, names: list[str], budgets: list[float]) -> dict[str, dict[str, list[int]]]:
    """The study's sizes from ``path`` ({variant: {budget: [d_model, ...]}}, a file that may have
    been written by hand), keyed as the study asks for them; anything else stops the bench with
    one line that names the file and the entry."""
    def stop(why: str) -> NoReturn:
        sys.exit(f"bench.isoflop: {path}: {why}")

    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        stop(f"not a readable JSON file ({e})")
    if not isinstance(data, dict):
        stop("must be a JSON object {variant: {budget: [d_model, ...]}}")
    grids: dict[str, dict[str, list[int]]] = {}
    for name in names:
        per_budget = data.get(name)
        if not isinstance(per_budget, dict):
            stop(f"no sizes for variant {name!r} (an object {{budget: [d_model, ...]}}); it has {sorted(data)}")
        keyed: dict[str, object] = {}
        for key, sizes in per_budget.items():
            try:
                keyed[f"{float(key):g}"] = sizes
            except ValueError:
                stop(f"{name}: budget {key!r} is not a number")
        for b in budgets:
            sizes = keyed.get(f"{b:g}")
            if (not isinstance(sizes, list) or not sizes
                    or not all(type(d) is int and d > 0 for d in sizes)):  # noqa: E721 (bool is not a width)
                stop(f"{name}: budget {b:g} needs a list of positive whole d_model values, got {sizes!r}")
            grids.setdefault(name, {})[f"{b:g}"] = sizes
    return grids


def save_grids(path: Path, grids: dict[str, dict[str, list[int]]]) -> None:
    """Write the study's sizes to ``path``, keeping the sizes it holds for other variants and
    budgets: a study over some of a work directory's budgets (given that file as ``--grids``)
    leaves the rest of its record as it was."""
    try:
        kept = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, UnicodeDecodeError, ValueError):
        kept = None
    if not isinstance(kept, dict):
        print(f"bench.isoflop: {path}: not a JSON object of sizes; replaced by this study's", flush=True)
        kept = {}
    for name, per_budget in grids.items():
        kept[name] = {**(kept.get(name) if isinstance(kept.get(name), dict) else {}), **per_budget}
    path.write_text(json.dumps(kept))


def plan_grid(plan_dirs: list[Path], budgets: list[float], multiple: int = 8, points: int = 3,
              select: str = "all") -> dict[float, list[int]]:
    """The planning runs' next grid at the study's budgets (which need not be the planning
    round's): the report's scaling section, asked at those budgets for ``points`` sizes each,
    each size a multiple of ``multiple`` (MLA's rotary width d/4 must be even with 4 heads: d
    a multiple of 8). ``select``: as the report's (best_lr: each cell's best rate counts)."""
    from llmlab.eval.runs import find_runs
    from llmlab.study import design as de
    from llmlab.study import section as se

    runs, _, drop = de.apply_select(find_runs(plan_dirs), select)
    section = se.scaling_section(runs, drop, at_budgets=budgets, points=points)
    if not section or not section["next_grid"]:  # a planning round too small, or runs that failed
        why = "; ".join(v["why"] for v in (section or {}).get("variants", {}).values() if v.get("why"))
        sys.exit(f"bench.isoflop: the planning runs in {plan_dirs[0].parent} give no fit "
                 f"to centre the study's grids on ({why or 'no size and budget axes'}); allowed: --plan-sizes with 3 "
                 "sizes or more and --plan-budgets with 2 or more, or --grids")
    (grids,) = section["next_grid"].values()
    return {g["budget"]: snap([int(x) for x in g["sizes"]], multiple) for g in grids}


def recentre(section: dict | None, grids: dict[str, dict[str, list[int]]], names: list[str],
             multiple: int) -> list[dict]:
    """Where the study's report finds a budget's grid off-centre, the size one ``multiple`` past
    an end of the grid: past the best size where that is an end, else past the end nearer the
    surface's optimum (or the IsoFLOP vertex) when that lies outside the middle half of the
    sizes' log span. Each: {variant, budget, d_model (None where the grid cannot grow that way),
    why}."""
    from llmlab.study import optimum as op

    out = []
    for label, v in ((section or {}).get("variants") or {}).items():
        words = set(label.split())
        name = next((n for n in names if set(VARIANTS[n]) <= words), None)
        if name is None:
            continue
        for b in v.get("per_budget", []):
            if not b.get("isoflop_off_centre"):
                continue
            iso = b.get("isoflop") or {}
            if b.get("best_at_end"):  # the best size run is an end of the grid: grow the grid past it
                where = 0.0 if b["best_at_end"] == "smallest" else 1.0
            else:
                where = b["optimum_position"] if op.off_centre(b["optimum_position"]) else iso.get("position")
            if where is None:
                continue
            sizes = grids[name][f"{b['budget']:g}"]
            low = where < 0.5
            d = min(sizes) - multiple if low else max(sizes) + multiple
            d = d if d >= multiple else None
            out.append({"variant": name, "budget": b["budget"], "d_model": d, "side": "below" if low else "above",
                        "why": (f"the best size run is the grid {sizes}'s {b['best_at_end']}: " if b.get("best_at_end") else
                                f"the optimum sits at {where:.2f} of the grid {sizes}'s log span: ")
                               + (f"adding d_model {d}" if d else f"no size below {min(sizes)} is a multiple of {multiple}")})
    return out


def snap(sizes: list[int], multiple: int) -> list[int]:
    """``sizes`` rounded to multiples of ``multiple`` (at least one multiple), as many as were
    given: where two round to one, the grid keeps its step from there up."""
    out: list[int] = []
    for d in sorted(sizes):
        d = max(multiple, multiple * round(d / multiple))
        out.append(d if not out or d > out[-1] else out[-1] + multiple)
    return out


if __name__ == "__main__":
    main()
