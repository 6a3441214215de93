"""``logger=none``: no experiment tracker."""

from __future__ import annotations

from dataclasses import dataclass

from llmlab.train.loggers import LOGGER, Logger

@LOGGER.register("none")
class NoLogger(Logger):
    """No experiment tracker; metrics.jsonl in the run directory is always written."""

    @dataclass
    class Config:
        kind: str = "none"
