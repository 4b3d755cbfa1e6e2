"""Errors a person can fix: bad input, a bad config or a bad command line.

``asrlab``'s command line prints these in one line and exits 2; any other exception is a bug and
keeps its traceback. ``UsageError`` is a ``ValueError``, so callers that caught ``ValueError`` still do.
"""

from __future__ import annotations


class UsageError(ValueError):
    """Bad input, config or arguments, said in a way that tells the person what to change."""


__all__ = ["UsageError"]
