"""How long a command line takes before any work: ``llmlab train --cfg job`` (compose and
print the config), against importing what it runs alone: the CLI and the train command's
module, with the parts it registers (torch and every registry). Both trees are timed the same
way, in fresh processes, interleaved, medians.

    python -m bench.cli                 # results/cli.json
    python -m bench.cli --ref ../old    # also time the same command in another checkout
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import write_result

REPO = Path(__file__).resolve().parent.parent
IMPORT = "import llmlab.cli, llmlab.commands.train"


def timed(args: list[str], cwd: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(cwd), "WANDB_MODE": "disabled"}
    t = time.perf_counter()
    subprocess.run(args, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--ref", type=Path, help="another checkout of llmlab to time the same way")
    args = parser.parse_args()
    trees = {"this": REPO, **({"ref": args.ref.resolve()} if args.ref else {})}
    times: dict[str, dict[str, list[float]]] = {k: {"import": [], "cfg_job": []} for k in trees}
    for _ in range(args.repeats):  # interleaved, so both see the same machine
        for name, tree in trees.items():
            times[name]["import"].append(timed([sys.executable, "-c", IMPORT], tree))
            times[name]["cfg_job"].append(timed([sys.executable, "-m", "llmlab", "train", "--cfg", "job"], tree))
    result = {}
    for name, t in times.items():
        imp, job = statistics.median(t["import"]), statistics.median(t["cfg_job"])
        result[name] = {"tree": str(trees[name]), "import_s": round(imp, 3), "cfg_job_s": round(job, 3),
                        "beyond_import_s": round(job - imp, 3),
                        "cfg_job_spread_s": round(max(t["cfg_job"]) - min(t["cfg_job"]), 3)}
        print(f"{name}: import cli + train module {imp:.2f} s, train --cfg job {job:.2f} s, beyond import {job - imp:.2f} s")
    write_result("cli", {"repeats": args.repeats, **result})


if __name__ == "__main__":
    main()
