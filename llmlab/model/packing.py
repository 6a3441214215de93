"""Prepacked weights for decoding on the CPU.

A decoding step multiplies a few rows (one token, a speculative round's k + 1 drafts, a
teacher's batch of windows) by every weight matrix. ``F.linear`` hands that to the BLAS, which
re-lays the weight out for its kernel on every call, and for a handful of rows that costs more
than the product. oneDNN can lay each weight out once (``mkldnn._reorder_linear_weight``) and
reuse it (``mkldnn._linear_pointwise``), the path inductor takes for frozen CPU graphs.

Whether that pays depends on the machine and the shape. On 2 Zen 3 cores with AVX-512, fp32
(median µs, F.linear -> packed):
  8192 x 512 (an LM head):  1 row 570 -> 245,  5 rows 1950 -> 460,  64 rows 5720 -> 3870
  1536 x 512 (a qkv proj):  1 row 104 -> 79,   5 rows 197 -> 96,    64 rows 733 -> 639
while on 2 older AVX2 cores the packed product lost at every shape (1 row: 8192 x 512 1483 ->
1697, 1536 x 512 110 -> 207, 96 x 32 8.9 -> 63), and below d 384 it lost on the first machine
too. So ``pack_weights=auto`` times both products once per layer shape and thread count, one
row at a time as decoding runs them, and packs a layer only where the packed one is clearly
faster (`packing_pays`); ``true`` packs every layer. With 256 rows and more the two are alike,
so prefill neither gains nor loses much.

``packed_linears(model, ...)`` swaps every ``nn.Linear``'s forward for the packed product while
it is open and restores them when it closes. The packed copies are kept per module and made
again when a weight changes (its version counter moves, or it moves in memory), so a model that
trains between samples never decodes with stale weights.
"""

from __future__ import annotations

import functools
import platform
import weakref
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from llmlab.errors import ConfigError
from llmlab.model.kept import kept_tensors

# rows the packed layout is tuned for: any hint from 5 to 256 measured alike from 1 to 256 rows
# (1 is worse from 5 rows on)
PACK_HINT = 16
PACK_CHOICES = ("auto", True, False)

_supported: bool | None = None
# module -> ((weight storage, version), packed weight); weak, so the copy goes with the model
_packed: weakref.WeakKeyDictionary[nn.Linear, tuple[tuple[int, int], torch.Tensor]] = weakref.WeakKeyDictionary()


def packing_supported() -> bool:
    """Whether this torch build has the oneDNN ops and they agree with ``F.linear`` (probed once)."""
    global _supported
    if _supported is None:
        _supported = _probe()
    return _supported


def _probe() -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    gen = torch.Generator().manual_seed(0)
    w, b, x = (torch.randn(*shape, generator=gen) for shape in [(24, 16), (24,), (2, 3, 16)])
    try:
        with torch.no_grad():
            y = _linear(x, torch.ops.mkldnn._reorder_linear_weight(w, PACK_HINT), b)
    except Exception:  # a build without these ops (their names are private): decode unpacked
        return False
    return y.shape == (2, 3, 24) and torch.allclose(y, F.linear(x, w, b), rtol=1e-4, atol=1e-5)


def _linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def check_pack(value, key: str = "pack_weights") -> None:
    if value not in PACK_CHOICES or isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ConfigError(f"{key}: must be one of auto, true, false; got {value!r}")


def should_pack(models: list[nn.Module], enabled="auto") -> bool:
    """Whether any layer of ``models`` may be packed. ``enabled``: "auto" considers fp32 CPU
    models on x86-64 (`chosen_linears` then keeps the layers where it pays); True packs
    wherever the ops work; False never. Never while autograd records (training), under CPU
    autocast (the packed product is fp32 only) or for sharded (FSDP) parameters."""
    check_pack(enabled)
    if enabled is False or torch.is_grad_enabled() or torch.is_autocast_enabled("cpu"):
        return False
    params = [p for m in models for p in m.parameters()]
    if not params or any(not _plain_cpu_fp32(p) for p in params):
        return False
    if enabled == "auto" and platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    return packing_supported()


def _plain_cpu_fp32(p: torch.Tensor) -> bool:
    # a tensor subclass (FSDP2's sharded DTensor, a quantized or fake tensor) has no oneDNN
    # layout of its own: only plain tensors are packed
    return type(p.detach()) is torch.Tensor and p.device.type == "cpu" and p.dtype == torch.float32


def packed_weight(linear: nn.Linear) -> torch.Tensor:
    """The oneDNN layout of ``linear.weight``, made again when the weight has changed."""
    w = linear.weight
    key = (w.data_ptr(), w._version)
    hit = _packed.get(linear)
    if hit is None or hit[0] != key:
        with kept_tensors():
            hit = (key, torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_HINT))
        _packed[linear] = hit
    return hit[1]


def _packed_forward(linear: nn.Linear, packed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32 or x.device.type != "cpu":
        return F.linear(x, linear.weight, linear.bias)
    return _linear(x, packed, linear.bias)


# packed must take under this share of F.linear's time for "auto" to pack a layer (the rest
# is noise: a tie is left to F.linear, which needs no second copy of the weight)
PAYS_BELOW = 0.9
_pays: dict[tuple, bool] = {}


def _time_one_row(out_features: int, in_features: int, bias: bool, samples: int = 7) -> tuple[float, float]:
    """Median seconds of one row through ``F.linear`` and through the packed product, for a
    random layer of this shape, the two interleaved so that other load hits both alike."""
    import statistics
    import time

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(out_features, in_features, generator=gen)
    b = torch.randn(out_features, generator=gen) if bias else None
    x = torch.randn(1, 1, in_features, generator=gen)
    calls = max(1, min(50, 500_000 // (out_features * in_features)))
    with torch.no_grad():  # nothing made here outlives the measurement
        packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_HINT)
        runs = {"plain": lambda: F.linear(x, w, b), "packed": lambda: _linear(x, packed, b)}
        times: dict[str, list[float]] = {"plain": [], "packed": []}
        for i in range(samples + 1):
            for name, run in runs.items():
                t = time.perf_counter()
                for _ in range(calls):
                    run()
                if i:  # the first round warms up
                    times[name].append((time.perf_counter() - t) / calls)
    return statistics.median(times["plain"]), statistics.median(times["packed"])


def packing_pays(linear: nn.Linear) -> bool:
    """Whether the packed product decodes this layer's shape clearly faster than ``F.linear``
    here: measured once per shape and thread count in a process (a few ms, 20 to 40 for an
    LM head of 8,192 x 512)."""
    key = (linear.out_features, linear.in_features, linear.bias is not None, torch.get_num_threads())
    if key not in _pays:
        plain, packed = _time_one_row(*key[:3])
        _pays[key] = packed < PAYS_BELOW * plain
    return _pays[key]


def chosen_linears(models: list[nn.Module], enabled="auto") -> list[nn.Linear]:
    """The layers `packed_linears` packs: none where `should_pack` says no; with ``enabled``
    True every ``nn.Linear``; with "auto" those whose shape `packing_pays`."""
    if not should_pack(models, enabled):
        return []
    linears = [m for model in models for m in model.modules() if type(m) is nn.Linear]
    return linears if enabled is True else [m for m in linears if packing_pays(m)]


@contextmanager
def packed_linears(*models: nn.Module | None, enabled="auto", keep: bool = True) -> Iterator[bool]:
    """While open, every ``nn.Linear`` of ``models`` multiplies with its packed weight (see
    ``should_pack`` for when). Yields whether it packed. Nested use leaves the outer one's
    swaps in place. ``keep=False`` drops the packed copies on exit (a model that trains
    between samples would only pack them again)."""
    models = [m for m in models if m is not None]
    swapped: list[nn.Linear] = []
    for m in chosen_linears(models, enabled):
        if "forward" not in m.__dict__ and m not in swapped:
            m.forward = functools.partial(_packed_forward, m, packed_weight(m))
            swapped.append(m)
    try:
        yield bool(swapped)
    finally:
        for m in swapped:
            del m.forward
            if not keep:
                _packed.pop(m, None)
