"""Errors every part of poolkeeper shares, and the exit codes of its commands.

Exit codes: 0 success, 2 usage or configuration error (one line naming the bad value),
1 anything else.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """A bad command-line value or configuration; reported in one line, exit 2."""
