"""The optimizers' schema (config group ``optim``): each kind's Config dataclass. No torch
here, so composing a config imports none; the classes that build the optimizers are in
`llmlab.train.optim`, imported when one is built."""

from __future__ import annotations

from dataclasses import dataclass

from llmlab.errors import ConfigError
from llmlab.registry import Registry, choice

OPTIMIZER = Registry("optim", group="optim", impl="llmlab.train.optim")


def check_lr_betas_decay(cfg, prefix: str) -> None:
    """The checks AdamW and Lion share: a positive lr, betas in [0, 1), weight decay >= 0."""
    if not cfg.lr > 0:
        raise ConfigError(f"{prefix}.lr: must be > 0, got {cfg.lr}")
    for key in ("beta1", "beta2"):
        if not 0 <= getattr(cfg, key) < 1:
            raise ConfigError(f"{prefix}.{key}: must be in [0, 1), got {getattr(cfg, key)}")
    check_non_negative(cfg, prefix, "weight_decay")


def check_torch_has(name: str, since: str, prefix: str) -> None:
    """An optimizer kind that wraps ``torch.optim.<name>`` on a torch without it: one line."""
    import torch

    if not hasattr(torch.optim, name):
        raise ConfigError(f"{prefix}: optim={name.lower()} needs torch.optim.{name} (torch >= {since}); this torch is "
                          f"{torch.__version__}; use optim=adamw or upgrade torch")


def check_non_negative(cfg, prefix: str, *keys: str) -> None:
    for key in keys:
        if getattr(cfg, key) < 0:
            raise ConfigError(f"{prefix}.{key}: must be >= 0, got {getattr(cfg, key)}")


@OPTIMIZER.option("adamw")
@dataclass
class AdamWConfig:
    kind: str = "adamw"
    lr: float = 3e-3  # peak learning rate; the schedule scales it
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    decay_embeddings: bool = False

    def check(self, prefix: str) -> None:
        check_lr_betas_decay(self, prefix)


@OPTIMIZER.option("sgd")
@dataclass
class SGDConfig:
    kind: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 0.0
    decay_embeddings: bool = False

    def check(self, prefix: str) -> None:
        if not self.lr > 0:
            raise ConfigError(f"{prefix}.lr: must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"{prefix}.momentum: must be in [0, 1), got {self.momentum}")
        if self.nesterov and self.momentum == 0:
            raise ConfigError(f"{prefix}.nesterov: needs {prefix}.momentum > 0")
        check_non_negative(self, prefix, "weight_decay")


@OPTIMIZER.option("lion")
@dataclass
class LionConfig:
    kind: str = "lion"
    lr: float = 3e-4
    beta1: float = 0.9
    beta2: float = 0.99
    weight_decay: float = 1.0
    decay_embeddings: bool = False

    def check(self, prefix: str) -> None:
        check_lr_betas_decay(self, prefix)


@OPTIMIZER.option("adafactor")
@dataclass
class AdafactorConfig:
    kind: str = "adafactor"
    lr: float = 1e-2  # peak learning rate; the schedule scales it
    beta2_decay: float = -0.8  # the second moment's decay at step t is 1 - t^beta2_decay
    eps: float = 1e-3  # updates are clipped relative to max(eps, RMS of the parameter)
    weight_decay: float = 0.0
    decay_embeddings: bool = False

    def check(self, prefix: str) -> None:
        if not self.lr > 0:
            raise ConfigError(f"{prefix}.lr: must be > 0, got {self.lr}")
        check_non_negative(self, prefix, "weight_decay", "eps")
        check_torch_has("Adafactor", "2.5", prefix)


@OPTIMIZER.option("muon")
@dataclass
class MuonConfig:
    kind: str = "muon"
    lr: float = 0.02
    momentum: float = 0.95
    nesterov: bool = True
    weight_decay: float = 0.0
    adjust_lr: str | None = choice("match_rms_adamw", (None, "original", "match_rms_adamw"))  # scale updates so one lr suits every shape
    adamw_lr: float = 3e-3
    adamw_beta1: float = 0.9
    adamw_beta2: float = 0.95
    adamw_weight_decay: float = 0.1

    def check(self, prefix: str) -> None:
        if not self.lr > 0 or not self.adamw_lr > 0:
            raise ConfigError(f"{prefix}.lr and {prefix}.adamw_lr: must be > 0")
        check_non_negative(self, prefix, "weight_decay", "adamw_weight_decay")
        check_torch_has("Muon", "2.9", prefix)
