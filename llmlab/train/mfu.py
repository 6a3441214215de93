"""Model FLOPs utilisation: achieved model FLOPs per second over the device's peak."""

from __future__ import annotations

import os
import re
import time
from functools import lru_cache

import torch

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


def _probe(device_type: str, dtype: torch.dtype, n: int, reps: int, rounds: int = 3) -> float:
    """The best FLOP/s of ``rounds`` x ``reps`` n x n matmuls after warm-up: the peak this
    device reaches. Rounds a little apart, so a moment of contention does not set the peak."""
    device = torch.device(device_type)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for r in range(rounds):
        if r:
            time.sleep(0.05)
        for i in range(reps + 3):
            if device_type == "mps":
                torch.mps.synchronize()
            t = time.perf_counter()
            a @ b
            if device_type == "mps":
                torch.mps.synchronize()
            if i >= 3:
                best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


@lru_cache(maxsize=None)
def measured_matmul_peak(device_type: str, dtype: torch.dtype = torch.float32, n: int = 1024, reps: int = 10) -> float:
    """The reference peak of a CPU (or an unknown GPU): the best of a few rounds of n x n
    matmuls, measured once per machine, thread count and torch build, and kept in the llmlab
    cache (``peak.json``; delete it to measure again) so every run's MFU has the same
    denominator."""
    import json
    import platform

    from llmlab.data.prepare import cache_root

    key = "|".join([device_type, str(dtype), str(n), platform.machine(), platform.processor() or platform.node(),
                    str(os.cpu_count()), str(torch.get_num_threads()), torch.__version__])
    path = cache_root() / "peak.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return float(known[key])
    peak = _probe(device_type, dtype, n, reps)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".peak.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**known, key: peak}, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs a probe per run
    return peak


def device_peak_flops(device: torch.device, precision: str) -> tuple[float, str]:
    """The peak used for MFU and where it came from."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = gpu_peak(name, precision)
        if peak is not None:
            return peak, f"{name} data sheet"
        return measured_matmul_peak("cuda", torch.bfloat16 if precision == "bf16" else torch.float32, 4096), \
            f"{name} measured matmul"
    if device.type == "mps":
        brand, cores = _apple_chip()
        peak = apple_gpu_peak(brand, cores)
        if peak is not None and precision == "fp32":
            return peak, f"{brand} {cores}-core GPU, fp32 estimate"
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    return measured_matmul_peak(device.type, dtype), f"{device.type} measured matmul"
