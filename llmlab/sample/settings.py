"""The sampling rules' settings (`SamplingConfig`, which `llmlab.sample.generate` applies),
in a module without torch: ``llmlab sample`` checks them before torch loads, so a mistyped
one is one line within a second, as ``train``'s are."""

from __future__ import annotations

from dataclasses import dataclass

from llmlab.errors import ConfigError
from llmlab.registry import bounded


@dataclass
class SamplingConfig:
    max_new_tokens: int = bounded(200, at_least=0)
    temperature: float = bounded(0.8, at_least=0)  # 0 = greedy
    top_k: int | None = bounded(None, at_least=1)
    top_p: float = bounded(1.0, above=0, at_most=1)
    min_p: float = bounded(0.0, at_least=0, below=1)  # keep tokens with p >= min_p * max p (Nguyen et al. 2024); 0 = off
    repetition_penalty: float = bounded(1.0, above=0)  # CTRL's penalty on tokens already in the text (Keskar et al. 2019); 1 = off


def check_threads(value, key: str = "threads") -> None:
    """``llmlab sample threads=``: auto (`llmlab.sample.threads`) or a count of at least 1."""
    if not (value == "auto" or isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise ConfigError(f"{key}: must be auto or a whole number of threads, at least 1; got {value!r}")
