"""The commands. Each module declares itself once, as a `Command`: its schema, the config
groups whose sections it types, and its body, which receives the resolved job."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from llmlab.registry import Registry, parse_dataclass, settings_lines, store_schema, with_groups


@dataclass(frozen=True)
class Command:
    """``llmlab <name>``: ``schema`` is its settings' dataclass (stored as ``schema/<name>``,
    which its YAML builds on); ``sections`` the config-group sections it holds, each resolved
    by its registry into that kind's typed Config (None stays None); ``run(job, run_dir)`` the
    body. ``resolve`` replaces the default resolution (``train`` builds a `TrainJob`),
    ``help_lines`` the default ``--help`` settings (the schema's fields and comments), and
    ``check_overrides`` checks a resolved job against its overrides before any work starts.
    ``groups``: whole config groups declared with their registries (`declared_groups`): each
    adds its section to the schema and its default option to what Hydra composes."""

    name: str
    schema: type
    run: Callable[[Any, Path], None]
    sections: Mapping[str, Registry] = field(default_factory=dict)
    resolve: Callable[[Mapping[str, Any]], Any] | None = None
    help_lines: Callable[[], list[str]] | None = None
    # (job, the job's command-line overrides): a check that needs what the user wrote, not only
    # the composed result (``train init=``: a setting that contradicts the source)
    check_overrides: Callable[[Any, list[str]], None] | None = None
    groups: tuple[Registry, ...] = ()

    def __post_init__(self) -> None:
        store_schema(self.name, with_groups(self.schema, self.groups, for_hydra=True))

    def job(self, cfg: Mapping[str, Any]) -> Any:
        """The composed config, checked and typed once: what ``run`` receives."""
        cfg = {k: v for k, v in cfg.items() if k != "hydra"}
        if self.resolve is not None:
            return self.resolve(cfg)
        job = parse_dataclass(self.schema, cfg, "")
        typed = {key: registry.config(getattr(job, key), key) for key, registry in self.sections.items()
                 if getattr(job, key) is not None}
        return dataclasses.replace(job, **typed)

    def settings_help(self) -> list[str]:
        return self.help_lines() if self.help_lines is not None else settings_lines(self.schema)


def command_of(name: str) -> Command:
    """The `Command` that module ``llmlab.commands.<name>`` declares."""
    import importlib
    return importlib.import_module(f"llmlab.commands.{name}").COMMAND
