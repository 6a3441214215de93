"""``probe=none``: nothing is measured beyond the loss."""

from __future__ import annotations

from dataclasses import dataclass

from llmlab.train.groups.probe import PROBE, Probe


@PROBE.register("none")
class NoProbe(Probe):
    """Nothing measured beyond the training loss and the run's own figures."""

    @dataclass
    class Config:
        kind: str = "none"
