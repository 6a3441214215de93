"""The rich consoles every command prints through. ``out`` (stdout) carries what a command
reports: a training run's card, log lines, evals and summary; an eval's table; a sample's
text. ``err`` (stderr) carries everything else: warnings, progress bars and spinners, and
the timing lines of `llmlab sample`, so that its stdout is the generated text alone.

What they print is also kept in the command's log file in its run directory (`keeping`), as
plain text and without the live progress bar's frames.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import IO, Callable

from rich.console import Console

# Width of the kept log: long lines are not folded at 80 columns there.
LOG_WIDTH = 200


class _Mirrored(Console):
    """A Console whose ``print`` also goes to the log file being kept, if any."""

    def print(self, *objects, **kwargs) -> None:  # noqa: A003 (rich's name)
        super().print(*objects, **kwargs)
        if _log is not None and not self.quiet:
            _log.print(*objects, **kwargs)


# soft_wrap: long lines are not broken at 80 columns when the output is a file or a pipe
# markup=False: user text (paths, prompts, samples) is printed as it is; style with style=
out = _Mirrored(highlight=False, soft_wrap=True, markup=False)
err = _Mirrored(stderr=True, highlight=False, soft_wrap=True, markup=False)
_log: Console | None = None


def keep(text: str) -> None:
    """A line for the log file only (what a live display shows on the terminal)."""
    if _log is not None and not out.quiet:
        _log.print(text)


@contextlib.contextmanager
def keeping(path: str | Path, open_log: Callable[[Path], IO[str]]):
    """While inside, everything printed through ``out`` and ``err`` is appended to ``path``,
    opened by ``open_log`` (`llmlab.files.open_append`, which follows no link). A log that
    cannot be opened (read-only directory) is skipped, said in one line: printing goes on."""
    global _log
    from llmlab.errors import UserError

    try:
        f = open_log(Path(path))
    except (OSError, UserError) as e:
        err.print(f"{path}: cannot be kept ({e.strerror if isinstance(e, OSError) else e}); printing goes on",
                  style="yellow")
        yield
        return
    previous, _log = _log, Console(file=f, width=LOG_WIDTH, no_color=True, highlight=False, soft_wrap=True,
                                   markup=False, emoji=False)
    try:
        yield
    finally:
        _log = previous
        f.close()
