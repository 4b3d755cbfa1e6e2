"""A batch's utterance ids, whatever the loop calls them.

Loops name them differently (``keys`` in asrlab and WeNet, ``key``, ``utt_id``, ``uttids``, ``uid``, ``ids``, ``cuts``'
ids in lhotse's batches), and carry batches as dicts, tuples or small objects. The parts take ``keys=``: a
name, a callable ``batch -> ids``, or nothing, and then look for the common names; a loop whose batches carry
none is told once, since a NaN report without the utterances that caused it is half a report.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger("asrlab")

NAMES = ("keys", "key", "utt_ids", "utt_id", "uttids", "uttid", "uids", "uid", "utts", "ids", "names", "utterance_ids")

KeysSpec = str | Callable | None


def _as_ids(value) -> list[str] | None:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Sequence) and value and all(isinstance(v, (str, bytes)) for v in value):
        return [v.decode() if isinstance(v, bytes) else v for v in value]
    return None


def _field(batch, name: str):
    if isinstance(batch, Mapping):
        return batch.get(name)
    return getattr(batch, name, None)


def find_keys(batch, keys: KeysSpec = None) -> list[str] | None:
    """The utterance ids of ``batch`` as strings, or None where there are none. ``keys``: the field's name
    (dict key or attribute), a callable returning them, or None to look for :data:`NAMES` in a dict, an
    object's attributes, a tuple/list batch's elements (the first of them that is a list of strings), or a
    list of micro-batch dicts (their ids in order)."""
    if batch is None:
        return None
    if callable(keys):
        got = keys(batch)
        return None if got is None else [str(k) for k in got]
    if keys is not None:
        value = _field(batch, keys)
        return None if value is None else [str(k) for k in (value if not isinstance(value, str) else [value])]
    for name in NAMES:
        value = _field(batch, name)
        if value is not None and (ids := _as_ids(value)) is not None:
            return ids
    if isinstance(batch, (tuple, list)):
        for item in batch:
            if (ids := _as_ids(item)) is not None:
                return ids
        if batch and all(isinstance(item, Mapping) for item in batch):  # micro-batches of one step
            found = [find_keys(item) for item in batch]
            if all(f is not None for f in found):
                return [k for f in found for k in f]
    return None


class KeyFinder:
    """:func:`find_keys` with a one-time warning: the first batch without ids says so, and how to pass them."""

    def __init__(self, keys: KeysSpec = None, who: str = "asrlab.lab"):
        self.keys, self.who, self.warned = keys, who, False

    def __call__(self, batch) -> list[str]:
        ids = find_keys(batch, self.keys)
        if ids is None and batch is not None and not self.warned:
            self.warned = True
            what = f"a field {self.keys!r}" if isinstance(self.keys, str) else "utterance ids under a common name"
            log.warning(
                "%s: the batch (%s) has no %s (%s); reports will not name the utterances: pass keys="
                "the field's name or a function batch -> ids",
                self.who,
                type(batch).__name__,
                what,
                ", ".join(NAMES[:6]),
            )
        return ids or []


__all__ = ["NAMES", "KeyFinder", "find_keys"]
