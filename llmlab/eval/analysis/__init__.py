"""Analyses ``llmlab eval analysis=<kind>`` runs after scoring (config group ``analysis``).
Each kind is one file in this package, its class registered with ``@ANALYSIS.register(name)``
and holding its nested ``Config``; the package finds them all (`llmlab.registry.discover`)."""

from __future__ import annotations

from llmlab.registry import Registry, discover

# torch is not imported here: `llmlab eval` checks its settings (this registry's schemas among
# them) before it loads torch
ANALYSIS = Registry("analysis", group="analysis")


discover(__name__, __path__)  # every kind's file, each registering itself
