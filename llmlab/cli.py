"""``llmlab <command> [overrides]``: dispatch to the command's Hydra app.

Before Hydra runs a command, `preflight` composes its config for every combination of the
given overrides (sweeps included) and checks it, so a misspelt key, an unknown option or an
impossible combination stops at once with one line naming the key and what is allowed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from pathlib import Path
from typing import Callable, NoReturn

from llmlab.errors import fail
from llmlab.names import path_slug
from llmlab.paths import conf_dir
from llmlab.overrides import (expand_sweeps, first_sweep, hydra_overrides, keep_worker_ranks_out_of_outputs, parse,
                              name_sweep_runs_by_swept_keys, name_train_sweep_by_its_overrides,
                              paths_to_runs_override, quote_free_text, split_args)

# settings whose value is free text: a comma in it is text, not a sweep (outside -m)
TEXT_KEYS = {"sample": ("prompt",)}
# settings that are paths or text: a number typed there is kept as typed (`out=1e5` is the
# directory 1e5, not 100000.0)
_DATA_PATHS = ("cache_dir", "data.path", "data.name", "tokenizer.path")
LITERAL_KEYS = {"sample": ("ckpt", "prompt", "prompt_file", "draft"), "eval": ("ckpt", "text", "cache_dir"),
                "export": ("ckpt", "out"), "report": ("out",), "train": _DATA_PATHS, "tokenize": _DATA_PATHS}

USAGE_COMMANDS = {
    "tokenize": "corpus -> trained tokenizer -> token shards (cached by settings)",
    "train": "train a model; prepares the data first when needed",
    "eval": "score a checkpoint: loss, perplexity, bits per byte; analysis=attention",
    "sample": "generate text from a checkpoint (KV cache, top-k/top-p/min-p, speculative)",
    "report": "compare runs and sweeps: tables with 95% CIs over seeds, paired tests, curves",
    "export": "write a checkpoint as a Hugging Face transformers directory",
}

USAGE = "usage: llmlab <command> [key=value ...] [-m] [--cfg job] [--help]\n\ncommands:\n" + "".join(
    f"  {name:<9} {line}\n" for name, line in USAGE_COMMANDS.items()) + (
    "\n`llmlab <command> --help` shows the command's config groups and settings.\n")

def command_of(name: str):
    """The `llmlab.commands.Command` that module ``llmlab.commands.<name>`` declares."""
    return importlib.import_module(f"llmlab.commands.{name}").COMMAND


# The jobs `preflight` resolved, by their composed config: Hydra composes the same config again
# for its job, and the command runs the job resolved here instead of resolving it twice.
RESOLVED: dict[str, object] = {}
# A single run's whole config (Hydra's settings too) as `preflight` composed it, by the config
# name and the overrides Hydra's run composes it with: that run takes it instead of composing
# the same config a second time (`reuse_composition`; a quarter of a second per command).
COMPOSED: dict[tuple, object] = {}


def config_key(cfg) -> str:
    import json
    return json.dumps(cfg, sort_keys=True, default=str)


def register_parts(command: str | None = None, every_kind: bool = True) -> None:
    """Fill Hydra's ConfigStore with what ``command`` composes (all commands' by default): its
    schema and its groups' registered options. Each command module imports the registries its
    groups need, so ``report`` or ``tokenize`` loads no torch before its work starts.
    ``every_kind``: also the kinds written as one file in a family's package, which means
    importing those modules, torch with them; `main` asks for that only for ``--help``, and
    loads them itself once the settings passed their check or where the config names one."""
    from llmlab.registry import Registry

    for name in [command] if command else USAGE_COMMANDS:
        importlib.import_module(f"llmlab.commands.{name}")
    if every_kind:
        Registry.load_all()


def guarded(fn: Callable) -> Callable:
    """Run a command body; a UserError becomes one line on stderr and exit status 1 (2 for a
    ConfigError, a mistake in the settings), and so does a full disk or a read-only directory."""
    from llmlab.errors import ConfigError, UserError
    from llmlab.files import disk_error

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ConfigError as e:
            fail(str(e), 2)
        except UserError as e:
            fail(str(e), 1)
        except KeyboardInterrupt:
            fail("interrupted", 130)
        except OSError as e:
            problem = disk_error(e, "a file")
            if problem is None:
                raise
            fail(str(problem), 1)
    return wrapper


def _explain(err: Exception, overrides: list[str], compose) -> str:
    """One line for a Hydra composition error, from the exception's own fields: an unknown
    option with the group's options, an unknown key with the keys its schema allows, a value
    of the wrong type with the type expected."""
    import dataclasses

    from hydra.errors import MissingConfigException
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    from llmlab.registry import omegaconf_error

    if isinstance(err, MissingConfigException) and err.missing_cfg_file:
        from llmlab.registry import Registry

        group, _, option = err.missing_cfg_file.rpartition("/")
        registry = Registry.by_group.get(group)  # its kinds written as one file too, loaded now if not before
        options = sorted(set(err.options or []) | set(registry.names() if registry is not None else []))
        return f"{group}={option}: unknown option; allowed: {', '.join(options) or '(none)'}"
    cause = err if isinstance(err, OmegaConfBaseException) else (err.__cause__ or err.__context__)
    if not isinstance(cause, OmegaConfBaseException):
        return str(err).strip().splitlines()[0]
    key = str(getattr(cause, "full_key", "") or "")
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and not dataclasses.is_dataclass(cause.object_type):
        # a plain mapping (Hydra's own settings): its keys, as composed without the bad override
        others = [o for o in overrides if o.lstrip("+~").split("=")[0] != key]
        try:
            cfg = compose(others)
        except Exception:
            cfg = None
        parent = key.rpartition(".")[0]
        node = OmegaConf.select(cfg, parent) if (cfg is not None and parent) else cfg
        if isinstance(node, DictConfig):
            where = f"under '{parent}'" if parent else "at the top level"
            return f"{key}: unknown key; allowed {where}: {', '.join(map(str, node.keys()))}"
    return str(omegaconf_error(cause))


def _group_options(group: str) -> list[str]:
    """A config group's options as Hydra lists them, with its kinds written as one file (whose
    registry is loaded for this), inside an initialised Hydra; [] for a key that is no group."""
    from hydra.core.global_hydra import GlobalHydra

    from llmlab.registry import Registry

    registry = Registry.by_group.get(group)
    try:
        listed = GlobalHydra.instance().config_loader().get_group_options(group)
    except Exception:  # not a group
        listed = []
    return sorted(set(listed) | set(registry.names() if registry is not None else []))


def preflight(command: str, args: list[str], run_overrides: list[str] | None = None) -> None:
    """Compose and check every job of ``args``. ``run_overrides``: the overrides Hydra's run of
    a single job will compose with (`hydra_run_overrides`), when known; the first composition
    then uses them and is kept for that run (`COMPOSED`)."""
    overrides, check = split_args(args)
    if not check:
        return
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    from llmlab.errors import UserError

    resolve = command_of(command).job
    # Hydra's own settings (hydra.run.dir=..., hydra/launcher=joblib, ...) are composed once,
    # with the first combination, so a misspelt one is one line too; that composition serves as
    # the first job's too when it succeeds (one composition less in every run that sets one)
    extra = hydra_overrides(args)
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None, job_name=command):
        try:
            basic = not any(o.lstrip("+").startswith("hydra/sweeper=") for o in extra)  # another has its own types
            combos = expand_sweeps(overrides, _group_options, basic=basic)
        except HydraException as e:
            fail(f"cannot parse the overrides: {str(e).strip().splitlines()[0]}", 2)
        except UserError as e:
            fail(str(e), 2)

        def compose_with(ovs):
            return compose(config_name=command, overrides=ovs)

        def compose_all(ovs):
            return compose(config_name=command, overrides=ovs, return_hydra_config=True)

        reuse = run_overrides if run_overrides is not None and len(combos) == 1 else None
        for i, combo in enumerate(combos):
            try:
                composed = None
                if i == 0 and (extra or reuse):
                    try:
                        composed = compose_all(reuse or combo + extra)
                    except (HydraException, OmegaConfBaseException):
                        pass  # said below: the job's settings on their own first, then Hydra's
                    else:
                        if reuse:
                            import copy
                            COMPOSED[(command, tuple(reuse))] = copy.deepcopy(composed)
                        with open_dict(composed):
                            del composed["hydra"]  # what Hydra's app gets: the job's settings alone
                cfg = OmegaConf.to_container(composed if composed is not None else compose_with(combo), resolve=True)
                line = _not_a_bool(combo, cfg)
                if line is not None:
                    fail(line, 2)
                job = RESOLVED[config_key(cfg)] = resolve(cfg)
                if command_of(command).check_overrides is not None:
                    command_of(command).check_overrides(job, combo)
            except UserError as e:
                fail(str(e), 2)
            except (HydraException, OmegaConfBaseException) as e:
                if _names_an_unloaded_kind(e):
                    raise _KindsLoaded from e
                fail(_group_value_error(combo, command) or _explain(e, combo, compose_with), 2)
            except (ValueError, TypeError):  # Hydra on a group given a number, null or a list of them
                line = _group_value_error(combo, command)
                if line is None:
                    raise
                fail(line, 2)
            if i == 0 and extra and composed is None:
                overrides = combo + extra
                try:
                    compose_all(overrides)
                except (HydraException, OmegaConfBaseException) as e:
                    fail(_explain(e, overrides, compose_all), 2)


def _not_a_bool(overrides: list[str], cfg: dict) -> str | None:
    """OmegaConf turns any number (``cuda_graph=2``) or ``yes``/``on`` into a bool setting's
    true: a mistake would pass in silence. One line for an override that gave a bool setting
    anything but true or false; None when none did."""
    for override in overrides:
        parsed = parse(override)
        if parsed is None or parsed.is_sweep_override() or parsed.is_delete():
            continue
        node: object = cfg
        for part in parsed.key_or_group.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        value = parsed.value()
        if isinstance(node, bool) and not (isinstance(value, bool) or str(value).lower() in ("true", "false")):
            return f"{parsed.key_or_group}: expected true or false, got {value!r}"
    return None


class _KindsLoaded(Exception):
    """`preflight` met an option that is a kind written as one file, not loaded before; it is
    loaded now, and the check starts again."""


def _group_value_error(overrides: list[str], command: str = "train") -> str | None:
    """One line for a config group given a value that is not an option's name (``norm=inf``,
    ``model/ffn=-1``, ``objective=null``, which Hydra reads as a number or null and refuses with
    a ValueError): the group and its options. None when no override is such a case."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    if not GlobalHydra.instance().is_initialized():  # after Hydra's own app gave up
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None, job_name=command):
            return _group_value_error(overrides, command)
    loader = GlobalHydra.instance().config_loader()
    for text in overrides:
        o = parse(text)
        if o is None:
            continue
        value = o.value()
        if isinstance(value, str) or o.is_sweep_override():
            continue
        group = o.key_or_group
        options = loader.get_group_options(group)
        if not options:
            continue
        from llmlab.registry import Registry
        registry = Registry.by_group.get(group)  # its kinds written as one file too, loaded now if not before
        options = sorted(set(options) | set(registry.names() if registry is not None else []))
        try:  # the groups this command composes, from its config without this override
            from hydra import compose
            cfg = compose(config_name=command, overrides=[t for t in overrides if t != text], return_hydra_config=True)
            choices = cfg.hydra.runtime.choices
            groups = sorted(g for g in choices if not g.startswith("hydra"))
        except Exception:
            choices = groups = None
        if groups is not None and group not in groups:
            return f"{group}: llmlab {command} has no such config group; its groups: {', '.join(groups)}"
        shown = text.partition("=")[2]
        what = "takes one option, not a list" if isinstance(value, list) else "is not an option of this group"
        if value is None and choices is not None and choices.get(group) is None:  # an optional group, off by default
            what += f" (it is off unless chosen; ~{group} drops one chosen earlier)"
        return f"{group}: '{shown}' {what}; allowed: {', '.join(sorted(options))}"
    return None


# Hydra's settings that place a run's files: an empty value puts them in the working directory
# (a sweep's subdir: every job in one directory)
RUN_DIR_KEYS = ("hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir")


def _uncreatable_dir(e: OSError) -> str | None:
    """One line for Hydra's making of a run or sweep directory that the file system refuses
    with "no such file" (a parent under /proc, say), or None for any other error: an ENOENT
    raised elsewhere may be a bug, and stays a traceback."""
    import errno
    import os
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    if e.errno != errno.ENOENT or not e.filename or not frames or frames[-1].name not in ("mkdir", "makedirs"):
        return None
    target = Path(os.fsdecode(e.filename))
    parent = next((q for q in target.parents if q.exists()), None)
    where = f"{parent} takes no new directories" if parent is not None and parent.is_dir() else "its parent is missing"
    return (f"cannot create the directory {target}: {where}; set hydra.run.dir (hydra.sweep.dir for -m) to a "
            "directory that can be written")


def _plain_settings(command: str) -> list[str]:
    """The top-level settings of ``command``'s schema that no config group fills (``seed``,
    ``top_p``): the keys a ``~key`` override would quietly reset to their default."""
    import dataclasses

    return [f.name for f in dataclasses.fields(command_of(command).schema)
            if not f.metadata.get("section")
            and (f.default_factory is dataclasses.MISSING or not dataclasses.is_dataclass(f.default_factory()))]


# Hydra's command-line flags that take a value: (short, long)
VALUE_FLAGS = {"--config-path": "-cp", "--config-name": "-cn", "--config-dir": "-cd", "--shell-completion": "-sc",
               "--experimental-rerun": None, "--package": "-p"}


def _flag_values(rest: list[str]) -> list[tuple[str, str | None]]:
    """(long flag, its value or None where the line ends) for each of Hydra's value flags in
    ``rest``, written ``-cd DIR``, ``--config-dir DIR`` or ``--config-dir=DIR``."""
    names = {**{f: f for f in VALUE_FLAGS}, **{s: f for f, s in VALUE_FLAGS.items() if s}}
    found = []
    for i, arg in enumerate(rest):
        flag, eq, value = arg.partition("=")
        if flag in names:
            found.append((names[flag], value if eq else (rest[i + 1] if i + 1 < len(rest) else None)))
    return found


def check_launch_env(command: str) -> None:
    """torchrun's variables, as a shell may have left them (exported by hand, or from another
    job): each read below with int(), and a world of several ranks needs the rendezvous
    address. One line here instead of a ValueError traceback there."""
    import os

    values = {}
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        text = os.environ.get(name, "").strip()
        if not text:
            continue
        if not (text.isascii() and text.isdigit()):
            fail(f"{name}: expected a whole number >= 0 (torchrun sets it), got '{text}'; unset it to run one "
                 "process", 2)
        values[name] = int(text)
    world = values.get("WORLD_SIZE", 1)
    if world == 0:
        fail("WORLD_SIZE: 0 ranks; unset it to run one process, or start the ranks with torchrun", 2)
    if values.get("RANK", 0) >= world:
        fail(f"RANK: {values['RANK']} is not below WORLD_SIZE={world}; start the ranks with torchrun", 2)
    if command == "train" and world > 1:
        missing = [n for n in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(n)]
        if missing:
            fail(f"WORLD_SIZE: {world} ranks, but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                 "set; start the ranks with torchrun --nproc_per_node=N (it sets them), or unset WORLD_SIZE to run "
                 "one process", 2)


def check_hydra_flags(command: str, rest: list[str]) -> None:
    """Hydra's flags that would end in its traceback or a multi-line error, or do what llmlab
    does not: one line each, before anything loads."""
    import os

    dirs = []
    for flag, value in _flag_values(rest):
        if value is None:
            fail(f"{flag}: give a value ({flag} VALUE)", 2)
        if flag == "--config-path":  # replaces llmlab's own configs, so every command's config is lost
            fail("--config-path: llmlab's commands compose the configs they ship; add a directory of your own "
                 "with --config-dir DIR", 2)
        if flag == "--experimental-rerun":  # Hydra reruns a job from a pickle, which runs code as it loads
            fail("--experimental-rerun: not offered; it loads a pickled job, and llmlab loads no pickle. Rerun "
                 "from the run's .hydra/overrides.yaml instead", 2)
        if flag == "--shell-completion":
            fail(f"--shell-completion: not offered for llmlab {command}", 2)
        if flag == "--config-dir":
            path = os.path.expanduser(value)
            if not os.path.isdir(path):
                fail(f"--config-dir: {value} is not a directory", 2)
            dirs.append(path)
    for flag, value in _flag_values(rest):
        if flag == "--config-name" and value != command:
            name = value[:-5] if value.endswith(".yaml") else value
            if not any(os.path.isfile(os.path.join(d, name + ".yaml")) for d in dirs):
                where = f" in --config-dir {', '.join(dirs)}" if dirs else " (give --config-dir DIR with DIR/" \
                        f"{name}.yaml)"
                fail(f"--config-name: no config '{name}'{where}; llmlab {command} composes {command}.yaml", 2)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    RESOLVED.clear()  # one command line's jobs (several calls share a process in tests and notebooks)
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return
    if argv[0] in ("--version", "-V"):
        from llmlab import __version__
        print(f"llmlab {__version__}")
        return
    COMPOSED.clear()
    command, rest = argv[0], argv[1:]
    if command == "report":
        rest = paths_to_runs_override(rest)
    sweeping = bool({"-m", "--multirun"} & set(rest))
    rest = [quote_free_text(a, () if sweeping else TEXT_KEYS.get(command, ()), LITERAL_KEYS.get(command, ()))
            for a in rest]
    if command not in USAGE_COMMANDS:
        sys.stderr.write(f"llmlab: error: unknown command '{command}'; allowed: {', '.join(USAGE_COMMANDS)}\n\n{USAGE}")
        raise SystemExit(2)
    check_hydra_flags(command, rest)
    check_launch_env(command)
    if sweeping and {"--cfg", "-c", "--info"} & set(rest):
        fail("-m cannot be combined with --cfg or --info; drop -m to see one job's config", 2)
    if not sweeping and not {"--help", "-h"} & set(rest):
        sweep = first_sweep(rest)
        if sweep is not None:  # Hydra's own message would end in a traceback
            key, _, value = sweep.partition("=")
            listed = f", or write a list as {key}=[{value}]" if "(" not in value else ""
            fail(f"{key}: '{value}' gives several values, which sweep only with -m "
                 f"(llmlab {command} -m {sweep}); give one value{listed}", 2)
    for arg in rest:  # `hydra.run.dir=$RUN` with $RUN unset would make this directory the run's
        key, eq, value = arg.lstrip("+").partition("=")
        if eq and key in RUN_DIR_KEYS and value.strip().strip("'\"") == "":
            fail(f"{key}: empty; give a directory" + (" per job, or leave it out (each job has its own by default)"
                                                      if key.endswith("subdir") else f" ({key}=. for this one)"), 2)
    deleted = [a[1:].partition("=")[0] for a in rest if a.startswith("~")]
    if deleted and (scalar := set(_plain_settings(command)) & set(deleted)):
        # Hydra deletes a top-level key and the schema's default quietly takes its place
        from llmlab.registry import deletion_error
        fail(str(deletion_error(next(k for k in deleted if k in scalar))), 2)
    showing = bool({"--cfg", "-c", "--info"} & set(rest))
    helping = bool({"--help", "-h"} & set(rest))
    # The kinds written as one file import torch with them (3-4 s): --help lists them all, the
    # rest loads them once the settings have passed their check, or where the config names one,
    # so that a mistake in the settings is one line within a second
    register_parts(command, every_kind=helping)
    if helping:
        from llmlab.help import command_help
        sys.stdout.write(command_help(command))
        return
    final = name_sweep_runs_by_swept_keys(rest)
    if command == "train":
        final = name_train_sweep_by_its_overrides(final)
        final = keep_worker_ranks_out_of_outputs(final)
    if not showing:  # --cfg/--info only show a config: Hydra composes it once, its errors become one line below
        from llmlab.registry import Registry
        try:
            preflight(command, rest, hydra_run_overrides(final))
        except _KindsLoaded:  # the config names a kind written as one file: now loaded, so check again
            preflight(command, rest, hydra_run_overrides(final))
        if command == "train":  # as train ran before: every kind's option offered to Hydra's own composition
            Registry.load_all()  # (torch comes with them, which training needs anyway); the other commands
            # compose with what their check loaded, so a missing checkpoint is one line before torch loads
    rest = final
    app = hydra_app(command, command_of(command))
    sys.argv = [f"llmlab {command}", *rest]
    # Hydra raises what fails in its own work (writing a job's .hydra/ files on a full disk)
    # instead of printing a shortened traceback, so a disk problem there is one line too
    import os
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    worker = command == "train" and int(os.environ.get("WORLD_SIZE") or 1) > 1
    try:
        try:
            try:
                with mode_from_flags(rest), reuse_composition():
                    app()
            except Exception as e:
                if not (showing and _names_an_unloaded_kind(e)):
                    raise
                from hydra.core.global_hydra import GlobalHydra
                GlobalHydra.instance().clear()
                app()  # the config names a kind written as one file: now loaded
        except Exception as e:  # Hydra's MissingConfigException is an OSError too: config errors first
            if showing and (_is_config_error(e) or isinstance(e, (ValueError, TypeError))):
                line = _group_value_error(split_args(rest)[0], command)  # lists the one-file kinds too
                if line is None and not _is_config_error(e):
                    raise
                fail(line or _explain(e, split_args(rest)[0], _composer(command)), 2)
            import yaml
            if isinstance(e, yaml.YAMLError):  # a config file of one's own (-cd DIR) that is not YAML
                mark = getattr(e, "problem_mark", None)
                where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark else "a config file"
                fail(f"{where}: not valid YAML ({getattr(e, 'problem', None) or type(e).__name__})", 2)
            from hydra.errors import ConfigCompositionException
            if isinstance(e, ConfigCompositionException):  # a config of one's own (-cd DIR -cn NAME), which the
                fail(_explain(e, split_args(rest)[0], _composer(command)), 2)  # preflight does not compose
            if isinstance(e, OSError):
                from llmlab.files import disk_error
                problem = disk_error(e, "a file") or _uncreatable_dir(e)
                if problem is not None:
                    fail(str(problem), 1)
            raise
    except SystemExit as e:
        if worker:
            leave_without_finalizing(e.code)
        raise
    if worker:
        leave_without_finalizing(0)


def _names_an_unloaded_kind(e: Exception) -> bool:
    """A composition that failed on an option not registered yet, before every kind was
    loaded: load them (`Registry.load_all`) and say whether the option is there now."""
    from hydra.errors import MissingConfigException

    from llmlab.registry import Registry

    if not isinstance(e, MissingConfigException) or not e.missing_cfg_file or Registry.all_loaded():
        return False
    Registry.load_all()
    group, _, option = e.missing_cfg_file.rpartition("/")
    registry = Registry.by_group.get(group)
    return registry is not None and option in registry


def _is_config_error(e: Exception) -> bool:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException
    return isinstance(e, (HydraException, OmegaConfBaseException))


def _composer(command: str) -> Callable:
    """A ``compose(overrides)`` for `_explain`, after Hydra's own app gave up."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    def compose_with(overrides: list[str]):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None, job_name=command):
            return compose(config_name=command, overrides=overrides, return_hydra_config=True)
    return compose_with


def run() -> NoReturn:
    """The ``llmlab`` command (its console script and ``python -m llmlab``): `main`, then the
    process ends as a normal exit would, without finalizing the interpreter
    (`leave_without_finalizing`). Tearing down the modules torch and its compiler load took
    1.3 to 2.6 s after a training on the 2-core machine (0.4 s after an eval). An exception that
    escapes `main` (a bug: a traceback) still ends the ordinary way."""
    try:
        main()
    except SystemExit as e:
        leave_without_finalizing(e.code)
    leave_without_finalizing(0)


def leave_without_finalizing(code) -> NoReturn:
    """End the process as a normal exit would (threads are joined, every exit handler runs:
    wandb's, logging's, temporary files'; the streams are flushed) but without finalizing the
    interpreter: `run` ends every command this way, and a torchrun worker must.

    With gloo, torch's worker threads release the tensors of finished collectives (which needs
    the GIL) a moment after the caller has seen them complete, and under FSDP2 with torch 2.14
    DTensor's caches keep the process group, and so those threads, alive after
    ``destroy_process_group``. A thread that asks for the GIL while Python 3.11 finalizes is
    killed inside a C++ destructor: "terminate called without an active exception", SIGABRT,
    and torchrun reports the job as failed though it finished. Nothing is left to do once the
    exit handlers ran, so the process ends there, and no thread races the interpreter.
    """
    import atexit
    import os
    import threading
    if code is None:
        code = 0
    elif not isinstance(code, int):
        sys.stderr.write(f"{code}\n")
        code = 1
    for thread in threading.enumerate():  # as Python's own exit does first
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def register_resolvers() -> None:
    from omegaconf import OmegaConf
    if not OmegaConf.has_resolver("slug"):
        OmegaConf.register_new_resolver("slug", path_slug)


def names_mode(args: list[str]) -> bool:
    """Whether the command line sets Hydra's mode itself (``hydra.mode=...`` or a ``hydra/...``
    group), which then decides it, not -m."""
    return any(a.lstrip("+~").startswith(("hydra.mode", "hydra/")) for a in args)


@contextlib.contextmanager
def mode_from_flags(args: list[str]):
    """Hydra composes a command's whole config once only to read ``hydra.mode``, before it
    composes it again to run (0.3-0.5 s a composition). Nothing llmlab ships sets that key, so
    unless the command line does (``hydra.mode=...`` or a ``hydra/...`` group), the mode is
    what -m says, which is what Hydra does when the key is unset: skip that composition."""
    from hydra._internal.hydra import Hydra

    if names_mode(args) or not callable(getattr(Hydra, "get_mode", None)):
        yield
        return
    original = Hydra.get_mode
    Hydra.get_mode = lambda self, config_name, overrides: None
    try:
        yield
    finally:
        Hydra.get_mode = original


def hydra_run_overrides(args: list[str]) -> list[str] | None:
    """The overrides Hydra's run of ``args`` composes its config with, where that is certain:
    one job (no -m, no flag at all), every argument a key=value override, and the mode left to
    `mode_from_flags`, so Hydra appends ``hydra.mode=RUN`` to them. None otherwise."""
    if any(a.startswith("-") or "=" not in a for a in args):
        return None
    if names_mode(args):
        return None
    if any((o := parse(a)) is None or o.is_sweep_override() for a in args):
        return None
    return [*args, "hydra.mode=RUN"]


@contextlib.contextmanager
def reuse_composition():
    """While Hydra runs a command: its composition of a single run's config returns the one
    `preflight` made with the same config name and overrides (`COMPOSED`, each used once), so
    the config is composed once per command, not twice. In a sweep, Hydra composes each job's
    config to check the batch, then again to launch the job: the launch takes the check's
    composition (each used once, in order). Any other composition is Hydra's own."""
    try:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from hydra.plugins.sweeper import Sweeper
        from hydra.types import RunMode
    except ImportError:  # another Hydra: compose as it does
        yield
        return
    original = getattr(ConfigLoaderImpl, "load_configuration", None)
    original_sweep = getattr(ConfigLoaderImpl, "load_sweep_config", None)
    original_check = getattr(Sweeper, "validate_batch_is_legal", None)
    if not all(callable(f) for f in (original, original_sweep, original_check)):
        yield
        return
    checked: dict[tuple, list] = {}  # each job's config as the batch check composed it
    checking = False

    def load_configuration(self, config_name, overrides, run_mode, *args, **kwargs):
        kept = COMPOSED.pop((config_name, tuple(overrides)), None) if run_mode == RunMode.RUN else None
        return kept if kept is not None else original(self, config_name, overrides, run_mode, *args, **kwargs)

    def load_sweep_config(self, master_config, sweep_overrides):
        key = (id(master_config), tuple(sweep_overrides))
        if not checking and checked.get(key):
            return checked[key].pop(0)  # the check read it and let it go: the launch may have it
        cfg = original_sweep(self, master_config, sweep_overrides)
        if checking:
            checked.setdefault(key, []).append(cfg)
        return cfg

    def validate_batch_is_legal(self, batch):
        nonlocal checking
        checking = True
        try:
            return original_check(self, batch)
        finally:
            checking = False

    ConfigLoaderImpl.load_configuration = load_configuration
    ConfigLoaderImpl.load_sweep_config = load_sweep_config
    Sweeper.validate_batch_is_legal = validate_batch_is_legal
    try:
        yield
    finally:
        ConfigLoaderImpl.load_configuration = original
        ConfigLoaderImpl.load_sweep_config = original_sweep
        Sweeper.validate_batch_is_legal = original_check


def hydra_app(command: str, declared) -> Callable:
    """The Hydra app of a `Command`: its body gets the job `preflight` resolved for this
    composed config, or resolves it (``--cfg``/``--info`` skip the preflight)."""
    import hydra

    register_resolvers()

    @hydra.main(version_base=None, config_path=str(conf_dir()), config_name=command)
    def app(cfg) -> None:
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import OmegaConf

        from llmlab import console

        hc = HydraConfig.get()
        run_dir = Path(hc.runtime.output_dir)
        # the job's log (Hydra's <command>.log) keeps what the command prints, not just log records
        log = run_dir / f"{hc.job.name}.log" if hc.job_logging and hc.job_logging.get("handlers") else None
        composed = OmegaConf.to_container(cfg, resolve=True)
        job = RESOLVED.pop(config_key(composed), None)

        def body() -> None:
            declared.run(job if job is not None else declared.job(composed), run_dir)

        from llmlab.files import open_append

        with console.keeping(log, open_append) if log is not None else contextlib.nullcontext():
            guarded(body)()

    return app
