"""A training run as declared parts: `RunData` (the prepared data and what follows from it)
and `Parts` (model, optimizer, schedule, sampler, evaluator...), each built once from the job
and frozen, so the trainer is a loop over them.

A part whose state decides the next step saves and loads its own (``state_dict`` /
``load_state_dict``), and its field in `Parts` says where that state goes in a checkpoint
(`Slot`, in the field's metadata). `llmlab.train.resume` saves and restores every such part
by iterating over the fields: a new stateful part is a new field with its slot, and no edit
of resume.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterator, Mapping

import numpy as np


@dataclass(frozen=True)
class Slot:
    """Where a part's state goes in a checkpoint. ``file``: ``state`` (state.json, rank 0's,
    JSON-safe; the key ``""`` spreads it over the top level), ``trainer`` (trainer.pt, rank
    0's) or ``ranks`` (trainer.pt, a list of every rank's, in rank order). ``what``: the part
    in words, for a damaged one. ``default``: what a state.json without the key holds (None:
    the key is required). ``split``: a ``ranks`` state's fields, each kept as its own list
    under ``key.format(field)``. ``saved_as``: what saves and loads the part, given the part,
    the bundle and the ranks (``dist``): something with ``state_dict`` and ``load_state_dict``,
    or None where this run keeps no state of it; by default the part itself."""

    file: str
    key: str
    what: str
    default: Any = None
    split: tuple[str, ...] = ()
    saved_as: Callable[[Any, Any, Any], Any] | None = None

    def where(self) -> str:
        if self.file == "state":
            return f"{self.what} (state.json{' ' + self.key if self.key else ''})"
        return f"{self.what} (trainer.pt)"


def whole_optimizer(optimizer: Any, parts: "Parts", dist: Any) -> Any:
    """The optimizer as a checkpoint holds it: its whole state (under FSDP gathered from every
    rank's shards, so every rank takes part in a save), loaded back into this run's sharding."""
    from llmlab.train.distributed import WholeOptimizer

    return WholeOptimizer(parts.model, optimizer, dist)


def when_scaling(scaler: Any, parts: "Parts", dist: Any) -> Any:
    """The loss scaler, where it scales (fp16); otherwise it has no state worth a checkpoint."""
    return scaler if scaler.is_enabled() else None


def slot(where: Slot, **kwargs: Any) -> Any:
    """A `Parts` field whose part is saved in ``where``."""
    return field(metadata={"slot": where}, **kwargs)


@dataclass(frozen=True)
class RunData:
    """The prepared data of a run, and what follows from it: the model's spec (its vocabulary
    is the data's), the window length and the tokens each step trains on."""

    prepared: Any  # `llmlab.data.prepare.Prepared`
    spec: Any  # `llmlab.model.config.ModelSpec`
    train_tokens: np.ndarray
    val_tokens: np.ndarray
    tokens_per_step: int
    tokenizer: Any

    @property
    def seq_len(self) -> int:
        return self.spec.model.max_seq_len

    @cached_property
    def bytes_per_token_val(self) -> float:
        return self.prepared.bytes_per_token("val")

    @cached_property
    def token_counts(self) -> np.ndarray:
        """Token frequencies of the training split, counted once (at the first save)."""
        return self.prepared.token_counts("train")


@dataclass(frozen=True)
class Parts:
    """Every part of a run the loop steps, built once. The fields with a `Slot` are the parts
    whose state decides the next step, saved and restored by `llmlab.train.resume` as their
    slots say (the optimizer's whole state gathered from every rank's shards, the loss scaler
    only when it scales); the model's weights and the weight average go to files of their own."""

    model: Any  # `llmlab.model.transformer.Transformer`
    wrapped: Any  # the model as the ranks share it (DDP or FSDP), or the model
    step_model: Any  # what the step calls: ``wrapped``, compiled with train.compile
    optimizer: Any = slot(Slot("trainer", "optimizer", "optimizer state", saved_as=whole_optimizer))
    scaler: Any = slot(Slot("trainer", "scaler", "loss scaler state", saved_as=when_scaling))
    schedule: Any = None  # the learning-rate multiplier by step
    amp: Any = None  # the forward's autocast context
    progress: Any = slot(Slot("state", "", "step count"), default=None)  # `llmlab.train.state.Progress`
    sampler: Any = slot(Slot("state", "data_rng", "data position"), default=None)  # the training windows' stream
    window: Any = slot(Slot("state", "log_window", "log window", default={}), default=None)  # `LogWindow`
    random: Any = slot(Slot("ranks", "{}_rng_by_rank", "random state", split=("torch", "mask")), default=None)
    distiller: Any = slot(Slot("ranks", "distill_rng_by_rank", "distillation state"), default=None)
    ema: Any = None  # the weights' moving average (`WeightAverage`), or None: saved as its own file
    evaluator: Any = None  # `llmlab.train.evaluation.Evaluator`
    declared: Mapping[str, Any] = field(default_factory=dict)  # the parts of declared groups (`llmlab.train.groups`), by group

    def stateful(self) -> Iterator[tuple[str, Any, Slot]]:
        """(name, part, slot) of each part present that a checkpoint holds, in field order, then
        the declared groups' parts that have a state, each in trainer.pt under its group."""
        for f in dataclasses.fields(self):
            part = getattr(self, f.name)
            if part is not None and "slot" in f.metadata:
                yield f.name, part, f.metadata["slot"]
        for name, part in self.declared.items():
            if hasattr(part, "state_dict") and hasattr(part, "load_state_dict"):
                yield name, part, Slot("trainer", name, f"{name} state")

    def checkpointed(self, dist: Any) -> list[tuple[str, Any, Slot]]:
        """(name, what saves and loads it, slot) of each part a checkpoint of this run holds."""
        out = []
        for name, part, where in self.stateful():
            saved = part if where.saved_as is None else where.saved_as(part, self, dist)
            if saved is not None:
                out.append((name, saved, where))
        return out
