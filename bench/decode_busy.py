"""Decoding on a CPU that other work keeps busy: ``llmlab sample threads=auto`` (the default)
against every step on all of torch's threads (``threads=N``), beside a load.

    python -m bench.decode_busy [--sizes 1.7M,22.9M] [--rounds 4] [--tokens 200]
                                [--load train|spin|none] [--data FILE] [--keep DIR]

The sizes are `bench.decode_vs_hf`'s llama models, trained as there (``--keep``: the same
directory serves both benchmarks). The load runs for the whole measurement: ``train``, an
``llmlab train`` of the default model in a loop (what a user has running beside a sample),
``spin``, one process that keeps one core busy, or ``none``. Every round runs both commands,
each in a fresh process, greedy, in an order that rotates. Recorded: tokens/s and time to
first token (from samples.jsonl), the thread counts the auto run's steps ran on, the other
load while each ran, and whether the greedy texts agree. Results go to
bench/results/decode_busy[_<name>].json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import child_env, tree_load, write_result
from bench.decode_vs_hf import PROMPT, SIZES, TRAIN, llmlab_sample, run

def start_load(kind: str, tmp: Path, env: dict) -> subprocess.Popen | None:
    if kind == "none":
        return None
    if kind == "spin":
        code = "while True: pass"
    else:  # a default training, again and again, in its own directory
        code = ("import subprocess, sys\nwhile True:\n    subprocess.run([sys.executable, '-m', 'llmlab', 'train', "
                f"'logger=none', 'train.steps=300', 'hydra.run.dir={tmp / 'load'}'], "
                "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)")
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=tmp, start_new_session=True)


def stop_load(proc: subprocess.Popen | None) -> None:
    if proc is not None:
        import signal
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1.7M,22.9M")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--steps", type=int, default=100, help="training steps of each model")
    ap.add_argument("--load", default="train", choices=["train", "spin", "none"])
    ap.add_argument("--data", default=None, help="a text file to train on (default: the stdlib corpus)")
    ap.add_argument("--keep", default=None, help="keep the trained runs here (and reuse those it holds)")
    ap.add_argument("--name", default=None, help="results file: bench/results/decode_busy[_NAME].json")
    args = ap.parse_args()
    import torch

    threads = torch.get_num_threads()
    sampled = argparse.Namespace(tokens=args.tokens, device="cpu", precision="fp32")  # what `llmlab_sample` reads
    repo = Path(__file__).resolve().parent.parent
    env = child_env(LLMLAB_CACHE=os.environ.get("LLMLAB_CACHE", str(repo / ".cache" / "llmlab")))
    data = []
    if args.data:
        path = Path(args.data).expanduser().resolve()
        if not path.is_file():
            sys.exit(f"--data: {path} not found")
        data = ["data=text", f"data.paths=[{path}]"]
    result: dict = {"prompt": PROMPT, "tokens": args.tokens, "rounds": args.rounds, "load": args.load,
                    "all_threads": threads, "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="llmlab-bench-busy-") as tmp_name:
        tmp = Path(args.keep).resolve() if args.keep else Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        for name in args.sizes.split(","):
            if name not in SIZES:
                sys.exit(f"--sizes: unknown {name!r}; allowed: {', '.join(SIZES)}")
            d, layers, heads = SIZES[name]
            if not (tmp / name / "summary.json").is_file():
                run([sys.executable, "-m", "llmlab", "train", f"hydra.run.dir={tmp / name}", *TRAIN, "model=llama",
                     "tokenizer=byte", f"model.d_model={d}", f"model.n_layers={layers}", f"model.n_heads={heads}",
                     f"train.steps={args.steps}", *data], env, tmp)
        load = start_load(args.load, tmp, env)
        try:
            time.sleep(5 if load is not None else 0)  # the load under way before the first timing
            for name in args.sizes.split(","):
                modes = {"auto": "auto", "all": str(threads)}
                runs: dict[str, list[dict]] = {m: [] for m in modes}
                order = list(modes)
                for i in range(args.rounds):
                    for m in order[i % 2:] + order[:i % 2]:
                        with tree_load() as seen:
                            runs[m].append(llmlab_sample(tmp / name, tmp / f"{name}-busy{i}-{m}", env, sampled,
                                                         ["temperature=0", f"threads={modes[m]}"]))
                        runs[m][-1]["other_load"] = seen["other_load"]
                        print(f"{name} round {i + 1} threads={modes[m]}: {runs[m][-1]['tokens_per_s']:,.1f} tokens/s"
                              f" (other load {seen['other_load'] or 0:.0%}; steps on {runs[m][-1]['threads']})",
                              flush=True)
                row = {m: {"tokens_per_s": [r["tokens_per_s"] for r in rs],
                           "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in rs),
                           "first_token_ms_median": 1000 * statistics.median(r["first_token_s"] for r in rs),
                           "threads": [r["threads"] for r in rs],
                           "other_load": [None if r["other_load"] is None else round(r["other_load"], 3) for r in rs]}
                       for m, rs in runs.items()}
                row["identical_greedy_text"] = len({r["text"] for rs in runs.values() for r in rs}) == 1
                row["auto_vs_all"] = row["auto"]["tokens_per_s_median"] / row["all"]["tokens_per_s_median"]
                result["sizes"][name] = row
        finally:
            stop_load(load)
    out = write_result("decode_busy" + (f"_{args.name}" if args.name else ""), result)
    for name, row in result["sizes"].items():
        print(f"{name} beside load={args.load}: threads=auto {row['auto']['tokens_per_s_median']:,.0f} tokens/s, "
              f"threads={threads} {row['all']['tokens_per_s_median']:,.0f} ({row['auto_vs_all']:.2f}x); identical "
              f"greedy text: {row['identical_greedy_text']}")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
