"""Every mistake on the command line, in words: one line that names the key and what is
allowed, with exit status 2 (a mistake in the settings) or 1 (the machine refused: a full
disk, a directory that cannot be made). `llmlab.cli` reads the command line; what it finds
wrong is worded here, and so is what Hydra refuses when it composes a command's config."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from llmlab.errors import fail
from llmlab.overrides import first_sweep, parse, split_args
from llmlab.paths import conf_dir


def explain(err: Exception, overrides: list[str], compose) -> str:
    """One line for a Hydra composition error, from the exception's own fields: an unknown
    option with the group's options, an unknown key with the keys its schema allows, a value
    of the wrong type with the type expected."""
    import dataclasses

    from hydra.errors import MissingConfigException
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    from llmlab.registry import omegaconf_error

    if isinstance(err, MissingConfigException) and err.missing_cfg_file:
        group, _, option = err.missing_cfg_file.rpartition("/")
        options = _with_kinds(group, err.options or [])
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



def not_a_bool(overrides: list[str], cfg: dict) -> str | None:
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



def group_value_error(overrides: list[str], command: str = "train") -> str | None:
    """One line for a config group given a value that is not an option's name (``norm=inf``,
    ``model/ffn=-1``, ``objective=null``, which Hydra reads as a number or null and refuses with
    a ValueError): the group and its options. None when no override is such a case."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    if not GlobalHydra.instance().is_initialized():  # after Hydra's own app gave up
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None, job_name=command):
            return group_value_error(overrides, command)
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
        options = _with_kinds(group, options)
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


def uncreatable_dir(e: OSError) -> str | None:
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


def plain_settings(command: str) -> list[str]:
    """The top-level settings of ``command``'s schema that no config group fills (``seed``,
    ``top_p``): the keys a ``~key`` override would quietly reset to their default."""
    import dataclasses

    from llmlab.commands import command_of

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


def config_dirs(rest: list[str]) -> tuple[str, ...]:
    """The directories ``--config-dir`` adds to where configs are looked up, as given."""
    import os

    return tuple(os.path.expanduser(value) for flag, value in _flag_values(rest)
                 if flag == "--config-dir" and value is not None)


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



def names_an_unloaded_kind(e: Exception) -> bool:
    """A composition that failed on an option not registered yet, before every kind was
    loaded: load them (`Registry.load_all`) and say whether the option is there now."""
    from hydra.errors import MissingConfigException

    from llmlab.help import group_listing
    from llmlab.registry import Registry

    if not isinstance(e, MissingConfigException) or not e.missing_cfg_file or Registry.all_loaded():
        return False
    Registry.load_all()
    group, _, option = e.missing_cfg_file.rpartition("/")
    # a registry's kind, or what registering one stores (``model=mla``: the tiny model with it)
    return option in group_listing(group)[0]


def is_config_error(e: Exception) -> bool:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException
    return isinstance(e, (HydraException, OmegaConfBaseException))


def composer(command: str) -> Callable:
    """A ``compose(overrides)`` for `_explain`, after Hydra's own app gave up."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    def compose_with(overrides: list[str]):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None, job_name=command):
            return compose(config_name=command, overrides=overrides, return_hydra_config=True)
    return compose_with




def check_line(command: str, rest: list[str], commands: dict, usage: str) -> None:
    """What is wrong with the command line as typed, found before anything loads: an unknown
    command, Hydra's flags it cannot take, torchrun's variables left in the shell, a sweep
    without -m, an empty run directory, a setting deleted with ``~``."""
    if command not in commands:
        sys.stderr.write(f"llmlab: error: unknown command '{command}'; allowed: {', '.join(commands)}\n\n{usage}")
        raise SystemExit(2)
    check_hydra_flags(command, rest)
    check_launch_env(command)
    sweeping = bool({"-m", "--multirun"} & set(rest))
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
    if deleted and (scalar := set(plain_settings(command)) & set(deleted)):
        # Hydra deletes a top-level key and the schema's default quietly takes its place
        from llmlab.registry import deletion_error
        fail(str(deletion_error(next(k for k in deleted if k in scalar))), 2)


def after_hydra(e: Exception, command: str, rest: list[str]) -> None:
    """One line for what Hydra's app raised, where it is a mistake in the settings (exit 2)
    or a refusal of the file system (exit 1); anything else (a bug) is raised again."""
    overrides = split_args(rest)
    try:  # what Hydra composed, with a sweep's first value of each swept key
        from llmlab.overrides import expand_sweeps, hydra_overrides
        overrides = expand_sweeps(overrides)[0] + hydra_overrides(rest)
    except Exception:  # an override Hydra's grammar refuses: said from the error alone
        pass
    if is_config_error(e) or isinstance(e, (ValueError, TypeError)):  # MissingConfigException is an OSError too
        line = group_value_error(overrides, command)  # lists the kinds written as one file too
        if line is None and not is_config_error(e):
            raise e
        fail(line or explain(e, overrides, composer(command)), 2)
    import yaml
    if isinstance(e, yaml.YAMLError):  # a config file of one's own (-cd DIR) that is not YAML
        mark = getattr(e, "problem_mark", None)
        where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark else "a config file"
        fail(f"{where}: not valid YAML ({getattr(e, 'problem', None) or type(e).__name__})", 2)
    if isinstance(e, OSError):
        from llmlab.files import disk_error
        problem = disk_error(e, "a file") or uncreatable_dir(e)
        if problem is not None:
            fail(str(problem), 1)
    raise e


def group_options(group: str) -> list[str]:
    """A config group's options as Hydra lists them, with its kinds written as one file, inside
    an initialised Hydra; [] for a key that is no group."""
    from hydra.core.global_hydra import GlobalHydra

    try:
        listed = GlobalHydra.instance().config_loader().get_group_options(group)
    except Exception:  # not a group
        listed = []
    return _with_kinds(group, listed)


def _with_kinds(group: str, listed) -> list[str]:
    """``listed`` options of ``group`` with what every kind stores there once registered (its
    registry's kinds, and options such as ``model=mla``, the tiny model with a kind), those
    written as one file too: loaded now if not before."""
    from llmlab.help import group_listing
    from llmlab.registry import Registry

    Registry.load_all()
    return sorted(set(listed) | set(group_listing(group)[0]))
