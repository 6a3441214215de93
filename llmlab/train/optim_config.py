"""The optimizers' schema (config group ``optim``): each kind's Config dataclass. No torch
here, so composing a config imports none; the classes that build the optimizers are in
`llmlab.train.optim`, imported when one is built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmlab.errors import ConfigError
from llmlab.registry import Checked, Registry, bounded, choice

OPTIMIZER = Registry("optim", group="optim", impl="llmlab.train.optim")


def check_torch_has(name: str, since: str, prefix: str) -> None:
    """An optimizer kind that wraps ``torch.optim.<name>`` on a torch without it: one line."""
    import torch

    if not hasattr(torch.optim, name):
        raise ConfigError(f"{prefix}: optim={name.lower()} needs torch.optim.{name} (torch >= {since}); this torch is "
                          f"{torch.__version__}; use optim=adamw or upgrade torch")


@OPTIMIZER.option("adamw")
@dataclass
class AdamWConfig:
    mup: ClassVar[bool] = True  # Adam's update is scale-free per coordinate: muP's Adam rules hold (model.parametrization=mup)
    kind: str = "adamw"
    lr: float = bounded(3e-3, above=0)  # peak learning rate; the schedule scales it
    beta1: float = bounded(0.9, at_least=0, below=1)
    beta2: float = bounded(0.95, at_least=0, below=1)
    eps: float = bounded(1e-8, above=0)
    weight_decay: float = bounded(0.1, at_least=0)
    decay_embeddings: bool = False


@OPTIMIZER.option("sgd")
@dataclass
class SGDConfig(Checked):
    kind: str = "sgd"
    lr: float = bounded(0.1, above=0)
    momentum: float = bounded(0.9, at_least=0, below=1)
    nesterov: bool = True
    weight_decay: float = bounded(0.0, at_least=0)
    decay_embeddings: bool = False

    def check(self, prefix: str) -> None:
        if self.nesterov and self.momentum == 0:
            raise ConfigError(f"{prefix}.nesterov: needs {prefix}.momentum > 0")


@OPTIMIZER.option("lion")
@dataclass
class LionConfig:
    mup: ClassVar[bool] = True  # a sign update: scale-free per coordinate, as Adam's
    kind: str = "lion"
    lr: float = bounded(3e-4, above=0)
    beta1: float = bounded(0.9, at_least=0, below=1)
    beta2: float = bounded(0.99, at_least=0, below=1)
    weight_decay: float = bounded(1.0, at_least=0)
    decay_embeddings: bool = False


@OPTIMIZER.option("adafactor")
@dataclass
class AdafactorConfig(Checked):
    kind: str = "adafactor"
    lr: float = bounded(1e-2, above=0)  # peak learning rate; the schedule scales it
    beta2_decay: float = bounded(-0.8, at_most=0)  # the second moment's decay at step t is 1 - t^beta2_decay
    eps: float = bounded(1e-3, at_least=0)  # updates are clipped relative to max(eps, RMS of the parameter)
    weight_decay: float = bounded(0.0, at_least=0)
    decay_embeddings: bool = False

    def check(self, prefix: str) -> None:
        check_torch_has("Adafactor", "2.5", prefix)


@OPTIMIZER.option("muon")
@dataclass
class MuonConfig:
    several: ClassVar[bool] = True  # Muon for the matrices and AdamW for the rest: two optimizers in one
    kind: str = "muon"
    # with match_rms_adamw an update's RMS is AdamW's, so the lr is on AdamW's scale (Liu et al. 2025,
    # Moonlight); 0.02 suits the "original" rule. On the default run at 500 steps: 3e-3 and 5e-3 gave
    # validation losses within 0.01, 1e-2 0.04 worse (bench/README.md, the default recipe)
    lr: float = bounded(4e-3, above=0)
    momentum: float = bounded(0.95, at_least=0, below=1)  # at 1 the buffer never takes a gradient; above, it diverges
    nesterov: bool = True
    weight_decay: float = bounded(0.0, at_least=0)
    adjust_lr: str | None = choice("match_rms_adamw", (None, "original", "match_rms_adamw"))  # scale updates so one lr suits every shape
    # the Newton-Schulz iterations' precision; auto: bf16 on CUDA (torch's Muon), fp32 elsewhere
    ns_precision: str = choice("auto", ("auto", "bf16", "fp32"))
    # the embeddings', head's and norms' lr: on the default run at 500 steps (qknorm attention),
    # 3e-3, 6e-3, 1.2e-2 and 2.4e-2 gave validation losses 3.758, 3.630, 3.573 and 3.506
    adamw_lr: float = bounded(2.4e-2, above=0)
    adamw_beta1: float = bounded(0.9, at_least=0, below=1)
    adamw_beta2: float = bounded(0.95, at_least=0, below=1)
    adamw_weight_decay: float = bounded(0.1, at_least=0)

