"""Command-line arguments on their way to Hydra: which are overrides, quoting free text for
Hydra's grammar, the combinations of a sweep, and the extra overrides llmlab adds (sweep
directory names, torchrun ranks' scratch directories, report paths)."""

from __future__ import annotations

import functools
import itertools
import re
from pathlib import Path

from llmlab.errors import ConfigError
from llmlab.names import path_slug

# Hydra flags that take a value
_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                "--config-dir", "-cd", "--experimental-rerun"}
_INFO_VALUES = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}
MAX_CHECKED_COMBINATIONS = 64


@functools.lru_cache(maxsize=1024)
def parse(arg: str):
    """Hydra's reading of one override (an ``Override``), or None where its grammar refuses it.
    One command line's overrides are asked about by the preflight, the sweep expansion, the
    check of Hydra's own settings and the naming of sweep directories: each text is parsed
    once per process. The result is shared, so callers only read it."""
    try:
        return _parser().parse_override(arg)
    except Exception:  # Hydra's own composition reports what its grammar refuses
        return None


@functools.cache
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


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


def split_args(args: list[str]) -> list[str]:
    """The key=value overrides among Hydra's arguments, Hydra's own settings left out."""
    return [a for a in _override_args(args) if not _is_hydra_key(a)]


def quote_free_text(arg: str, text_keys: tuple[str, ...] = (), literal_keys: tuple[str, ...] = ()) -> str:
    """``prompt="def fib("`` reaches us as ``prompt=def fib(``, which Hydra's override grammar
    rejects. A key=value that does not parse, and is not quoted already, is passed as a quoted
    string; the config checks then judge the value as usual. So is the value of a key in
    ``text_keys`` (free text such as a prompt, outside a sweep) that Hydra would read as several
    values: ``prompt=Hello, world`` is one prompt. And so is a number given to a key in
    ``literal_keys`` (paths and text): Hydra would read ``out=1e5`` as the float 100000.0, and
    the setting, a string, would get ``100000.0``; quoted, it gets what was typed."""
    if arg.startswith("-") or "=" not in arg:
        return arg
    key, value = arg.split("=", 1)
    parsed = parse(arg)
    if (parsed is not None and key in literal_keys and not parsed.is_sweep_override()
            and type(parsed.value()) in (int, float)):
        return f"{key}={hydra_quote(value)}"
    if parsed is not None and not (key in text_keys and parsed.is_sweep_override()):
        return arg
    if value[:1] in ("'", '"') and parsed is None:
        return arg
    return f"{key}={hydra_quote(value)}"


def hydra_quote(value: str) -> str:
    """``value`` as a single-quoted string of Hydra's override grammar."""
    # in Hydra's quoted strings only backslashes before a quote (or the end) are escapes
    value = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
    value = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, value)
    return f"'{value}'"


def expand_sweeps(overrides: list[str], group_options=None, basic: bool = True) -> list[list[str]]:
    """Every combination of the sweep values in ``overrides`` (capped). Raises Hydra's error
    for an override its grammar cannot read. ``group_options(group)``: a config group's
    options, for a ``glob(...)`` sweep over them (without it, glob sweeps are left to Hydra).
    ``basic``: Hydra's basic sweeper runs the sweep, which cannot draw from an interval."""
    from hydra.core.override_parser.types import Glob, IntervalSweep

    choices = []
    for text in overrides:
        o = parse(text)
        if o is None:
            _parser().parse_override(text)  # raises Hydra's own account of what it cannot read
        if o.is_sweep_override():
            key, _, value = text.partition("=")
            name, swept = key.lstrip("+~"), o.value()
            if basic and isinstance(swept, IntervalSweep):  # the basic sweeper raised at launch
                raise ConfigError(f"{name}: '{value}' is an interval, which only a sampling sweeper "
                                  "(Optuna, Nevergrad) draws from; -m takes a list, range(), choice() or glob()")
            options = group_options(o.key_or_group) if group_options and isinstance(swept, Glob) else None
            if options:  # a glob that matches none would launch no job, and say nothing
                matched = swept.filter(options)
                if not matched:
                    raise ConfigError(f"{name}: '{value}' matches none of the group's options: "
                                      f"{', '.join(sorted(options))}")
                choices.append([f"{key}={v}" for v in matched])
                continue
            try:
                values = [f"{key}={v}" for v in o.sweep_string_iterator()]
            except ValueError as e:  # range(1,3,0): Python's range refuses it, in Hydra's launch
                raise ConfigError(f"{name}: '{value}' is not a sweep ({e})") from None
            except Exception:  # glob sweeps and the like: Hydra checks them itself
                continue
            if not values:  # range(0,-2): a sweep of no jobs would launch nothing, and say nothing
                raise ConfigError(f"{name}: '{value}' gives no values to sweep")
            choices.append(values)
        else:
            choices.append([text])
    combos = itertools.product(*choices)
    return [list(c) for c in itertools.islice(combos, MAX_CHECKED_COMBINATIONS)]


def first_sweep(args: list[str]) -> str | None:
    """The first override among ``args`` that gives several values (``train.steps=1,2``,
    ``seed=range(3)``, ``glob(...)``): Hydra runs those only under ``-m``."""
    for arg in _override_args(args):
        o = parse(arg)  # None: Hydra reports what it cannot parse
        if o is not None and o.is_sweep_override():
            return arg
    return None


def hydra_overrides(args: list[str]) -> list[str]:
    """The overrides of Hydra's own config among ``args`` (sweeps of them left to Hydra)."""
    def sweep(arg: str) -> bool:
        o = parse(arg)  # None: Hydra reports what it cannot parse
        return o is not None and o.is_sweep_override()

    return [a for a in _override_args(args) if _is_hydra_key(a) and not sweep(a)]


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


def name_sweep_runs_by_swept_keys(args: list[str]) -> list[str]:
    """Under -m, name each job's directory by the keys that vary across the sweep only: the
    fixed overrides go to Hydra's override_dirname exclude list."""
    if not {"-m", "--multirun"} & set(args) or any("override_dirname" in a for a in args):
        return args
    overrides = split_args(args)
    parsed = [parse(a) for a in overrides]
    if None in parsed:  # preflight reports bad overrides
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

    overrides = split_args(args)  # without Hydra's own: hydra.callbacks.report.baseline=... keeps the directory
    digest = hashlib.sha1("\0".join(overrides).encode()).hexdigest()[:6]
    # quoted: the slug keeps '=' and ',', which Hydra's override grammar reads as syntax
    return add_overrides(args, [f"hydra.sweep.dir='outputs/train-sweep/{path_slug('_'.join(overrides), 80)}-{digest}'"])


def keep_worker_ranks_out_of_outputs(args: list[str]) -> list[str]:
    """Under torchrun, ranks other than 0 write nothing: rank 0 picks the run directory and
    the trainer hands it to the others, so Hydra's own files go to a scratch directory."""
    import os
    import tempfile

    if int(os.environ.get("WORLD_SIZE") or 1) <= 1 or int(os.environ.get("RANK") or 0) == 0:
        return args
    scratch = Path(tempfile.gettempdir()) / f"llmlab-rank{os.environ['RANK']}"
    args = [a for a in args if not a.startswith(("hydra.run.dir=", "hydra.sweep.dir=", "hydra.output_subdir="))]
    return add_overrides(args, [f"hydra.run.dir={scratch}", f"hydra.sweep.dir={scratch}", "hydra.output_subdir=null",
                                "hydra/job_logging=disabled"])
