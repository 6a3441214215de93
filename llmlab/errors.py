"""Errors that are the user's to fix: shown as one line, never as a traceback."""

import sys


class UserError(Exception):
    """A mistake in the command line, the config or the inputs. The message is one line."""


class ConfigError(UserError):
    """A config key or value that cannot be used. The message names the key."""


def fail(message: str, code: int = 1) -> None:
    """End the program with ``llmlab: error: <the message's first line>`` on stderr and ``code``
    (the CLI's way to report a UserError; a sweep's end-of-run report uses it too)."""
    first = message.strip().splitlines()[0] if message.strip() else "unknown error"
    sys.stderr.write(f"llmlab: error: {first}\n")
    sys.stderr.flush()
    raise SystemExit(code)
