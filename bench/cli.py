"""How long a command line takes before any work: ``llmlab train --cfg job`` (compose and
print the config) and ``llmlab train --help``, against importing what they run alone: the
CLI and the train command's module; and a whole ``llmlab train`` of one step of a tiny model
on a small text (its data prepared beforehand), where the config's composition and its check
are a visible share. Both trees are timed the same way, in fresh processes, interleaved,
medians.

    python -m bench.cli                 # results/cli.json
    python -m bench.cli --ref ../old    # also time the same commands in another checkout
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO, child_env, write_result
IMPORT = "import llmlab.cli, llmlab.commands.train"


def timed(args: list[str], cwd: Path, **env: str) -> float:
    t = time.perf_counter()
    subprocess.run(args, cwd=cwd, env=child_env(cwd, WANDB_MODE="disabled", **env), check=True, capture_output=True)
    return time.perf_counter() - t


def tiny_train(text: Path, run_dir: Path) -> list[str]:
    """A whole training run whose own work is a fraction of a second."""
    return [sys.executable, "-m", "llmlab", "train", "data=text", f"data.paths=[{text}]", "tokenizer=byte",
            "model.d_model=16", "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=16", "train.steps=1",
            "train.batch_size=2", "train.eval_windows=1", "train.prompts=[]", "logger=none", f"hydra.run.dir={run_dir}"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--ref", type=Path, help="another checkout of llmlab to time the same way")
    args = parser.parse_args()
    trees = {"this": REPO, **({"ref": args.ref.resolve()} if args.ref else {})}
    times: dict[str, dict[str, list[float]]] = {k: {"import": [], "cfg_job": [], "help": [], "train": []} for k in trees}
    with tempfile.TemporaryDirectory(prefix="llmlab-bench-cli-") as tmp:
        work = Path(tmp)
        text = work / "text.txt"
        text.write_text("the quick brown fox jumps over the lazy dog\n" * 400)
        cache = {"LLMLAB_CACHE": str(work / "cache")}
        timed(tiny_train(text, work / "prepare"), REPO, **cache)  # the data, once, outside the timings
        for i in range(args.repeats):  # interleaved, so both see the same machine
            for name, tree in trees.items():
                times[name]["import"].append(timed([sys.executable, "-c", IMPORT], tree))
                times[name]["cfg_job"].append(timed([sys.executable, "-m", "llmlab", "train", "--cfg", "job"], tree))
                times[name]["help"].append(timed([sys.executable, "-m", "llmlab", "train", "--help"], tree))
                times[name]["train"].append(timed(tiny_train(text, work / f"{name}-{i}"), tree, **cache))
    result = {}
    for name, t in times.items():
        imp, job, helped, train = (statistics.median(t[k]) for k in ("import", "cfg_job", "help", "train"))
        result[name] = {"tree": str(trees[name]), "import_s": round(imp, 3), "cfg_job_s": round(job, 3),
                        "beyond_import_s": round(job - imp, 3),
                        "cfg_job_spread_s": round(max(t["cfg_job"]) - min(t["cfg_job"]), 3),
                        "help_s": round(helped, 3), "help_spread_s": round(max(t["help"]) - min(t["help"]), 3),
                        "tiny_train_s": round(train, 3), "tiny_train_spread_s": round(max(t["train"]) - min(t["train"]), 3)}
        print(f"{name}: import cli + train module {imp:.2f} s, train --cfg job {job:.2f} s, beyond import {job - imp:.2f} s; "
              f"train --help {helped:.2f} s, a one-step tiny train {train:.2f} s")
    write_result("cli", {"repeats": args.repeats, **result})


if __name__ == "__main__":
    main()
