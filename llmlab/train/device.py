"""Device and precision choice. torch is imported where it is used, so the settings that
name a device or precision are checked without it."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from llmlab.errors import ConfigError

if TYPE_CHECKING:
    import torch

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def resolve_device(name: str) -> torch.device:
    """``auto`` picks cuda > mps > cpu; a named device must exist."""
    import torch

    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device: unknown device '{name}'; allowed: auto, cpu, cuda, cuda:N, mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda was asked for but torch sees no CUDA GPU; use device=auto or device=cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device: mps was asked for but this torch has no MPS backend; use device=auto")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"device: '{name}' is not supported; allowed: auto, cpu, cuda, cuda:N, mps")
    return device


def check_device(name: str) -> None:
    """The ``device`` setting checked as a setting: ``auto`` and ``cpu`` always exist, and
    need no torch (so a mistake elsewhere in the settings is said before torch loads); any
    other name is checked by `resolve_device`."""
    if name not in ("auto", "cpu"):
        resolve_device(name)


# glibc's malloc serves a block above its mmap threshold (128 KiB, raised as such blocks are
# freed, up to 32 MiB) with fresh pages from the kernel, and gives freed memory at its heap's top
# back. A training step frees and allocates the same activations every step, so on the CPU it
# paid a page fault and the zeroing of every page of them every step: about 45,000 faults a
# step for the default run, 10 s of system time in 60 steps (1.6 s kept). Blocks up to this
# size now come from the heap, and freed memory stays for reuse.
KEEP_FREED_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed memory for reuse (``mallopt``: M_MMAP_THRESHOLD and
    M_TRIM_THRESHOLD at `KEEP_FREED_BYTES`), for the rest of the process. The process then
    holds on to its peak of host memory instead of returning it between steps. True where it
    took effect; without glibc (macOS, Windows, musl) nothing changes and it returns False."""
    import ctypes
    import os

    try:
        if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
            return False
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError, ValueError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's <malloc.h>
    return bool(mallopt(m_mmap_threshold, KEEP_FREED_BYTES)) & bool(mallopt(m_trim_threshold, KEEP_FREED_BYTES))


# the CPU flags of hardware bf16 multiplication (Linux's /proc/cpuinfo names): AMX's tiles, or
# AVX-512 BF16's dot products; without either, a bf16 matmul on the CPU is many times slower
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
CPU_BF16_ENV = "LLMLAB_CPU_BF16"  # 0 or 1: overrides the detection (1 on a CPU without the units is slow)


def cpu_bf16_unit(cpuinfo: str | None = None) -> str | None:
    """The flag by which this CPU multiplies bf16 in hardware (`CPU_BF16_FLAGS`), or None;
    ``cpuinfo``: /proc/cpuinfo's text (read here when None; elsewhere than Linux, None).
    ``LLMLAB_CPU_BF16=0`` or ``=1`` in the environment overrides the detection."""
    import os

    forced = os.environ.get(CPU_BF16_ENV)
    if forced in ("0", "1"):
        return f"{CPU_BF16_ENV}=1" if forced == "1" else None
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return next((flag for flag in CPU_BF16_FLAGS if flag in flags), None)
    return None


def resolve_precision(name: str, device: torch.device, cpu_bf16: bool = True) -> str:
    """``auto``: bf16 autocast on CUDA GPUs that support it and, where ``cpu_bf16`` (training
    and evaluation, measured faster there at the same loss), on CPUs that multiply bf16 in
    hardware (`cpu_bf16_unit`); fp32 elsewhere."""
    import torch

    if name not in PRECISIONS:
        raise ConfigError(f"precision: unknown '{name}'; allowed: {', '.join(PRECISIONS)}")
    if name != "auto":
        return name
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    if device.type == "cpu" and cpu_bf16 and cpu_bf16_unit() is not None:
        return "bf16"
    return "fp32"


def precision_note(name: str, resolved: str, device: torch.device) -> str:
    """The precision a run uses and, for ``auto``, why: for the start line."""
    if name != "auto":
        return resolved
    if device.type != "cpu":
        return f"{resolved}, auto"
    unit = cpu_bf16_unit()
    if resolved == "bf16":
        return f"bf16, auto: this CPU multiplies bf16 in hardware ({unit}); precision=fp32 for fp32"
    return "fp32, auto: this CPU has no bf16 units (amx_bf16, avx512_bf16)" if unit is None else "fp32, auto"


def amp_dtype(precision: str) -> torch.dtype | None:
    """The dtype autocast runs a resolved ``precision`` in; None for fp32 (no autocast)."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def autocast(device: torch.device, precision: str):
    import torch

    if (dtype := amp_dtype(precision)) is not None:
        return torch.autocast(device_type=device.type, dtype=dtype)
    return contextlib.nullcontext()


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """fp16 needs loss scaling so small gradients do not underflow; other precisions get a
    disabled scaler that passes everything through."""
    import torch

    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def synchronize(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def memory_stats(device: torch.device) -> dict[str, float]:
    import torch

    if device.type == "cuda":
        return {"mem_gb": torch.cuda.max_memory_allocated(device) / 2**30}
    if device.type == "mps":
        return {"mem_gb": torch.mps.current_allocated_memory() / 2**30}
    try:
        import resource
        return {"rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    except (ImportError, AttributeError):
        return {}
