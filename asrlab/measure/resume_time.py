"""Resume seeks, it does not replay: the time to the first batch after resuming at a position in an epoch.

For each position a checkpoint is written whose loader state is that far into epoch 0 (the
loader is iterated to it; the model is not trained, which changes nothing about seeking). Then:

* ``resume_s``: construct the trainer, load that checkpoint (``Trainer.resume``), take the first
  batch: what a restarted run waits before its first step;
* ``replay_s``: construct the trainer, iterate the loader from the start of the epoch and discard
  batches up to the position, take the next one: what a loader without a saved position (or one
  that restores it by replaying) has to do. Both must give the same next batch (checked).
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import torch

from ..config import Config, replace_section
from ..lab.dist import DistInfo
from ..train.trainer import Trainer

CPU = DistInfo(0, 1, 0, torch.device("cpu"), None)


def resume_times(
    cfg: Config, data: str, fractions: list[float], workdir: str | Path, repeat: int = 1, progress=None
) -> dict:
    """``{"batches": N, "epoch_read_s": s, "rows": [{"fraction", "batch", "resume_s", "replay_s"}, ...]}``
    (best of ``repeat`` each), on one process."""
    workdir = Path(workdir)
    cfg = replace_section(cfg, "train", progress=False, stall_timeout_s=0.0, diagnostics_every=0)

    def trainer(exp):
        return Trainer(cfg, data, None, workdir / exp, CPU)

    probe = trainer("probe")
    t0 = time.perf_counter()
    n = sum(1 for _ in probe.loader)
    out = {"batches": n, "epoch_read_s": time.perf_counter() - t0, "rows": []}
    probe.close()
    for frac in fractions:
        k = min(n - 1, max(1, round(frac * n)))
        tr = trainer(f"at{k}")
        for _ in itertools.islice(tr.loader, k):  # consume k batches, as k training steps would
            pass
        tr.save()
        tr.close()
        resume, replay = [], []
        for _ in range(repeat):
            t0 = time.perf_counter()
            tr = trainer(f"at{k}")
            assert tr.resume()
            first = next(iter(tr.loader))
            resume.append(time.perf_counter() - t0)
            tr.close()
            t0 = time.perf_counter()
            tr = trainer("replay")
            again = next(itertools.islice(iter(tr.loader), k, None))
            replay.append(time.perf_counter() - t0)
            tr.close()
            if again["keys"] != first["keys"]:
                raise AssertionError(f"at batch {k}: replay and resume disagree on the next batch")
        out["rows"].append({"fraction": frac, "batch": k, "resume_s": min(resume), "replay_s": min(replay)})
        if progress is not None:
            progress(out["rows"][-1])
    return out
