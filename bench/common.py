"""Shared bits of the benchmarks: medians, machine facts, result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent


def child_env(tree: Path = REPO, **extra: str) -> dict:
    """The environment of an ``llmlab`` process a benchmark starts: this one's, with ``tree``
    (this checkout, or another one timed beside it) first on PYTHONPATH (before what was
    there, such as a folder of packages put on it by hand), and ``extra`` on top."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])),
            **extra}


def cpu_timed(bench: str, words: list[str], cwd: Path, env: dict) -> dict:
    """``llmlab <words>`` in a process of its own: its own CPU seconds (user + system, from
    its rusage, so runs timed at once do not share them) and its wall seconds. A failure stops
    the benchmark ``bench`` with the end of llmlab's stderr."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "llmlab", *words], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"bench.{bench}: llmlab {' '.join(words)} failed:\n{err[-2000:]}")
    return {"cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "wall_s": round(wall, 2)}


def llmlab(bench: str, words: list[str], cwd: Path, env: dict, quiet: bool = False) -> None:
    """``llmlab <words>`` for the benchmark ``bench`` (``quiet``: its standard output dropped);
    a refusal (llmlab's own line is printed above) stops the benchmark in one line, not in a
    CalledProcessError traceback."""
    done = subprocess.run([sys.executable, "-m", "llmlab", *words], cwd=cwd, env=env,
                          stdout=subprocess.DEVNULL if quiet else None)
    if done.returncode:
        sys.exit(f"bench.{bench}: llmlab {' '.join(words)} failed (exit {done.returncode})")


def _children_cpu() -> float:
    """CPU seconds of this process's finished (waited-for) descendants, their workers included."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def tree_load() -> Iterator[dict]:
    """The machine's share of CPU time that work other than this process and the children it
    waits for used while the block ran (`llmlab.perf.other_load`, with the children's CPU
    time taken out), in the yielded dict's ``"other_load"`` once the block ends (None where
    ``/proc/stat`` is unreadable)."""
    from llmlab import perf

    out: dict = {"other_load": None}
    start, children0 = perf.snapshot(), _children_cpu()
    yield out
    end, children = perf.snapshot(), _children_cpu() - children0
    if start.busy is not None and end.busy is not None and end.wall > start.wall:
        others = end.busy - start.busy - children - (end.own - start.own)
        out["other_load"] = min(1.0, max(0.0, others / ((end.wall - start.wall) * end.cpus)))


def machine() -> dict:
    """The machine a result came from: its CPU's model, bf16 unit (amx_bf16, avx512_bf16 or
    None) and the instruction set torch dispatches to (AVX2, AVX512)."""
    import torch

    from llmlab.train.device import cpu_bf16_unit
    return {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "machine": platform.machine(), "cpu": cpu_name(),
            "cpu_bf16_unit": cpu_bf16_unit(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def cpu_fields() -> dict[str, str] | None:
    """The first processor's lines of /proc/cpuinfo (they say it for every core); None where
    the system has no such file."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in info.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def native_bf16() -> bool:
    """Whether the CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX), where
    ``precision=bf16`` makes the matmuls cheaper; elsewhere it is emulated, and slower."""
    fields = cpu_fields() or {}
    return bool({"avx512_bf16", "amx_bf16"} & set(fields.get("flags", "").split()))


def cpu_name() -> str | None:
    """The CPU's model and its widest vector instructions, beside each result: the shared
    machine is not always the same host, and CPU timings differ between hosts by more than
    their noise. None where the system does not say."""
    fields = cpu_fields()
    if fields is None:
        return platform.processor() or None
    model, flags = fields.get("model name"), set(fields.get("flags", "").split())
    extra = [name for name in ("avx512f", "avx512_bf16", "amx_tile") if name in flags] or (["avx2"] if "avx2" in flags else [])
    return " ".join(filter(None, [model, "(" + ", ".join(extra) + ")" if extra else None])) or None


def median_of(fn, repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def write_result(name: str, result: dict) -> Path:
    from llmlab.files import atomic_write_text

    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    result = {"benchmark": name, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine(), **result}
    atomic_write_text(path, json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return path


def train_config(overrides: list[str]) -> dict:
    """``llmlab train``'s composed settings for ``overrides``, resolved, as the CLI composes them
    (its schema and registered kinds first)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from llmlab.cli import register_parts
    from llmlab.paths import conf_dir
    register_parts("train")
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return OmegaConf.to_container(compose("train", overrides), resolve=True)
