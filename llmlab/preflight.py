"""Every job checked before any directory exists: `CheckJobs`, a Hydra callback listed first
in every command's ``hydra.callbacks``.

Hydra composes a command's config, then calls its callbacks' ``on_run_start`` (one job) or
``on_multirun_start`` (a sweep), and only then makes a run or sweep directory. There the
job's settings are resolved into the command's typed job (`llmlab.commands.Command.job`),
which checks every section; a sweep composes and resolves each combination of its values
(Hydra's compose API, inside the running app). A mistake ends the command there with one
line naming the key and what is allowed (`llmlab.mistakes`); Hydra would turn an exception
into a warning and go on, so the callback ends the command itself.
"""

from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback

from llmlab.errors import fail


class CheckJobs(Callback):
    """``command``: the llmlab command whose config this is (its YAML names it)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def on_run_start(self, config: Any, config_name: str | None = None, **kwargs: Any) -> None:
        _stopping_on_a_bug(self._check_run, config, config_name)

    def on_multirun_start(self, config: Any, config_name: str | None = None, **kwargs: Any) -> None:
        _stopping_on_a_bug(self._check_sweep, config, config_name)

    def _check_run(self, config: Any, config_name: str | None) -> None:
        from omegaconf import OmegaConf

        overrides = OmegaConf.to_container(config.hydra.overrides.task)
        _checked(self.command, config_name or self.command, [lambda: job_settings(config)], [overrides])

    def _check_sweep(self, config: Any, config_name: str | None) -> None:
        from hydra import compose
        from hydra.errors import HydraException
        from omegaconf import OmegaConf

        from llmlab import mistakes
        from llmlab.errors import UserError
        from llmlab.overrides import expand_sweeps

        overrides = OmegaConf.to_container(config.hydra.overrides.task)
        basic = config.hydra.runtime.choices.get("hydra/sweeper") == "basic"  # another has its own types
        try:
            combos = expand_sweeps(overrides, mistakes.group_options, basic=basic)
        except HydraException as e:
            fail(f"cannot parse the overrides: {str(e).strip().splitlines()[0]}", 2)
        except UserError as e:
            fail(str(e), 2)
        name = config_name or self.command
        _checked(self.command, name, [lambda combo=combo: job_settings(compose(config_name=name, overrides=combo))
                                      for combo in combos], combos)


def _stopping_on_a_bug(check, *args: Any) -> None:
    """Hydra turns an exception in a callback into a warning and goes on to make the directory
    and run the job: a mistake is one line (`_checked`), and anything else, a bug, ends the
    command here with its traceback."""
    try:
        check(*args)
    except Exception:
        import traceback
        traceback.print_exc()
        raise SystemExit(1) from None


def job_settings(config: Any) -> dict:
    """The job's settings of a composed config, resolved, without Hydra's own: what the
    command's app receives (Hydra hands it the config without ``hydra``)."""
    from omegaconf import OmegaConf

    keys = [k for k in config if k != "hydra"]
    return OmegaConf.to_container(OmegaConf.masked_copy(config, keys), resolve=True)


def _checked(command: str, config_name: str, configs: list, combos: list[list[str]]) -> None:
    """Resolve each job: ``configs`` holds, for each, a function that gives its settings
    (resolving them, and composing them for a sweep's job, may fail too)."""
    from hydra import compose
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from llmlab import mistakes
    from llmlab.commands import command_of
    from llmlab.errors import UserError

    declared = command_of(command)

    def compose_with(overrides: list[str]):
        return compose(config_name=config_name, overrides=overrides, return_hydra_config=True)

    for settings, combo in zip(configs, combos):
        try:
            try:
                cfg = settings()
            except HydraException as e:
                if not mistakes.names_an_unloaded_kind(e):
                    raise
                cfg = settings()  # the combination names a kind written as one file: loaded now
            line = mistakes.not_a_bool(combo, cfg)
            if line is not None:
                fail(line, 2)
            job = declared.job(cfg)
            if declared.check_overrides is not None:
                declared.check_overrides(job, combo)
        except UserError as e:
            fail(str(e), 2)
        except (HydraException, OmegaConfBaseException) as e:
            fail(mistakes.group_value_error(combo, command) or mistakes.explain(e, combo, compose_with), 2)
        except (ValueError, TypeError):  # Hydra on a group given a number, null or a list of them
            line = mistakes.group_value_error(combo, command)
            if line is None:
                raise
            fail(line, 2)
