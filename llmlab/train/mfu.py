"""Model FLOPs utilisation: achieved model FLOPs per second over the device's peak."""

from __future__ import annotations

import os
import re
import time
from functools import lru_cache
from pathlib import Path

import torch

from llmlab.files import read_kept, what_became, write_kept
from llmlab.perf import contended, other_load, rate, snapshot

# Dense (no sparsity) bf16 tensor-core peaks from the vendors' data sheets, FLOP/s.
GPU_PEAK_BF16 = {
    "H200": 989e12,
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,  # the SXM part reports itself as "NVIDIA H100 80GB HBM3"
    "GH200": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L40": 181e12,
    "L4": 121e12,
    "A10": 125e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
    "V100": 125e12,  # fp16
    "T4": 65e12,  # fp16
}


def gpu_peak(name: str, precision: str) -> float | None:
    for key in sorted(GPU_PEAK_BF16, key=len, reverse=True):  # most specific name first
        if key in name:
            peak = GPU_PEAK_BF16[key]
            return peak if precision == "bf16" else peak / 2  # fp32 runs as TF32, half rate
    return None


# Apple-silicon GPUs: fp32 FLOP/s per GPU core (128 ALUs x 2 FLOP x the GPU clock). M1 and M2
# follow Apple's published totals (8-core M1 2.6 TFLOP/s, 10-core M2 3.6); M3 and M4 are
# estimates from their reported GPU clocks. The core count comes from system_profiler; MPS
# trains in fp32. Where the chip is not recognised, a measured matmul peak is used instead.
APPLE_GFLOPS_PER_CORE = {"M1": 327e9, "M2": 358e9, "M3": 410e9, "M4": 430e9}


def apple_gpu_peak(brand: str, gpu_cores: int | None) -> float | None:
    """``brand``: e.g. "Apple M2 Pro"; None when the chip or its core count is unknown."""
    m = re.match(r"Apple (M\d)", brand or "")
    if not m or not gpu_cores or m.group(1) not in APPLE_GFLOPS_PER_CORE:
        return None
    return APPLE_GFLOPS_PER_CORE[m.group(1)] * gpu_cores


@lru_cache(maxsize=None)  # asked once a process: it runs system_profiler
def _apple_chip() -> tuple[str, int | None]:
    import subprocess
    try:
        brand = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                               timeout=5).stdout.strip()
        shown = subprocess.run(["system_profiler", "SPDisplaysDataType"], capture_output=True, text=True,
                               timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return "", None
    cores = re.search(r"Total Number of Cores:\s*(\d+)", shown)
    return brand, int(cores.group(1)) if cores else None


def _probe(device_type: str, dtype: torch.dtype, n: int, reps: int, rounds: int = 3) -> tuple[float, float, float | None]:
    """n x n matmuls after warm-up, in ``rounds`` rounds a little apart: the FLOP/s of the
    fastest one (the peak this device reaches), the spread of the rounds' best, and the other
    load on the machine meanwhile (`llmlab.perf`)."""
    device = torch.device(device_type)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    bests = []
    start = snapshot()
    for r in range(rounds):
        if r:
            time.sleep(0.05)
        best = float("inf")
        for i in range(reps + 3):
            if device_type == "mps":
                torch.mps.synchronize()
            t = time.perf_counter()
            a @ b
            if device_type == "mps":
                torch.mps.synchronize()
            if i >= 3:
                best = min(best, time.perf_counter() - t)
        bests.append(2 * n**3 / best)
    return max(bests), rate(bests, None).spread, other_load(start, snapshot())


def _peak_key(device_type: str, dtype: torch.dtype, n: int) -> str:
    """The cache key: a peak belongs to one machine, thread count and torch build."""
    import platform
    return "|".join([device_type, str(dtype), str(n), platform.machine(), platform.processor() or platform.node(),
                     str(os.cpu_count()), str(torch.get_num_threads()), torch.__version__])


def _peak_file() -> Path:
    from llmlab.data.prepare import cache_root
    return cache_root() / "peak.json"


# no device's matmul reaches 1e17 FLOP/s (the largest GPUs' dense peaks are near 1e15): a kept
# peak above it was edited by hand, and would make every run's MFU read 0%
MAX_PEAK = 1e17


def _usable_peak(entry) -> bool:
    flops = entry.get("flops") if isinstance(entry, dict) else None
    return isinstance(flops, (int, float)) and not isinstance(flops, bool) and 0 < flops < MAX_PEAK


def _cached_peaks() -> tuple[dict, str | None]:
    """The peaks kept in ``peak.json`` and a line on what in it could not be used (a damaged
    or hand-edited file), or None."""
    return read_kept(_peak_file(), "the matmul peak", _usable_peak, f"an object with a positive flops below {MAX_PEAK:.0e}")


def _store_peak(key: str, entry: dict) -> bool:
    return write_kept(_peak_file(), {**_cached_peaks()[0], key: entry})


# A probe is kept only when it was clean: little other load and rounds that agree.
PROBE_SPREAD_LIMIT = 0.10


@lru_cache(maxsize=None)
def measured_matmul_peak(device_type: str, dtype: torch.dtype = torch.float32, n: int = 1024,
                         reps: int = 5) -> tuple[float, str]:
    """The reference peak of a CPU (or an unknown GPU), and a note on how it was taken.

    The best of 3 rounds of 5 n x n matmuls (5 rounds of 10 found the same peak within 1%, in
    2.5x the time, which every run on a busy machine paid), kept in the llmlab cache
    (``peak.json``) per machine, thread count and torch build, so every run's MFU has the same
    denominator. A
    probe taken under contention (other load above `llmlab.perf.CONTENDED`, or rounds that
    disagree by more than 10%) serves this process only and is not kept: the next run
    measures again. A run that reaches more than the peak raises it (`raise_peak`)."""
    key = _peak_key(device_type, dtype, n)
    known, damaged = _cached_peaks()  # a damaged or hand-edited peak.json is said, never passed over
    left = f"; {damaged} (the file is left as it is)" if damaged else ""  # where nothing is written
    if key in known:
        return float(known[key]["flops"]), "cached" + left
    peak, spread, load = _probe(device_type, dtype, n, reps)
    if contended(load) or spread > PROBE_SPREAD_LIMIT:
        shown = "unknown" if load is None else f"{load:.0%}"
        return peak, f"measured under contention (other load {shown}, spread ±{spread:.0%}); not kept" + left
    written = _store_peak(key, {"flops": peak, "spread": round(spread, 4), "other_load": load, "source": "probe"})
    return peak, "measured now" + (f"; {what_became(damaged, written)}" if damaged else "")


def raise_peak(device_type: str, dtype: torch.dtype, achieved: float, n: int = 1024, reps: int = 5) -> float:
    """A run reached ``achieved`` FLOP/s, more than the reference peak: that peak was measured
    too low (under contention, most likely). Measure again, and keep the highest of the old
    peak, the new probe and what the run reached (a rate a model reached is a lower bound of
    the device's peak), so that MFU stays at or under 100%."""
    key = _peak_key(device_type, dtype, n)
    old, _ = measured_matmul_peak(device_type, dtype, n, reps)
    probe, spread, load = _probe(device_type, dtype, n, reps)
    new = max(old, probe, achieved)
    source = "reached by a run" if achieved > max(old, probe) else "probe"
    _store_peak(key, {"flops": new, "spread": round(spread, 4), "other_load": load, "source": source})
    measured_matmul_peak.cache_clear()
    return new


def device_peak_flops(device: torch.device, precision: str) -> tuple[float, str]:
    """The peak used for MFU and where it came from."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = gpu_peak(name, precision)
        if peak is not None:
            return peak, f"{name} data sheet"
        peak, note = measured_matmul_peak("cuda", torch.bfloat16 if precision == "bf16" else torch.float32, 4096)
        return peak, f"{name} measured matmul, {note}"
    if device.type == "mps":
        brand, cores = _apple_chip()
        peak = apple_gpu_peak(brand, cores)
        if peak is not None and precision == "fp32":
            return peak, f"{brand} {cores}-core GPU, fp32 estimate"
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    peak, note = measured_matmul_peak(device.type, dtype)
    return peak, f"{device.type} measured matmul, {note}"


def raise_device_peak(device: torch.device, precision: str, achieved: float) -> float | None:
    """`raise_peak` for the measured peak `device_peak_flops` chose; None where the peak is a
    data sheet's or an estimate (more than it means the FLOPs count is wrong, not the peak)."""
    if device.type == "cuda" and gpu_peak(torch.cuda.get_device_name(device), precision) is not None:
        return None
    if device.type == "mps" and precision == "fp32" and apple_gpu_peak(*_apple_chip()) is not None:
        return None
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    return raise_peak(device.type, dtype, achieved, n=4096 if device.type == "cuda" else 1024)


class Peak:
    """The reference peak a run's MFU is a share of: the whole job's (every rank's device), and
    where it came from (`device_peak_flops`)."""

    def __init__(self, device: torch.device, precision: str, dist) -> None:
        self.device, self.precision, self.dist = device, precision, dist
        peak, self.source = device_peak_flops(device, precision)
        self.flops = peak * dist.world_size
        self.warned = False

    def exceeded(self, achieved: float) -> None:
        """The run reaches more FLOP/s than the peak. A measured peak was taken too low (under
        contention): measure again and raise it, so MFU stays at or under 100%. A data sheet's
        peak is not raised: then the FLOPs count is wrong, and one warning says so."""
        from llmlab import console
        from llmlab.data.prepare import cache_root

        world = self.dist.world_size
        raised = raise_device_peak(self.device, self.precision, achieved / world)
        if raised is not None:
            old, self.flops = self.flops, raised * world
            self.source = "re-measured" if raised * world > achieved else "raised to what this run reached"
            console.err.print(f"MFU: the reference peak ({old / 1e9:,.1f} GFLOP/s) was below what this run reaches "
                              f"({achieved / 1e9:,.1f}); it was measured under load. Now {self.flops / 1e9:,.1f} "
                              f"GFLOP/s ({self.source}), kept in {cache_root() / 'peak.json'}", style="yellow")
        elif not self.warned and self.dist.is_main:
            self.warned = True
            console.err.print(f"MFU is above 100%: this run reaches more than the reference peak "
                              f"({self.flops / 1e9:,.0f} GFLOP/s, {self.source})", style="yellow")
