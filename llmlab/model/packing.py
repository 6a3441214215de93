"""Weights laid out anew for decoding on the CPU.

A decoding step multiplies a few rows (one token, a speculative round's k + 1 drafts, a
teacher's batch of windows) by every weight matrix, and reading the weights is most of the
work. ``F.linear`` hands the BLAS each weight as it is stored, (out, in), to be read
transposed. Four other layouts are kept as a second copy of the weights:

- ``onednn``: oneDNN's blocked layout (``mkldnn._reorder_linear_weight``), multiplied by
  ``mkldnn._linear_pointwise``, the path inductor takes for frozen CPU graphs;
- ``transposed``: (in, out), which the BLAS reads front to back as it lies;
- ``split``: that cut into one block of columns per thread, (threads, in, out / threads), one
  batched product whose blocks run side by side. The BLAS runs a product of one row on one
  thread; two threads reading their halves of the weight draw more of the memory's bandwidth.
- ``split_k``: the transposed weight cut into one block of rows per thread, (threads, in /
  threads, out): each thread multiplies its slice of the input by its block, which lies in one
  piece in memory, and the partial sums are added. Streaming a layer from memory on 2 Zen 1
  cores it read 16.4 GB/s at 2816 x 512 where ``split`` read 14.5 and ``F.linear`` 6.8
  (12.5, 10.0 and 7.0 at 768 x 512); a d 512, 8-layer token took 10.4 ms against split's 11.1
  (medians of 11 alternating turns).

Which is fastest depends on the machine and the model, and a layer timed alone says little:
its weight stays in the cache, where decoding a model streams every weight from memory. On 2
AVX2 cores (Zen 1), fp32, llama-family models, one token's forward (ms; plain, transposed,
split, oneDNN): d 192, 4 layers 3.4, 3.2, 3.3, 4.7; d 384, 6 layers 7.8, 7.3, 7.0, 8.9; d 512,
8 layers 14.2, 13.7, 12.3, 15.0. On 2 Zen 3 cores with AVX-512, oneDNN's layout won from d 384
up (an 8,192 x 512 LM head: 570 -> 245 µs a row) and lost below. So ``pack_weights=auto`` times
the model's own decoding step in each layout (`model_layout`), once per set of layer shapes
and thread count in a process (`llmlab sample` keeps it across runs: `LAYOUT_FILE`), and takes
the fastest where it beats ``F.linear`` by 3%; ``true`` lays every layer out in oneDNN's layout. The products agree with ``F.linear`` to
rounding (the order of the sums differs).

Layers that a part applies to one input (a SwiGLU's gate and up projections:
`FeedForward.same_input_linears`) get one joint copy and are multiplied as one product: one
call and one pass over their weights (`_Joint`; 0.6 ms of a 12 ms token at d 512, 8 layers).

Under CPU autocast (``precision=bf16`` or ``fp16``) autocast casts each fp32 weight to the
lower precision at every call: a decoding step read the fp32 weights, wrote a bf16 copy and
read that, each token. There every layer keeps one copy of its weight and bias in autocast's
dtype instead (the layouts ``bf16`` and ``fp16``), made by the same rounding autocast's own
cast does, so the numbers are autocast's exactly; the product is ``F.linear``'s, whose
one-row bf16 product reads half the bytes of fp32's. A d 512, 8-layer token on 2 AVX2 cores
(no bf16 units) took 9.6 ms under autocast with the per-call casts, 5.4 ms with the copies,
and 6.0 ms in fp32 in its fastest layout; the other layouts' products in bf16 took 33 to 38 ms.

``packed_linears(model, ...)`` swaps every ``nn.Linear``'s forward for its layout's product while
it is open and restores them when it closes. The copies are kept per module and made again
when a weight changes (its version counter moves, or it moves in memory), so a model that
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

from llmlab.model.kept import kept_tensors
from llmlab.model.config import check_pack  # noqa: F401  (checked before torch loads; imported from here too)

# rows the packed layout is tuned for: any hint from 5 to 256 measured alike from 1 to 256 rows
# (1 is worse from 5 rows on)
PACK_HINT = 16

_supported: bool | None = None
# module -> (key, its weight in a layout, or its weight and bias in autocast's dtype); weak, so
# the copy goes with the model
_packed: weakref.WeakKeyDictionary[nn.Linear, tuple[tuple, torch.Tensor | tuple]] = weakref.WeakKeyDictionary()


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


def should_pack(models: list[nn.Module], enabled="auto") -> bool:
    """Whether any layer of ``models`` may be laid out anew. ``enabled``: "auto" considers
    fp32 CPU models (`chosen_linears` then keeps the layers where a layout pays); True packs
    every layer in oneDNN's layout wherever its ops work; False never. Never while autograd
    records (training), under CPU autocast (both products are fp32 only) or for sharded
    (FSDP) parameters."""
    if not _may_copy(models, enabled) or torch.is_autocast_enabled("cpu"):
        return False
    return enabled == "auto" or packing_supported()


def _may_copy(models: list[nn.Module], enabled) -> bool:
    """Whether ``models``' layers may decode with a second copy of their weights (a layout's,
    or autocast's dtype): ``enabled`` not False, autograd not recording, and every parameter a
    plain fp32 CPU tensor."""
    check_pack(enabled)
    if enabled is False or torch.is_grad_enabled():
        return False
    params = [p for m in models for p in m.parameters()]
    return bool(params) and all(_plain_cpu_fp32(p) for p in params)


def _onednn_candidate() -> bool:
    """Whether "auto" times oneDNN's layout: on x86-64, where its ops work."""
    return platform.machine().lower() in ("x86_64", "amd64") and packing_supported()


def _plain_cpu_fp32(p: torch.Tensor) -> bool:
    # a tensor subclass (FSDP2's sharded DTensor, a quantized or fake tensor) has no oneDNN
    # layout of its own: only plain tensors are packed
    return type(p.detach()) is torch.Tensor and p.device.type == "cpu" and p.dtype == torch.float32


#: the layouts that hold a layer's weight and bias in CPU autocast's dtype, by that dtype
CASTS = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def cast_dtype(models: list[nn.Module], enabled="auto") -> torch.dtype | None:
    """The dtype that decoding's layers keep a copy of their weights in: CPU autocast's (bf16
    or fp16) while it is on, for plain fp32 CPU models and with ``enabled`` not False; never
    while autograd records. None elsewhere."""
    if not _may_copy(models, enabled) or not torch.is_autocast_enabled("cpu"):
        return None
    dtype = torch.get_autocast_dtype("cpu")
    return dtype if dtype in CASTS else None


def _kept_copy(store: weakref.WeakKeyDictionary, owner: nn.Linear, key: tuple, make):
    """The copy ``store`` keeps for ``owner``, made (``make()``) where there is none or its
    ``key`` (where the weights lie and their version counters, the layout) has moved on."""
    hit = store.get(owner)
    if hit is None or hit[0] != key:
        with kept_tensors():
            hit = (key, make())
        store[owner] = hit
    return hit[1]


def cast_weights(linear: nn.Linear, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``linear``'s weight and bias in ``dtype``, made again when either has changed."""
    w, b = linear.weight, linear.bias
    key = (*((t.data_ptr(), t._version) for t in (w, b) if t is not None), CASTS[dtype])
    return _kept_copy(_packed, linear, key,
                      lambda: (w.detach().to(dtype), None if b is None else b.detach().to(dtype)))


def _cast_forward(linear: nn.Linear, dtype: torch.dtype, weight: torch.Tensor, bias: torch.Tensor | None,
                  x: torch.Tensor) -> torch.Tensor:
    """``F.linear`` with the copies in ``dtype`` while CPU autocast to that dtype is on (which
    casts ``x`` as it would have); with the layer's own weights otherwise."""
    if (x.device.type != "cpu" or x.dtype not in (torch.float32, dtype) or not torch.is_autocast_enabled("cpu")
            or torch.get_autocast_dtype("cpu") != dtype):
        return F.linear(x, linear.weight, linear.bias)
    return F.linear(x, weight, bias)


def _split_parts(features: int) -> int:
    """How many blocks the split layouts cut a layer into (split: of its ``features`` outputs;
    split_k: of its inputs): one per intra-op thread (at most 8), fewer where they would not
    divide them evenly; 1: no split."""
    parts = max(1, min(torch.get_num_threads(), 8))
    while features % parts:
        parts -= 1
    return parts


def _layout_copy(w: torch.Tensor, layout: str) -> torch.Tensor:
    """``w`` (N, K) laid out for ``layout``: oneDNN's blocked layout; the transposed (K, N);
    that cut into column blocks, (parts, K, N / parts), each contiguous; or cut into row
    blocks, (parts, K / parts, N), which is the transposed copy seen in parts."""
    if layout == "onednn":
        return torch.ops.mkldnn._reorder_linear_weight(w, PACK_HINT)
    if layout in ("transposed", "split_k"):
        wt = w.t().contiguous()
        return wt if layout == "transposed" else _rows_in_blocks(wt)
    n, k = w.shape
    parts = _split_parts(n)
    return w.t().reshape(k, parts, n // parts).transpose(0, 1).contiguous()


def _transposed_linear(x: torch.Tensor, wt: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (..., K) times the transposed weight (K, N), + bias: the BLAS reads the weight row by
    row as it lies, where ``F.linear`` hands it over transposed."""
    y = torch.matmul(x, wt)
    return y if bias is None else y.add_(bias)


def _split_linear(x: torch.Tensor, blocks: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (..., K) times the split layout (P, K, N / P), + bias: one batched product whose P
    blocks run on P threads, each reading its block of the weight front to back (a single
    product of one row runs on one thread)."""
    parts, k, n = blocks.shape
    rows = x.reshape(1, -1, k)
    rows = rows.expand(parts, -1, -1)
    y = torch.bmm(rows, blocks) if bias is None else torch.baddbmm(bias.view(parts, 1, n), rows, blocks)
    if rows.shape[1] > 1:  # (P, M, n) -> (M, P, n); with one row the blocks already lie in order
        y = y.transpose(0, 1)
    return y.reshape(*x.shape[:-1], parts * n)


def _rows_in_blocks(copy):
    """A transposed copy (K, N), or a group's (copy, bias), as the split_k layout's view of it."""
    if isinstance(copy, tuple):
        return _rows_in_blocks(copy[0]), copy[1]
    return copy.view(_split_parts(copy.shape[0]), -1, copy.shape[1])


def _split_k_linear(x: torch.Tensor, blocks: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (..., K) times the split_k layout (P, K / P, N), + bias: P products of a slice of the
    input by a block of rows, run side by side on P threads, then summed. Each thread reads
    its block front to back, and no output column waits on both."""
    parts, k, n = blocks.shape
    rows = x.reshape(-1, parts, k).transpose(0, 1)  # (P, M, K / P)
    y = torch.bmm(rows, blocks).sum(0)
    if bias is not None:
        y = y.add_(bias)
    return y.reshape(*x.shape[:-1], n)


def _parts_key(linear: nn.Linear, layout: str) -> int:
    if layout == "split_k":
        return _split_parts(linear.in_features)
    return _split_parts(linear.out_features) if layout == "split" else 0


def packed_weight(linear: nn.Linear, layout: str = "onednn") -> torch.Tensor:
    """``linear.weight`` in ``layout`` (see `LAYOUTS`), made again when the weight has changed
    (or, for "split", the thread count)."""
    return _kept_copy(_packed, linear, _weight_key(linear, layout),
                      lambda: _layout_copy(linear.weight.detach(), layout))


def _weight_key(linear: nn.Linear, layout: str) -> tuple:
    w = linear.weight
    return w.data_ptr(), w._version, layout, _parts_key(linear, layout)


def _forward(product, linear: nn.Linear, weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32 or x.device.type != "cpu":
        return F.linear(x, linear.weight, linear.bias)
    return product(x, weight, linear.bias)


# -- layers that read one input, multiplied as one product -------------------------------------

Group = tuple  # of nn.Linear: layers a forward applies to one and the same input

# first member -> (key, (joint weight in a layout, joint bias or None)); weak, as `_packed`
_joint_packed: weakref.WeakKeyDictionary[nn.Linear, tuple[tuple, tuple[torch.Tensor, torch.Tensor | None]]] = \
    weakref.WeakKeyDictionary()


def linear_groups(models: list[nn.Module]) -> list[Group]:
    """The groups of linear layers that a part of ``models`` applies to one input (a SwiGLU's
    gate and up projections: `FeedForward.same_input_linears`), where the members agree in
    input width and in having a bias, so that one joint weight serves them."""
    groups = []
    for model in models:
        for mod in model.modules():
            for group in getattr(mod, "same_input_linears", lambda: [])():
                group = tuple(group)
                if (len(group) > 1 and all(type(m) is nn.Linear for m in group)
                        and len({(m.in_features, m.bias is None) for m in group}) == 1):
                    groups.append(group)
    return groups


def _joint_key(group: Group, layout: str) -> tuple:
    tensors = [t for m in group for t in (m.weight, m.bias) if t is not None]
    return (*((t.data_ptr(), t._version) for t in tensors), layout, _joint_parts(group, layout))


def _joint_parts(group: Group, layout: str) -> int:
    if layout == "split_k":
        return _split_parts(group[0].in_features)
    return _split_parts(sum(m.out_features for m in group)) if layout == "split" else 0


def _joint_copy(group: Group, layout: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The group's weights stacked, (sum of outputs, in), in ``layout``, and their biases joined.
    The transposed and split layouts are written from the members directly, with no stacked
    copy made first: a token's first step makes every copy, so it counts in the time to the
    first token."""
    if layout == "split_k":
        return _rows_in_blocks(_joint_copy(group, "transposed"))
    bias = None if group[0].bias is None else torch.cat([m.bias.detach() for m in group])
    if layout not in ("transposed", "split"):
        return _layout_copy(torch.cat([m.weight.detach() for m in group]), layout), bias
    first = group[0].weight
    total = sum(m.out_features for m in group)
    parts = _split_parts(total) if layout == "split" else 1
    n = total // parts
    out = torch.empty(parts, first.shape[1], n, dtype=first.dtype, device=first.device)
    start = 0
    for m in group:  # the member's rows [start, end) of the stack are columns of out's blocks
        w, end = m.weight.detach(), start + m.out_features
        for p in range(parts):
            lo, hi = max(start, p * n), min(end, (p + 1) * n)
            if lo < hi:
                out[p, :, lo - p * n:hi - p * n].copy_(w[lo - start:hi - start].t())
        start = end
    return (out[0] if layout == "transposed" else out), bias


def joint_weight(group: Group, layout: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`_joint_copy`, made again when a member's weight or bias has changed (as `packed_weight`)."""
    return _kept_copy(_joint_packed, group[0], _joint_key(group, layout), lambda: _joint_copy(group, layout))


class _Joint:
    """The layers of a group multiplied as one product by their joint weight: one call and one
    pass over the weights where there were several (a SwiGLU's two projections of d_model to
    the hidden width: 0.6 ms of a 12 ms token at d 512, 8 layers, split layout). The member
    called first computes every member's output; each other member takes its own when it is
    called with that same input tensor, and computes the whole product again otherwise."""

    def __init__(self, group: Group, product, weight: torch.Tensor, bias: torch.Tensor | None):
        self.group, self.product, self.weight, self.bias = group, product, weight, bias
        self.sizes = [m.out_features for m in group]
        self.input: torch.Tensor | None = None
        self.outputs: list[torch.Tensor | None] = []

    def __call__(self, i: int, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu":
            return F.linear(x, self.group[i].weight, self.group[i].bias)
        if x is self.input and self.outputs[i] is not None:
            y, self.outputs[i] = self.outputs[i], None
            if all(o is None for o in self.outputs):
                self.input, self.outputs = None, []
            return y
        outputs: list[torch.Tensor | None] = list(self.product(x, self.weight, self.bias).split(self.sizes, dim=-1))
        y, outputs[i] = outputs[i], None
        self.input, self.outputs = x, outputs
        return y


def _layout_forwards(linears: list[nn.Linear], groups: list[Group], layout: str, single, joint) -> dict:
    """Each of ``linears``'s forward in ``layout`` (not "plain"): the groups whose members are all
    among them as one product (``joint(group)``: its weight and bias), every other layer by
    its own copy (``single(linear)``)."""
    product, out = LAYOUTS[layout], {}
    among = set(linears)
    for group in groups:
        if among.issuperset(group):
            shared = _Joint(group, product, *joint(group))
            out.update({m: functools.partial(shared, i) for i, m in enumerate(group)})
    for m in linears:
        if m not in out:
            out[m] = functools.partial(_forward, product, m, single(m))
    return out


#: the layouts besides ``F.linear``'s own ("plain"), each with its product
LAYOUTS = {"onednn": _linear, "transposed": _transposed_linear, "split": _split_linear, "split_k": _split_k_linear}

# a layout must take under this share of F.linear's time for "auto" to choose it (the rest
# is noise: a tie is left to F.linear, which needs no second copy of the weights)
PAYS_BELOW = 0.97
# turns each layout is timed in: on a shared 2-core machine a split product (two threads) loses
# to F.linear (one) while another process holds a core, so a short probe can keep the wrong one
ROUNDS = 5
_chosen: dict[str, str] = {}  # by `layout_key`


def _candidates(linears: list[nn.Linear]) -> list[str]:
    """The layouts "auto" times: "split" and "split_k" where more than one thread runs (and
    divides a layer), oneDNN's on x86-64."""
    split = any(_split_parts(m.out_features) > 1 for m in linears)
    split_k = any(_split_parts(m.in_features) > 1 for m in linears)
    return ["plain", "transposed"] + ["split"] * split + ["split_k"] * split_k + ["onednn"] * _onednn_candidate()


def _install(linears: list[nn.Linear], groups: list[Group], layout: str, copies: dict) -> None:
    if layout == "plain":
        for m in linears:
            m.__dict__.pop("forward", None)
        return
    for m, forward in _layout_forwards(linears, groups, layout, copies.__getitem__, copies.__getitem__).items():
        m.forward = forward


def _copies(linears: list[nn.Linear], groups: list[Group], layout: str) -> dict:
    """Copies of the weights in ``layout``: a joint one per group (keyed by the group), one per
    other layer."""
    joined = {m for g in groups for m in g}
    copies: dict = {g: _joint_copy(g, layout) for g in groups}
    copies.update({m: _layout_copy(m.weight.detach(), layout) for m in linears if m not in joined})
    return copies


def _time_layouts(model: nn.Module, linears: list[nn.Linear],
                  rounds: int = ROUNDS) -> tuple[dict[str, float], dict[str, dict]]:
    """Seconds of one decoding step of ``model`` (one token, a short cache) with all its
    layers in each candidate layout, the least of ``rounds`` turns: the layouts take turns, so
    that other load hits all alike, and each turn runs two steps and times the second (the
    first wakes the threads a split product runs on). In inference and eval mode, with the
    random state put back. Returns the times and each layout's copies of the weights."""
    import time

    names = _candidates(linears)
    groups = [g for g in linear_groups([model]) if set(linears).issuperset(g)]
    times: dict[str, list[float]] = {name: [] for name in names}
    was_training = model.training
    model.eval()
    try:
        with kept_tensors():  # ordinary tensors: the fastest layout's are kept for later decoding
            copies = {}
            for name in names:
                if name == "split_k" and "transposed" in copies:  # the same numbers, seen in row blocks
                    copies[name] = {key: _rows_in_blocks(copy) for key, copy in copies["transposed"].items()}
                elif name != "plain":
                    copies[name] = _copies(linears, groups, name)
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            cache = model.new_cache(1, 2)
            token = torch.zeros(1, 1, dtype=torch.long)
            model(token, cache=cache)  # a first forward pays for what is made once
            for i in range(rounds):
                for name in names[i % len(names):] + names[:i % len(names)]:  # who goes first rotates
                    _install(linears, groups, name, copies.get(name, {}))
                    for _ in range(2):
                        cache.truncate(0)
                        t = time.perf_counter()
                        model(token, cache=cache)
                    times[name].append(time.perf_counter() - t)
    finally:
        _install(linears, groups, "plain", {})
        model.train(was_training)
    return {name: min(ts) for name, ts in times.items()}, copies


#: where `llmlab sample` keeps the layouts it measured, in the llmlab cache
LAYOUT_FILE = "decode_layouts.json"


def layout_key(model: nn.Module) -> str:
    """What a kept layout belongs to: the model's kind and layer shapes, the machine, thread
    count and torch build it was measured on (as MFU's measured peak is kept), and the layouts
    it was chosen among (a layout added since is measured too)."""
    import collections
    import os

    linears = [m for m in model.modules() if type(m) is nn.Linear]
    shapes = collections.Counter((m.out_features, m.in_features, m.bias is not None) for m in linears)
    layers = ",".join(f"{o}x{i}{'+b' if b else ''}*{n}" for (o, i, b), n in sorted(shapes.items()))
    return "|".join([type(model).__name__, layers, platform.machine(), platform.processor() or platform.node(),
                     str(os.cpu_count()), str(torch.get_num_threads()), torch.__version__,
                     "/".join(_candidates(linears))])


def read_layouts(path) -> tuple[dict[str, str], str | None]:
    """The layouts kept in ``path`` (`LAYOUT_FILE`) and a line on what in it could not be used
    (None: all of it, or no file). Hand-edited or damaged entries are measured again."""
    from llmlab.files import read_kept

    return read_kept(path, "each decoding layout", lambda v: v in ("plain", *LAYOUTS),
                     f"one of plain, {', '.join(LAYOUTS)}")


def model_layout(model: nn.Module, known: dict[str, str] | None = None) -> str:
    """The layout that decodes ``model`` fastest here: "plain" (``F.linear``) unless another
    takes under `PAYS_BELOW` of its time, measured on the model's own decoding step (what a
    layer costs depends on what runs around it: a layer timed alone keeps its weight in the
    cache, where decoding streams every weight from memory). Once per set of layer shapes and
    thread count in a process: 51 steps of the model and a copy of its weights in each layout
    (transposed and split_k share one), about 0.2 s at 1.7M parameters and 1.0 s at 23M on 2
    AVX2 cores.

    ``known`` (`read_layouts`): layouts measured before, by `layout_key`. One found there is
    taken as it is; one measured here goes in, unless other processes used the CPU while it
    was timed (then it serves this process only)."""
    from llmlab.perf import contended, other_load, snapshot

    linears = [m for m in model.modules() if type(m) is nn.Linear]
    key = layout_key(model)  # in this process and in the kept file alike
    kept = known.get(key) if known is not None else None
    if key not in _chosen and kept in _candidates(linears):
        _chosen[key] = kept
    elif key not in _chosen:
        start = snapshot()
        times, copies = _time_layouts(model, linears)
        best = min(times, key=times.__getitem__)
        _chosen[key] = best if times[best] < PAYS_BELOW * times["plain"] else "plain"
        if known is not None and not contended(other_load(start, snapshot())):
            known[key] = _chosen[key]
        layout = _chosen[key]
        for m, copy in copies.get(layout, {}).items():  # what `packed_weight` and `joint_weight` would make again
            if isinstance(m, tuple):
                _joint_packed[m[0]] = (_joint_key(m, layout), copy)
            else:
                _packed[m] = (_weight_key(m, layout), copy)
    return _chosen[key]


def chosen_linears(models: list[nn.Module], enabled="auto", known: dict[str, str] | None = None
                   ) -> dict[nn.Linear, str]:
    """The layers `packed_linears` lays out anew, each with its layout: none where
    `should_pack` says no; with ``enabled`` True every ``nn.Linear`` in oneDNN's; with "auto"
    each model's in the layout `model_layout` measures or finds in ``known`` (a model without
    a decode cache, or with a layer already swapped by an outer `packed_linears`, keeps
    ``F.linear``). Under CPU autocast, every layer in autocast's dtype (`cast_dtype`)."""
    if (dtype := cast_dtype(models, enabled)) is not None:
        return {m: CASTS[dtype] for model in models for m in model.modules() if type(m) is nn.Linear}
    if not should_pack(models, enabled):
        return {}
    chosen: dict[nn.Linear, str] = {}
    for model in models:
        linears = [m for m in model.modules() if type(m) is nn.Linear and m not in chosen]
        if enabled is True:
            layout = "onednn"
        elif not linears or not hasattr(model, "new_cache") or any("forward" in m.__dict__ for m in linears):
            continue
        else:
            layout = model_layout(model, known)
        if layout != "plain":
            chosen.update(dict.fromkeys(linears, layout))
    return chosen


@contextmanager
def packed_linears(*models: nn.Module | None, enabled="auto", keep: bool = True) -> Iterator[bool]:
    """While open, every ``nn.Linear`` of ``models`` multiplies with its packed weight (see
    ``should_pack`` for when), or under CPU autocast with its copy in autocast's dtype
    (`cast_dtype`). Yields whether it packed or cast. Nested use leaves the outer one's
    swaps in place. ``keep=False`` drops the packed copies on exit (a model that trains
    between samples would only pack them again)."""
    models = [m for m in models if m is not None]
    swapped: list[nn.Linear] = []
    by_layout: dict[str, list[nn.Linear]] = {}
    for m, layout in chosen_linears(models, enabled).items():
        if "forward" not in m.__dict__:
            by_layout.setdefault(layout, []).append(m)
    for dtype, layout in CASTS.items():  # under CPU autocast: copies in its dtype, no other layout
        for m in by_layout.pop(layout, []):
            m.forward = functools.partial(_cast_forward, m, dtype, *cast_weights(m, dtype))
            swapped.append(m)
    groups = linear_groups(models) if by_layout else []
    for layout, linears in by_layout.items():
        for m, forward in _layout_forwards(linears, groups, layout, lambda m: packed_weight(m, layout),
                                           lambda g: joint_weight(g, layout)).items():
            m.forward = forward
            swapped.append(m)
    try:
        yield bool(swapped)
    finally:
        for m in swapped:
            del m.forward
            if not keep:
                _packed.pop(m, None)
                _joint_packed.pop(m, None)
