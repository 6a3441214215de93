"""``llmlab <command> [overrides]``: dispatch to the command's Hydra app.

Before Hydra runs a command, `preflight` composes its config for every combination of the
given overrides (sweeps included) and checks it, so a misspelt key, an unknown option or an
impossible combination stops at once with one line naming the key and what is allowed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
import re
import sys
from pathlib import Path
from typing import Callable, NoReturn

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

# Hydra flags that take a value, and flags after which no config checking makes sense.
_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                "--config-dir", "-cd", "--experimental-rerun"}
_INFO_VALUES = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}
_NO_CHECK_FLAGS = {"--help", "-h", "--hydra-help", "--version", "--shell-completion", "-sc",
                   "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun"}
MAX_CHECKED_COMBINATIONS = 64


def conf_dir() -> Path:
    """conf/ ships inside the package as llmlab/conf; in a source checkout it is ../conf."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "train.yaml").is_file():
            return candidate
    raise RuntimeError("llmlab's conf/ directory is missing from this installation")


# The modules whose registries fill Hydra's ConfigStore with the config groups' options
# (the Config dataclasses are the schema): imported before any config is composed.
PART_MODULES = ("llmlab.train.settings", "llmlab.eval.analysis")


def register_parts() -> None:
    for name in PART_MODULES:
        importlib.import_module(name)


def group_options(group: str) -> list[str]:
    """The options of a config group: YAML files under conf/ and registered Config dataclasses."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_parts()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return sorted(GlobalHydra.instance().config_loader().get_group_options(group))


def fail(message: str, code: int = 1) -> None:
    first = message.strip().splitlines()[0] if message.strip() else "unknown error"
    sys.stderr.write(f"llmlab: error: {first}\n")
    sys.stderr.flush()
    raise SystemExit(code)


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


def _override_args(args: list[str]) -> list[str]:
    """Hydra's positional arguments (the overrides): not flags, nor the values flags take."""
    found, i = [], 0
    while i < len(args):
        a = args[i]
        if a in _VALUE_FLAGS:
            i += 2
            continue
        if a == "--info":
            i += 2 if i + 1 < len(args) and args[i + 1] in _INFO_VALUES else 1
            continue
        if not a.startswith("-"):
            found.append(a)
        i += 1
    return found


def _is_hydra_key(arg: str) -> bool:
    key = arg.lstrip("+~").split("=")[0]
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


def split_args(args: list[str]) -> tuple[list[str], bool]:
    """The key=value overrides among Hydra's arguments (Hydra's own settings left out), and
    whether they should be checked."""
    check = not any(a in _NO_CHECK_FLAGS or a.split("=")[0] in _NO_CHECK_FLAGS for a in args)
    return [a for a in _override_args(args) if not _is_hydra_key(a)], check


def quote_free_text(arg: str) -> str:
    """``prompt="def fib("`` reaches us as ``prompt=def fib(``, which Hydra's override grammar
    rejects. A key=value that does not parse, and is not quoted already, is passed as a quoted
    string; the config checks then judge the value as usual."""
    if arg.startswith("-") or "=" not in arg:
        return arg
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        OverridesParser.create().parse_override(arg)
        return arg
    except HydraException:
        key, value = arg.split("=", 1)
        if value[:1] in ("'", '"'):
            return arg
        return f"{key}={hydra_quote(value)}"


def hydra_quote(value: str) -> str:
    """``value`` as a single-quoted string of Hydra's override grammar."""
    # in Hydra's quoted strings only backslashes before a quote (or the end) are escapes
    value = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
    value = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, value)
    return f"'{value}'"


def expand_sweeps(overrides: list[str]) -> list[list[str]]:
    """Every combination of the sweep values in ``overrides`` (capped)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    choices = []
    for text, o in zip(overrides, parsed):
        if o.is_sweep_override():
            try:
                key = text.split("=", 1)[0]
                choices.append([f"{key}={v}" for v in o.sweep_string_iterator()])
            except Exception:  # glob sweeps and the like: Hydra checks them itself
                continue
        else:
            choices.append([text])
    combos = itertools.product(*choices)
    return [list(c) for c in itertools.islice(combos, MAX_CHECKED_COMBINATIONS)]


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
        group, _, option = err.missing_cfg_file.rpartition("/")
        return f"{group}={option}: unknown option; allowed: {', '.join(err.options or []) or '(none)'}"
    cause = err if isinstance(err, OmegaConfBaseException) else err.__cause__
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


def preflight(command: str, args: list[str]) -> None:
    overrides, check = split_args(args)
    if not check:
        return
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from llmlab.errors import UserError

    validate = importlib.import_module(f"llmlab.commands.{command}").validate
    try:
        combos = expand_sweeps(overrides)
    except HydraException as e:
        fail(f"cannot parse the overrides: {str(e).strip().splitlines()[0]}", 2)
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None, job_name=command):
        def compose_with(ovs):
            return compose(config_name=command, overrides=ovs)

        for combo in combos:
            try:
                cfg = compose_with(combo)
                validate(OmegaConf.to_container(cfg, resolve=True))
            except UserError as e:
                fail(str(e), 2)
            except (HydraException, OmegaConfBaseException) as e:
                fail(_explain(e, combo, compose_with), 2)

        # Hydra's own settings (hydra.callbacks.report.baseline=..., hydra/launcher=joblib, ...):
        # composed once with the first combination, so a misspelt one is one line too
        extra = hydra_overrides(args)
        if extra:
            def compose_all(ovs):
                return compose(config_name=command, overrides=ovs, return_hydra_config=True)

            overrides = (combos[0] if combos else []) + extra
            try:
                compose_all(overrides)
            except (HydraException, OmegaConfBaseException) as e:
                fail(_explain(e, overrides, compose_all), 2)


def hydra_overrides(args: list[str]) -> list[str]:
    """The overrides of Hydra's own config among ``args`` (sweeps of them left to Hydra)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    def sweep(arg: str) -> bool:
        try:
            return OverridesParser.create().parse_override(arg).is_sweep_override()
        except Exception:
            return False  # Hydra reports what it cannot parse

    return [a for a in _override_args(args) if _is_hydra_key(a) and not sweep(a)]


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return
    if argv[0] in ("--version", "-V"):
        from llmlab import __version__
        print(f"llmlab {__version__}")
        return
    command, rest = argv[0], argv[1:]
    if command == "report":
        rest = paths_to_runs_override(rest)
    rest = [quote_free_text(a) for a in rest]
    if command not in USAGE_COMMANDS:
        sys.stderr.write(f"llmlab: error: unknown command '{command}'; allowed: {', '.join(USAGE_COMMANDS)}\n\n{USAGE}")
        raise SystemExit(2)
    if {"-m", "--multirun"} & set(rest) and {"--cfg", "-c", "--info"} & set(rest):
        fail("-m cannot be combined with --cfg or --info; drop -m to see one job's config", 2)
    register_parts()
    if {"--help", "-h"} & set(rest):
        sys.stdout.write(command_help(command))
        return
    preflight(command, rest)
    rest = name_sweep_runs_by_swept_keys(rest)
    if command == "train":
        rest = name_train_sweep_by_its_overrides(rest)
        rest = keep_worker_ranks_out_of_outputs(rest)
    module = importlib.import_module(f"llmlab.commands.{command}")
    app = hydra_app(command, module.run)
    sys.argv = [f"llmlab {command}", *rest]
    # Hydra raises what fails in its own work (writing a job's .hydra/ files on a full disk)
    # instead of printing a shortened traceback, so a disk problem there is one line too
    import os
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    worker = command == "train" and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1
    try:
        try:
            app()
        except OSError as e:
            from llmlab.files import disk_error
            problem = disk_error(e, "a file")
            if problem is None:
                raise
            fail(str(problem), 1)
    except SystemExit as e:
        if worker:
            leave_without_finalizing(e.code)
        raise
    if worker:
        leave_without_finalizing(0)


def command_help(command: str) -> str:
    """A command's ``--help``: its own config groups, each option with its one-line description
    (a registered part's docstring, a preset's first comment), and its own settings with their
    defaults and comments. Hydra's help lists every group, which the other commands reject."""
    import yaml
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from llmlab.registry import Registry, defaults_text

    text = (conf_dir() / f"{command}.yaml").read_text()
    doc = yaml.safe_load(text) or {}
    help_cfg = (doc.get("hydra") or {}).get("help") or {}
    groups = []
    for entry in doc.get("defaults") or []:
        if isinstance(entry, dict):
            groups += [str(k).split("@")[0].lstrip("/") for k in entry if not str(k).startswith("override")]
    out = [help_cfg.get("header", f"llmlab {command}\n").rstrip("\n"), ""]
    about = [line[1:].strip() for line in text.splitlines()[1:] if line.startswith("#")]  # the first is the header's
    if about:
        out += [*about, ""]
    if groups:
        out += ["== Config groups (group=option) =="]
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            loader = GlobalHydra.instance().config_loader()
            for group in groups:
                for sub in [group] + sorted(f"{group}/{g}" for g in loader.list_groups(group)):
                    options = sorted(loader.get_group_options(sub))
                    out.append(f"{sub}: {', '.join(options)}")
                    for o in options:
                        registry = Registry.by_group.get(sub)
                        out.append(f"  {o:<14} {_option_line(sub, o, registry)}".rstrip())
                        settings = defaults_text(registry.get(o).Config, registry.kind_key) if registry and o in registry else ""
                        if settings:
                            out.append(f"  {'':<14}   {settings}")
        out.append("")
    settings = getattr(importlib.import_module(f"llmlab.commands.{command}"), "help_settings", None)
    out += ["== Settings (key=value) ==", *(settings() if settings else _settings_text(text)), ""]
    out.append(help_cfg.get("footer", "").rstrip("\n"))
    return "\n".join(out).rstrip("\n") + "\n"


def _option_line(group: str, option: str, registry) -> str:
    """One option's description: a registered part's docstring, else its YAML's first comment."""
    from llmlab.registry import Registry, doc_line, first_sentence

    if registry is not None and option in registry:
        return doc_line(registry.get(option))
    path = conf_dir() / group / f"{option}.yaml"
    if path.is_file():
        comment = [line[1:].strip() for line in path.read_text().splitlines()
                   if line.startswith("#") and not line[1:].strip().startswith("@")]
        return first_sentence("\n".join(comment))
    attention = Registry.by_group.get("model/attention")
    if group == "model" and attention is not None and option in attention:
        return f"the tiny model with {option} attention (attention.* settings)"
    return ""


def _settings_text(text: str) -> list[str]:
    """The YAML's own lines, comments kept, without its ``defaults:`` and ``hydra:`` blocks."""
    lines, skipping = [], False
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            skipping = line.split(":")[0] in ("defaults", "hydra")
        if not skipping:
            lines.append(line)
    while lines and not lines[0].strip():
        lines.pop(0)
    return lines


def leave_without_finalizing(code) -> NoReturn:
    """End a torchrun worker as a normal exit would (every exit handler runs: wandb's,
    logging's, temporary files'; the streams are flushed) but without finalizing the
    interpreter.

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
    if code is None:
        code = 0
    elif not isinstance(code, int):
        sys.stderr.write(f"{code}\n")
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def paths_to_runs_override(args: list[str]) -> list[str]:
    """``llmlab report DIR ...``: arguments that name existing paths become ``runs=[...]``
    (sweep directories may hold '=' and ',', so they cannot go through the override grammar
    unquoted)."""
    import os

    paths, rest = [], []
    for i, a in enumerate(args):
        is_value = i > 0 and args[i - 1] in _VALUE_FLAGS
        if not a.startswith("-") and not is_value and (os.path.exists(a) or "=" not in a):
            paths.append(a)
        else:
            rest.append(a)
    if not paths:
        return rest
    return add_overrides(rest, [f"runs=[{','.join(hydra_quote(p) for p in paths)}]"])


def path_slug(text: str, limit: int = 60) -> str:
    """A short, path-safe form of a job's overrides for its sweep directory name."""
    text = re.sub(r"[^A-Za-z0-9._=,+-]+", "-", str(text).replace("/", "-"))
    text = re.sub(r"-{2,}", "-", text).strip("-")
    return text[:limit].rstrip("-,") or "defaults"


def name_sweep_runs_by_swept_keys(args: list[str]) -> list[str]:
    """Under -m, name each job's directory by the keys that vary across the sweep only: the
    fixed overrides go to Hydra's override_dirname exclude list."""
    if not {"-m", "--multirun"} & set(args) or any("override_dirname" in a for a in args):
        return args
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides, _ = split_args(args)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # preflight reports bad overrides
        return args
    fixed = sorted({o.key_or_group for o in parsed if not o.is_sweep_override()})
    if not fixed:
        return args
    return add_overrides(args, [f"hydra.job.config.override_dirname.exclude_keys=[{','.join(fixed)}]"])


def add_overrides(args: list[str], extra: list[str]) -> list[str]:
    """``args`` with ``extra`` overrides placed just before the first of the user's, so all
    overrides stay one run of positional arguments (argparse rejects a second run after a
    flag such as ``--cfg job``)."""
    for i, a in enumerate(args):
        if "=" in a and not a.startswith("-") and (i == 0 or args[i - 1] not in _VALUE_FLAGS):
            return [*args[:i], *extra, *args[i:]]
    return [*args, *extra]


def name_train_sweep_by_its_overrides(args: list[str]) -> list[str]:
    """Under -m, a train sweep's directory is named by its overrides, not the time: running
    the same sweep again finds its runs, skips the finished ones and resumes the rest."""
    if not {"-m", "--multirun"} & set(args) or any(a.startswith("hydra.sweep.dir=") for a in args):
        return args
    import hashlib

    overrides, _ = split_args(args)  # without Hydra's own: hydra.callbacks.report.baseline=... keeps the directory
    digest = hashlib.sha1("\0".join(overrides).encode()).hexdigest()[:6]
    # quoted: the slug keeps '=' and ',', which Hydra's override grammar reads as syntax
    return add_overrides(args, [f"hydra.sweep.dir='outputs/train-sweep/{path_slug('_'.join(overrides), 80)}-{digest}'"])


def keep_worker_ranks_out_of_outputs(args: list[str]) -> list[str]:
    """Under torchrun, ranks other than 0 write nothing: rank 0 picks the run directory and
    the trainer hands it to the others, so Hydra's own files go to a scratch directory."""
    import os
    import tempfile

    if int(os.environ.get("WORLD_SIZE", 1)) <= 1 or int(os.environ.get("RANK", 0)) == 0:
        return args
    scratch = Path(tempfile.gettempdir()) / f"llmlab-rank{os.environ['RANK']}"
    args = [a for a in args if not a.startswith(("hydra.run.dir=", "hydra.sweep.dir=", "hydra.output_subdir="))]
    return add_overrides(args, [f"hydra.run.dir={scratch}", f"hydra.sweep.dir={scratch}", "hydra.output_subdir=null",
                                "hydra/job_logging=disabled"])


def register_resolvers() -> None:
    from omegaconf import OmegaConf
    if not OmegaConf.has_resolver("slug"):
        OmegaConf.register_new_resolver("slug", path_slug)


def hydra_app(command: str, body: Callable) -> Callable:
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
        with console.keeping(log) if log is not None else contextlib.nullcontext():
            guarded(body)(OmegaConf.to_container(cfg, resolve=True), run_dir)

    return app
