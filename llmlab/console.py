"""The rich consoles every command prints through: status to stderr, results to stdout."""

from rich.console import Console

# soft_wrap: long lines are not broken at 80 columns when the output is a file or a pipe
# markup=False: user text (paths, prompts, samples) is printed as it is; style with style=
out = Console(highlight=False, soft_wrap=True, markup=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)
