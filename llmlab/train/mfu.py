"""Model FLOPs utilisation: achieved model FLOPs per second over the device's peak."""

from __future__ import annotations

import statistics
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


@lru_cache(maxsize=None)
def measured_matmul_peak(device_type: str, dtype: torch.dtype = torch.float32, n: int = 1024, reps: int = 10) -> float:
    """Median FLOP/s of an n x n matmul on this device: the CPU (and MPS) reference peak."""
    device = torch.device(device_type)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    times = []
    for i in range(reps + 3):
        if device_type == "mps":
            torch.mps.synchronize()
        t = time.perf_counter()
        a @ b
        if device_type == "mps":
            torch.mps.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times)


def device_peak_flops(device: torch.device, precision: str) -> tuple[float, str]:
    """The peak used for MFU and where it came from."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = gpu_peak(name, precision)
        if peak is not None:
            return peak, f"{name} data sheet"
        return measured_matmul_peak("cuda", torch.bfloat16 if precision == "bf16" else torch.float32, 4096), \
            f"{name} measured matmul"
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    return measured_matmul_peak(device.type, dtype), f"{device.type} measured matmul"
