"""Errors every command maps to an exit code (kept apart from cli.py so `python -m` imports one class)."""


class UsageError(Exception):
    """Bad command-line input or configuration discovered while starting; exit 2 with the message."""


class StackError(RuntimeError):
    """A server could not be started (binary missing, crashed, never became ready)."""
