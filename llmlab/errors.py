"""Errors that are the user's to fix: shown as one line, never as a traceback."""


class UserError(Exception):
    """A mistake in the command line, the config or the inputs. The message is one line."""


class ConfigError(UserError):
    """A config key or value that cannot be used. The message names the key."""
