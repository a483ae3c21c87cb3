"""The one exception type for mistakes a user can fix: the CLI prints its message, not a trace."""

from __future__ import annotations


class UserError(Exception):
    """A bad input, column, model path or output folder. The message says what to do."""
