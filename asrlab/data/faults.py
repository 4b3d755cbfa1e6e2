"""Faults put into the data on purpose: a slow or hung rank, to reproduce a stall (notebook 01, tests).

The one place the loader does something it was not asked to by the data; off unless ``data.inject_delay_s``
is set, and then it is in the run's config for anyone reading it later.
"""

from __future__ import annotations

import time
from collections.abc import Iterator


def delayed(batches: Iterator[dict], cfg, rank: int) -> Iterator[dict]:
    """``batches``, each after ``cfg.inject_delay_s`` seconds of sleep on the ranks of ``cfg.inject_delay_ranks``
    (all when empty), from the ``cfg.inject_delay_from_batch``-th batch of the worker's epoch on."""
    if not cfg.inject_delay_s or (cfg.inject_delay_ranks and rank not in cfg.inject_delay_ranks):
        yield from batches
        return
    for served, batch in enumerate(batches):
        if served >= cfg.inject_delay_from_batch:
            time.sleep(cfg.inject_delay_s)
        yield batch


__all__ = ["delayed"]
