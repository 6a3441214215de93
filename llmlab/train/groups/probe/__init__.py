"""``probe``: what a run measures of its model at every log step, beside the loss: a group
declared as this one package (`llmlab.train.groups`). A probe reads the model and the run's
data and changes neither, so it stays out of the run id: a run resumes with another probe."""

from __future__ import annotations

from typing import Any, Mapping

from llmlab.registry import Registry, discover

PROBE = Registry("probe", group="probe", default="none", watches=True)


class Probe:
    """A probe of one run: built with its checked Config, the model and the run's data."""

    def __init__(self, cfg: Any, model: Any, data: Any) -> None:
        self.cfg, self.model, self.data = cfg, model, data

    def measure(self, step: int) -> Mapping[str, float]:
        """The figures at ``step``, by name."""
        return {}


discover(__name__, __path__)
