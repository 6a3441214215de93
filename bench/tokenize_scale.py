"""`llmlab tokenize` past the toy corpus: a synthetic corpus of many files, made from the stdlib
text with deterministic variations in a temporary directory (deleted afterwards), tokenized
with ``data.workers=1`` and ``=2``.

    python -m bench.tokenize_scale                          # 200 MB, 1 GB, 2 GB
    python -m bench.tokenize_scale --sizes 200 --train-speed --default-ref ../old
    python -m bench.tokenize_scale --corpus stdlib --sizes 20,120,2000 --keep bench/results/tokenize_scale.json

For each size: wall time, MB/s of reading, tokenizer training and encoding (each apart), peak
RSS of the whole process tree and of its largest process (every process's RSS, sampled every
0.1 s), the speed-up from 1 to 2 workers (at the
sizes in ``--both-workers``), and, with ``--train-speed``, training tokens/s on a store of many
shards against one shard (interleaved, medians). ``--default-ref`` also times the default
``llmlab tokenize`` (the stdlib corpus) in another checkout, in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

from bench.common import tree_load, write_result
from llmlab import perf

REPO = Path(__file__).resolve().parent.parent
FILE_BYTES = 4 << 20  # each synthetic file holds about this much text
WORDS = ("self", "return", "None", "value", "name", "data", "result", "path", "args", "line")


def make_corpus(root: Path, megabytes: int) -> int:
    """Files of about FILE_BYTES from the stdlib sources; file k renames a few common words with
    suffixes from k, so files differ and the vocabulary grows with the corpus. Returns bytes."""
    sources = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in sources]
    root.mkdir(parents=True)
    total, k, i = 0, 0, 0
    while total < megabytes * 1_000_000:
        parts, size = [], 0
        while size < FILE_BYTES:
            text = texts[i % len(texts)]
            for j, w in enumerate(WORDS):
                text = text.replace(f" {w}", f" {w}{(k * 7 + j) % 23}")
            parts.append(text)
            size += len(text.encode())
            i += 1
        data = "\n".join(parts).encode()
        (root / f"part-{k:05d}.txt").write_bytes(data)
        total += len(data)
        k += 1
    return total


def stdlib_sources(tests: bool) -> list[tuple[Path, str]]:
    """(path under the stdlib, text) of the stdlib's ``*.py`` files, its tests too if ``tests``."""
    std = Path(sysconfig.get_paths()["stdlib"])
    sources = []
    for p in sorted(std.rglob("*.py")):
        if "site-packages" in p.parts or not tests and ("test" in p.parts or "tests" in p.parts):
            continue
        try:
            sources.append((p.relative_to(std), p.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, OSError):
            continue
    return sources


def write_copies(root: Path, megabytes: int, sources: list[tuple[Path, str]], edit) -> int:
    """Copies of ``sources`` under ``root/copyK/`` until ``megabytes``, copy k's texts changed
    by ``edit(k, text)`` (copy 0 left as it is). Returns bytes."""
    total, k = 0, 0
    while total < megabytes * 1_000_000:
        for rel, text in sources:
            out = root / f"copy{k:03d}" / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            data = (edit(k, text) if k else text).encode()
            out.write_bytes(data)
            total += len(data)
            if total >= megabytes * 1_000_000:
                break
        k += 1
    return total


def make_stdlib_corpus(root: Path, megabytes: int) -> int:
    """Copies of the stdlib's own ``*.py`` files (tests left out), in many small files as a code
    base has them: copy k renames a few common words with a suffix from k. Returns bytes."""
    def edit(k: int, text: str) -> str:
        for j, w in enumerate(WORDS[:5]):
            text = text.replace(f" {w}", f" {w}{k}_{j}")
        return text
    return write_copies(root, megabytes, stdlib_sources(tests=False), edit)


SELF_NAMES = ("self", "this", "me", "obj", "inst", "slf", "s")


def make_renamed_corpus(root: Path, megabytes: int) -> int:
    """Copies of the whole stdlib (its tests too), copy k with ``self`` renamed one of seven
    ways and numbered by k (``this3``), so the vocabulary keeps growing with the corpus: the
    corpus on which tokenize memory is held to its targets. Returns bytes."""
    return write_copies(root, megabytes, stdlib_sources(tests=True),
                        lambda k, text: text.replace("self", f"{SELF_NAMES[k % 7]}{k // 7 or ''}"))


CORPORA = {"synthetic": (make_corpus, "*.txt"), "stdlib": (make_stdlib_corpus, "**/*.py"),
           "renamed": (make_renamed_corpus, "**/*.py")}


def tree_rss(pid: int) -> tuple[int, int]:
    """Resident bytes of ``pid`` and all its descendants, from /proc: (the whole tree, its
    largest process)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    total, largest, todo = 0, 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                    total, largest = total + rss, max(largest, rss)
        except OSError:
            pass
    return total, largest


LOADS: list[float] = []


def run_watched(cmd: list[str], cwd: Path, env: dict) -> tuple[float, tuple[int, int], subprocess.CompletedProcess]:
    """(wall seconds, (peak RSS of the whole tree, of its largest process) in bytes, sampled
    every 0.1 s, the finished process); the process's ``other_load`` (the machine's share used
    by anything but it and its workers) goes in ``LOADS``."""
    peak = [0, 0]
    with tree_load() as load:  # the tree's CPU is not other load
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def watch():
            while proc.poll() is None:
                tree, largest = tree_rss(proc.pid)
                peak[0], peak[1] = max(peak[0], tree), max(peak[1], largest)
                time.sleep(0.1)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        out, err = proc.communicate()
        watcher.join()
        wall = time.perf_counter() - t
    if load["other_load"] is not None:
        LOADS.append(load["other_load"])
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if proc.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err[-2000:]}")
    return wall, (peak[0], peak[1]), done


def read_speed(corpus_dir: Path, pattern: str = "*.txt") -> float:
    """MB/s of streaming the corpus alone (both splits), in this process."""
    from llmlab.data.corpus import CORPUS

    corpus = CORPUS.build(CORPUS.config({"kind": "text", "paths": [str(corpus_dir / pattern)]}, "data"))
    t, n = time.perf_counter(), 0
    for split in ("train", "val"):
        n += sum(d.nbytes for d in corpus.stream(split))
    return n / (time.perf_counter() - t) / 1e6


def tokenize(corpus_dir: Path, cache: Path, workers: int | None, env: dict, pattern: str = "*.txt") -> dict:
    """One `llmlab tokenize` of the corpus; ``workers`` None: the default (every core)."""
    cmd = [sys.executable, "-m", "llmlab", "tokenize", "data=text", f"data.paths=[{corpus_dir}/{pattern}]",
           *([f"data.workers={workers}"] if workers is not None else []), f"cache_dir={cache}", "hydra.run.dir=.",
           "hydra.output_subdir=null"]
    wall, (peak, largest), _ = run_watched(cmd, cache.parent, env)
    load = LOADS[-1] if LOADS else None
    meta = json.loads(next(cache.glob("*/meta.json")).read_text())
    t = meta["timings"]
    mb = (meta["train"]["bytes"] + meta["val"]["bytes"]) / 1e6
    sample = meta.get("tokenizer_sample") or {}
    encode_s = t["train_encode_s"] + t["val_encode_s"]
    return {"workers": workers or f"default ({os.cpu_count()})", "wall_s": round(wall, 1),
            "peak_rss_gb": round(peak / 1e9, 3), "largest_process_gb": round(largest / 1e9, 3),
            "tokenizer_s": t["tokenizer_s"], "tokenizer_sample_mb": round(sample.get("bytes", 0) / 1e6, 1),
            "tokenizer_mb_s": round(sample.get("read", 0) / 1e6 / max(1e-9, t["tokenizer_s"]), 2),
            "encode_s": round(encode_s, 1), "encode_mb_s": round(mb / encode_s, 2),
            "encode_mtok_s": round((meta["train"]["tokens"] + meta["val"]["tokens"]) / encode_s / 1e6, 3),
            "reader_s_in_encode": round(t["train_read_s"] + t["val_read_s"], 1),
            "main_process_cpu_s_in_encode": round(t["train_main_cpu_s"] + t["val_main_cpu_s"], 1),
            "other_load": None if load is None else round(load, 3), "contended": perf.contended(load),
            "shards": len(meta["train"]["shards"]) + len(meta["val"]["shards"]),
            "tokens": meta["train"]["tokens"] + meta["val"]["tokens"], "mb": round(mb, 1)}


def train_speed(corpus_dir: Path, tmp: Path, env: dict, repeats: int) -> dict:
    """tokens/s of a short tiny-model run on many shards against one shard (same tokens)."""
    runs: dict[str, list[float]] = {"many_shards": [], "one_shard": []}
    loads: dict[str, list[float | None]] = {"many_shards": [], "one_shard": []}
    for r in range(repeats):
        for name, shard_tokens in (("many_shards", 2_000_000), ("one_shard", 10**12)):
            run = tmp / f"train-{name}-{r}"
            cmd = [sys.executable, "-m", "llmlab", "train", "data=text", f"data.paths=[{corpus_dir}/*.txt]",
                   f"data.shard_tokens={shard_tokens}", f"cache_dir={tmp / ('cache-' + name)}", "logger=none",
                   "train.steps=60", "train.eval_every=0", "train.ckpt_every=0", "train.sample_tokens=0",
                   "model.d_model=64", "model.n_layers=2", f"hydra.run.dir={run}"]
            run_watched(cmd, tmp, env)
            summary = json.loads((run / "summary.json").read_text())
            runs[name].append(summary["tokens_per_s"])
            loads[name].append(summary.get("tokens_per_s_other_load"))  # the machine's other load while timed
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {"tokens_per_s": med, "runs": runs, "other_load": loads, "ratio": round(med["many_shards"] / med["one_shard"], 3)}


def default_tokenize(trees: dict[str, Path], env: dict, repeats: int) -> dict:
    """The default `llmlab tokenize` (stdlib corpus, fresh cache), interleaved over trees."""
    times: dict[str, list[float]] = {k: [] for k in trees}
    for _ in range(repeats):
        for name, tree in trees.items():
            with tempfile.TemporaryDirectory(prefix="llmlab-bench-default-") as d:
                cmd = [sys.executable, "-m", "llmlab", "tokenize", f"cache_dir={d}/cache", "hydra.run.dir=.",
                       "hydra.output_subdir=null"]
                wall, _, _ = run_watched(cmd, Path(d), {**env, "PYTHONPATH": str(tree)})
                times[name].append(round(wall, 2))
    return {name: {"median_s": statistics.median(t), "runs_s": t} for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="200,1000,2000", help="corpus sizes in MB")
    ap.add_argument("--corpus", default="synthetic", help="which corpora, comma-separated: synthetic (4 MB files of "
                    "stdlib text with variations) and/or stdlib (copies of the stdlib's .py files, many small files; "
                    "tokenized with default settings)")
    ap.add_argument("--both-workers", default="200", help="sizes (MB) also run with data.workers=1")
    ap.add_argument("--train-speed", action="store_true", help="training tokens/s, many shards vs one")
    ap.add_argument("--default-ref", type=Path, help="another checkout: time its default tokenize too")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tmp", default=None, help="where the corpus goes (default: the system temp dir)")
    ap.add_argument("--train-speed-only", action="store_true",
                    help="only the training speed, on a corpus of the smallest size (use with --keep)")
    ap.add_argument("--keep", type=Path, help="a previous result file: its sizes (and training speed) not measured "
                                               "again here are kept, and its commands listed")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "TERM": "dumb"}
    command = "python -m bench.tokenize_scale " + " ".join(sys.argv[1:])
    result: dict = {"sizes": {}, "commands": [command]}
    if args.keep:
        old = json.loads(args.keep.read_text())
        result = {"sizes": old.get("sizes", {}), "commands": [*old.get("commands", []), command],
                  **{k: old[k] for k in old if k.startswith("sizes_") or k in ("train_speed", "default_tokenize")}}
    both = {int(s) for s in args.both_workers.split(",") if s}
    kinds = [k for k in args.corpus.split(",") if k]
    unknown = sorted(set(kinds) - set(CORPORA))
    if unknown:
        raise SystemExit(f"--corpus: unknown {', '.join(unknown)}; allowed: {', '.join(CORPORA)}")
    with tempfile.TemporaryDirectory(prefix="llmlab-bench-scale-", dir=args.tmp) as tmp:
        tmp = Path(tmp)
        for kind in kinds:
            make, pattern = CORPORA[kind]
            sizes = result.setdefault("sizes" if kind == "synthetic" else f"sizes_{kind}", {})
            for mb in [int(s) for s in args.sizes.split(",")]:
                corpus = tmp / f"corpus-{kind}-{mb}"
                t = time.perf_counter()
                nbytes = make(corpus, mb)
                entry = {"corpus_mb": round(nbytes / 1e6, 1), "files": sum(1 for _ in corpus.glob(pattern)),
                         "made_in_s": round(time.perf_counter() - t, 1),
                         "read_mb_s": round(read_speed(corpus, pattern), 1)}
                if args.train_speed_only:
                    result["train_speed"] = train_speed(corpus, tmp, env, args.repeats)
                    print(f"training tokens/s: {result['train_speed']}", flush=True)
                    shutil.rmtree(corpus, ignore_errors=True)
                    break
                # the stdlib corpus runs with default settings (data.workers: every core)
                runs = [None] if kind != "synthetic" else ([1, 2] if mb in both else [2])
                for workers in runs:
                    cache = tmp / f"cache-{kind}-{mb}-{workers}"
                    name = f"workers_{workers}" if workers else "defaults"
                    entry[name] = tokenize(corpus, cache, workers, env, pattern)
                    print(f"{kind} {mb} MB, {name}: {entry[name]}", flush=True)
                    shutil.rmtree(cache, ignore_errors=True)
                if "workers_1" in entry:
                    entry["encode_speedup_1_to_2"] = round(entry["workers_1"]["encode_s"] / entry["workers_2"]["encode_s"], 2)
                sizes[str(mb)] = entry
                write_result("tokenize_scale", {**result, "partial": True})  # a killed run keeps what it measured
                if args.train_speed and kind == "synthetic" and mb == min(int(s) for s in args.sizes.split(",")):
                    result["train_speed"] = train_speed(corpus, tmp, env, args.repeats)
                    print(f"training tokens/s: {result['train_speed']}", flush=True)
                shutil.rmtree(corpus, ignore_errors=True)
    if not args.train_speed_only:
        trees = {"this": REPO, **({"ref": args.default_ref.resolve()} if args.default_ref else {})}
        result["default_tokenize"] = default_tokenize(trees, env, args.repeats)
        print(f"default tokenize: {result['default_tokenize']}")
    write_result("tokenize_scale", result)


if __name__ == "__main__":
    main()
