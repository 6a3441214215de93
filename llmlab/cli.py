"""``llmlab <command> [overrides]``: read the command line once, then run the command's
Hydra app (`hydra.main`).

What is wrong with the line as typed is found here before anything loads, and worded in
`llmlab.mistakes`. Every job's settings are checked by `llmlab.preflight.CheckJobs`, a
Hydra callback, after Hydra composes them and before any directory exists; what Hydra itself
refuses while composing becomes one line too (`llmlab.mistakes.after_hydra`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NoReturn

from llmlab import mistakes
from llmlab.errors import fail
from llmlab.names import path_slug
from llmlab.overrides import (keep_worker_ranks_out_of_outputs, name_sweep_runs_by_swept_keys,
                              name_train_sweep_by_its_overrides, paths_to_runs_override, quote_free_text)
from llmlab.paths import conf_dir

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


@dataclass(frozen=True)
class CommandLine:
    """One command line, read once: the command, and its arguments as Hydra gets them."""

    command: str
    args: tuple[str, ...]
    sweeping: bool  # -m
    showing: bool  # --cfg or --info: Hydra shows a config and runs nothing
    helping: bool  # --help
    config_dirs: tuple[str, ...] = ()  # --config-dir: configs of one's own, beside llmlab's

    @classmethod
    def read(cls, argv: list[str]) -> "CommandLine":
        """Checks what can be judged as typed (`llmlab.mistakes.check_line`), quotes free text
        for Hydra's grammar, and adds the overrides llmlab sets for sweeps and torchrun ranks."""
        command, rest = argv[0], list(argv[1:])
        if command == "report":
            rest = paths_to_runs_override(rest)
        flags = set(rest)
        sweeping = bool({"-m", "--multirun"} & flags)
        rest = [quote_free_text(a, () if sweeping else TEXT_KEYS.get(command, ()), LITERAL_KEYS.get(command, ()))
                for a in rest]
        mistakes.check_line(command, rest, USAGE_COMMANDS, USAGE)
        helping = bool({"--help", "-h"} & flags)
        if not helping:
            rest = name_sweep_runs_by_swept_keys(rest)
            if command == "train":
                rest = keep_worker_ranks_out_of_outputs(name_train_sweep_by_its_overrides(rest))
        return cls(command, tuple(rest), sweeping, bool({"--cfg", "-c", "--info"} & flags), helping,
                   mistakes.config_dirs(rest))


def register_parts(command: str | None = None, every_kind: bool = True) -> None:
    """Fill Hydra's ConfigStore with what ``command`` composes (all commands' by default): its
    schema and its groups' registered options. Each command module imports the registries its
    groups need, so ``report`` or ``tokenize`` loads no torch before its work starts.
    ``every_kind``: also the kinds written as one file in a family's package, which means
    importing those modules, torch with them: for ``--help`` and sweeps, which list them all;
    a single run loads one where its config names it."""
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


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return
    if argv[0] in ("--version", "-V"):
        from llmlab import __version__
        print(f"llmlab {__version__}")
        return
    line = CommandLine.read(argv)
    # The kinds written as one file import torch with them (3-4 s): --help lists them all and
    # a sweep may range over them (glob); a single run loads one where its config names it,
    # so that a mistake in the settings is one line within a second
    register_parts(line.command, every_kind=line.helping or line.sweeping)
    if line.helping:
        from llmlab.help import command_help
        sys.stdout.write(command_help(line.command, line.config_dirs))
        return
    app = hydra_app(line.command)
    sys.argv = [f"llmlab {line.command}", *line.args]
    # Hydra raises what fails in its own work (writing a job's .hydra/ files on a full disk)
    # instead of printing a shortened traceback, so a disk problem there is one line too
    import os
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    worker = line.command == "train" and int(os.environ.get("WORLD_SIZE") or 1) > 1
    try:
        try:
            try:
                app()
            except Exception as e:
                if not mistakes.names_an_unloaded_kind(e):
                    raise
                from hydra.core.global_hydra import GlobalHydra
                GlobalHydra.instance().clear()
                app()  # the config names a kind written as one file: now loaded
        except Exception as e:
            mistakes.after_hydra(e, line.command, list(line.args))
    except SystemExit as e:
        if worker:
            leave_without_finalizing(e.code)
        raise
    if worker:
        leave_without_finalizing(0)


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


# how long the end of a command waits for its other threads before it leaves them to the
# interpreter's own exit (`leave_without_finalizing`)
EXIT_WAIT_S = 5.0


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

    A thread still running after a wait (joblib's executor under ``hydra/launcher=joblib``) is
    one that ends only when the interpreter's own exit tells it to: then the process ends the
    ordinary way, which does.
    """
    import atexit
    import os
    import threading
    import time
    if code is None:
        code = 0
    elif not isinstance(code, int):
        sys.stderr.write(f"{code}\n")
        code = 1
    deadline = time.monotonic() + EXIT_WAIT_S
    others = [t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
    for thread in others:  # as Python's own exit does first
        thread.join(max(0.0, deadline - time.monotonic()))
    if any(thread.is_alive() for thread in others):
        raise SystemExit(code)
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


def hydra_app(command: str) -> Callable:
    """The Hydra app of a command: its body gets the job resolved from the config Hydra
    composed (which `llmlab.preflight.CheckJobs` checked before Hydra made the directory)."""
    import hydra

    register_resolvers()
    from llmlab.commands import command_of

    declared = command_of(command)

    @hydra.main(version_base=None, config_path=str(conf_dir()), config_name=command)
    def app(cfg) -> None:
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import OmegaConf

        from llmlab import console
        from llmlab.files import open_append

        hc = HydraConfig.get()
        run_dir = Path(hc.runtime.output_dir)
        # the job's log (Hydra's <command>.log) keeps what the command prints, not just log records
        log = run_dir / f"{hc.job.name}.log" if hc.job_logging and hc.job_logging.get("handlers") else None

        def body() -> None:
            declared.run(declared.job(OmegaConf.to_container(cfg, resolve=True)), run_dir)

        with console.keeping(log, open_append) if log is not None else contextlib.nullcontext():
            guarded(body)()

    return app
