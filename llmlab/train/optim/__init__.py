"""Optimizers (config group ``optim``). A kind is the optimizer itself, built as every
registered part is: ``cls(cfg, model, device)``. A new kind can be one file in this package:
its class, registered with ``@OPTIMIZER.register(name)``, holding a nested ``Config``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from llmlab.errors import ConfigError
from llmlab.registry import Checked, bounded
from llmlab.train.optim_config import OPTIMIZER, check_torch_has


def param_groups(model: nn.Module, weight_decay: float, decay_embeddings: bool = False) -> list[dict]:
    """Decay only matrices of linear layers: norms, biases and (by default) embeddings are
    left alone, as in GPT-2/GPT-3 practice. Tied weights appear once. Parameters the model
    gives a learning-rate factor (muP's hidden matrices: ``model.lr_multipliers()``) form
    groups of their own, whose ``lr_mult`` `build_optimizer` applies."""
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    multipliers = model.lr_multipliers() if hasattr(model, "lr_multipliers") else {}
    groups: dict[tuple[bool, float], list] = {(True, 1.0): [], (False, 1.0): []}  # the standard two, in this order
    seen = set()
    for _, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        decays = p.dim() >= 2 and (decay_embeddings or id(p) not in embedding_ids)
        groups.setdefault((decays, multipliers.get(id(p), 1.0)), []).append(p)
    return [{"params": params, "weight_decay": weight_decay if decays else 0.0, **({"lr_mult": mult} if mult != 1.0 else {})}
            for (decays, mult), params in groups.items() if params or mult == 1.0]


class OptimizerKind:
    """What every optimizer kind provides besides being an optimizer (a torch one, or an
    `OptimizerGroup`): a ``Config`` dataclass (``kind``, ``lr`` and its own settings) and a
    constructor ``(cfg, model, device)``. The schedule scales each param group's ``lr`` per
    step."""

    #: settings with which a tiny test model learns in 60 steps (tests run every kind with them)
    test_settings: dict = {}


@OPTIMIZER.register("adamw")
class AdamW(OptimizerKind, torch.optim.AdamW):
    """AdamW (Loshchilov & Hutter 2019): Adam with decoupled weight decay; norms, biases and embeddings are not decayed."""

    @dataclass
    class Config:
        mup: ClassVar[bool] = True  # Adam's update is scale-free per coordinate: muP's Adam rules hold (model.parametrization=mup)
        kind: str = "adamw"
        lr: float = bounded(3e-3, above=0)  # peak learning rate; the schedule scales it
        beta1: float = bounded(0.9, at_least=0, below=1)
        beta2: float = bounded(0.95, at_least=0, below=1)
        eps: float = bounded(1e-8, above=0)
        weight_decay: float = bounded(0.1, at_least=0)
        decay_embeddings: bool = False

    def __init__(self, cfg, model: nn.Module, device: torch.device):
        groups = param_groups(model, cfg.weight_decay, cfg.decay_embeddings)
        super().__init__(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, **adamw_kernel(groups, device))


def adamw_kernel(groups: list[dict], device: torch.device) -> dict:
    """torch AdamW's ``fused``/``foreach`` for these groups: the fused kernel is one launch per
    step on CUDA and one pass per tensor on the CPU (5% of a small model's CPU step against
    foreach, bench.shakespeare), where it takes plain tensors only (not FSDP's sharded
    DTensors); foreach elsewhere (torch's own default on the CPU is a loop over tensors)."""
    plain = all(type(p.detach()) is torch.Tensor for g in groups for p in g["params"])
    fused = device.type == "cuda" or (device.type == "cpu" and plain)
    return {"fused": fused, "foreach": None if fused else True}


@OPTIMIZER.register("sgd")
class SGD(OptimizerKind, torch.optim.SGD):
    """Stochastic gradient descent with (Nesterov) momentum; decay as for AdamW."""

    @dataclass
    class Config(Checked):
        kind: str = "sgd"
        lr: float = bounded(0.1, above=0)
        momentum: float = bounded(0.9, at_least=0, below=1)
        nesterov: bool = True
        weight_decay: float = bounded(0.0, at_least=0)
        decay_embeddings: bool = False

        def check(self, prefix: str) -> None:
            if self.nesterov and self.momentum == 0:
                raise ConfigError(f"{prefix}.nesterov: needs {prefix}.momentum > 0")

    def __init__(self, cfg, model: nn.Module, device: torch.device):
        groups = param_groups(model, cfg.weight_decay, cfg.decay_embeddings)
        super().__init__(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)


class LionOptimizer(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2):
    the update is the sign of an interpolation of momentum and gradient, so every coordinate
    moves by lr; weight decay is decoupled. torch has no Lion of its own."""

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(torch.sign(m * beta1 + p.grad * (1 - beta1)), alpha=-group["lr"])
                m.lerp_(p.grad, 1 - beta2)
        return loss


@OPTIMIZER.register("lion")
class Lion(OptimizerKind, LionOptimizer):
    """Lion (Chen et al. 2023): sign updates; use a 3-10x smaller lr and larger decay than AdamW (section 5)."""

    @dataclass
    class Config:
        mup: ClassVar[bool] = True  # a sign update: scale-free per coordinate, as Adam's
        kind: str = "lion"
        lr: float = bounded(3e-4, above=0)
        beta1: float = bounded(0.9, at_least=0, below=1)
        beta2: float = bounded(0.99, at_least=0, below=1)
        weight_decay: float = bounded(1.0, at_least=0)
        decay_embeddings: bool = False

    test_settings = {"lr": 1e-3}

    def __init__(self, cfg, model: nn.Module, device: torch.device):
        groups = param_groups(model, cfg.weight_decay, cfg.decay_embeddings)
        super().__init__(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


# torch < 2.5 has no Adafactor: the class still defines, and the Config's check refuses the kind
@OPTIMIZER.register("adafactor")
class Adafactor(OptimizerKind, getattr(torch.optim, "Adafactor", torch.optim.Optimizer)):
    """Adafactor (Shazeer & Stern 2018): second moments of a matrix kept as a row and a column
    factor, so its state grows with rows + columns, not rows x columns (torch.optim.Adafactor)."""

    @dataclass
    class Config(Checked):
        kind: str = "adafactor"
        lr: float = bounded(1e-2, above=0)  # peak learning rate; the schedule scales it
        beta2_decay: float = bounded(-0.8, at_most=0)  # the second moment's decay at step t is 1 - t^beta2_decay
        eps: float = bounded(1e-3, at_least=0)  # updates are clipped relative to max(eps, RMS of the parameter)
        weight_decay: float = bounded(0.0, at_least=0)
        decay_embeddings: bool = False

        def check(self, prefix: str) -> None:
            check_torch_has("Adafactor", "2.5", prefix)

    def __init__(self, cfg, model: nn.Module, device: torch.device):
        groups = param_groups(model, cfg.weight_decay, cfg.decay_embeddings)
        super().__init__(groups, lr=cfg.lr, beta2_decay=cfg.beta2_decay, eps=(None, cfg.eps))


class OptimizerGroup:
    """Several optimizers stepped as one (Muon for hidden matrices, AdamW for the rest)."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.optimizers for g in opt.param_groups]

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [opt.state_dict() for opt in self.optimizers]}

    def load_state_dict(self, state: dict) -> None:
        for opt, s in zip(self.optimizers, state["optimizers"]):
            opt.load_state_dict(s)


def orthogonalize(update: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype) -> torch.Tensor:
    """Muon's quintic Newton-Schulz iterations in ``dtype``: ``update`` scaled to spectral norm
    <= 1, then pushed towards the nearest semi-orthogonal matrix. The same arithmetic, in the
    same order, as torch.optim.Muon's (which is fixed to bf16)."""
    a, b, c = coefficients
    x = update.to(dtype)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x.div(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def muon_lr_ratio(rule: str | None, shape: torch.Size) -> float:
    """How torch.optim.Muon's ``adjust_lr_fn`` scales the learning rate of a (rows, cols) matrix."""
    rows, cols = shape[:2]
    if rule is None or rule == "original":
        return math.sqrt(max(1.0, rows / cols))
    if rule == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    if rule == "spectral_unclamped":
        return math.sqrt(rows / cols)
    raise ValueError(f"Muon: unknown adjust_lr_fn {rule!r}")


# torch.optim.Muon's defaults (torch >= 2.9), which a test holds equal to its signature's
MUON_DEFAULTS = {"lr": 1e-3, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True,
                 "ns_coefficients": (3.4445, -4.7750, 2.0315), "eps": 1e-7, "ns_steps": 5, "adjust_lr_fn": None}


class Fp32Muon(torch.optim.Optimizer):
    """torch.optim.Muon with its Newton-Schulz iterations in fp32 (or ``ns_dtype``; torch's
    own are in bf16). Same settings, param groups, state (``momentum_buffer``) and update rule,
    so a checkpoint moves between the two; it needs no torch.optim.Muon, so ``optim=muon``
    (the default run's optimizer) trains on every torch llmlab supports, torch < 2.9 included.
    On a 2-core x86 CPU without bf16 matrix units, a step of the default model with Muon in
    fp32 took about 1.1x AdamW's time; in bf16, about 12x."""

    def __init__(self, params, ns_dtype: torch.dtype = torch.float32, **settings):
        unknown = set(settings) - set(MUON_DEFAULTS)
        if unknown:
            raise TypeError(f"Fp32Muon: unknown settings {sorted(unknown)}")
        defaults = {**MUON_DEFAULTS, **settings}
        if defaults["adjust_lr_fn"] not in (None, "original", "match_rms_adamw", "spectral_unclamped"):
            raise ValueError(f"Muon: unknown adjust_lr_fn {defaults['adjust_lr_fn']!r}")
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon takes 2-D parameters only, got one of size {tuple(p.shape)}")
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum = float(group["lr"]), group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                update = orthogonalize(update, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(update, alpha=-lr * muon_lr_ratio(group["adjust_lr_fn"], p.shape))
        return loss


NS_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def ns_precision(name: str, device: torch.device) -> str:
    """``optim.ns_precision`` resolved: ``auto`` is bf16 on CUDA (its matrix units make it fast
    and torch's Muon is tuned for it) and fp32 elsewhere."""
    return name if name != "auto" else ("bf16" if device.type == "cuda" else "fp32")


@OPTIMIZER.register("muon")
class Muon(OptimizerKind, OptimizerGroup):
    """Muon (Jordan et al. 2024): momentum orthogonalised by Newton-Schulz iterations, for the
    2-D weight matrices inside the blocks; embeddings, the LM head, norms and biases use AdamW
    (``adamw_lr``), as Muon's authors recommend. ``ns_precision`` picks the iterations'
    precision: bf16 is torch's own Muon (`Fp32Muon` with bf16 iterations on a torch < 2.9,
    which has none), fp32 (`Fp32Muon`) the same update with fp32 iterations, which CPUs run
    many times faster; ``auto`` takes bf16 on CUDA and fp32 elsewhere."""

    def __init__(self, cfg, model: nn.Module, device: torch.device):
        hidden = {id(p) for p in model.blocks.parameters() if p.dim() == 2}
        seen: set[int] = set()
        matrices, rest = [], []
        for p in model.parameters():
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            (matrices if id(p) in hidden else rest).append(p)
        settings = dict(lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov, weight_decay=cfg.weight_decay,
                        adjust_lr_fn=cfg.adjust_lr)
        precision = ns_precision(cfg.ns_precision, device)
        muon = (torch.optim.Muon(matrices, **settings) if precision == "bf16" and hasattr(torch.optim, "Muon")
                else Fp32Muon(matrices, ns_dtype=NS_DTYPES[precision], **settings))  # the same update
        rest_ids = {id(p) for p in rest}
        groups = [{"params": [p for p in g["params"] if id(p) in rest_ids], "weight_decay": g["weight_decay"]}
                  for g in param_groups(model, cfg.adamw_weight_decay)]
        groups = [g for g in groups if g["params"]]
        adamw = torch.optim.AdamW(groups, lr=cfg.adamw_lr, betas=(cfg.adamw_beta1, cfg.adamw_beta2),
                                  **adamw_kernel(groups, device))
        super().__init__([muon, adamw])


def build_optimizer(cfg, model: nn.Module, device: torch.device):
    """The optimizer the config names; every param group remembers its peak lr as ``base_lr``
    for the schedule to scale."""
    opt = OPTIMIZER.build(cfg, model, device)
    for group in opt.param_groups:
        group["lr"] = group["lr"] * group.get("lr_mult", 1.0)
        group["base_lr"] = group["lr"]
    return opt
