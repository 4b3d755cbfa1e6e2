"""The ledger: which utterances each rank trained on, step by step (``train.ledger=true``, ``--ledger``).

``EXP/ledger/rank{R}.jsonl`` gets one line per optimizer step, ``{"step", "epoch", "keys"}``, and
a line ``{"resumed_from": S}`` whenever the run goes back to the checkpoint of step S (a resume
after a crash, a rollback). Nothing is rewritten: the steps after S that were trained and then
lost stay in the file, and :func:`read_ledger` drops them, so what is left is what the final
model was trained on. :func:`coverage` counts each utterance per epoch over all ranks.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path


class LedgerWriter:
    def __init__(self, exp: Path, rank: int):
        d = Path(exp) / "ledger"
        d.mkdir(parents=True, exist_ok=True)
        self.f = open(d / f"rank{rank}.jsonl", "a", buffering=1)

    def step(self, step: int, epoch: int, keys: list[str]) -> None:
        self.f.write(json.dumps({"step": step, "epoch": epoch, "keys": keys}) + "\n")

    def resumed(self, step: int) -> None:
        self.f.write(json.dumps({"resumed_from": step}) + "\n")

    def close(self) -> None:
        self.f.close()


def mark_resumed(exp: str | Path, rank: int, step: int) -> None:
    """Add a ``resumed_from`` line to rank ``rank``'s ledger (a rank the resumed run no longer has)."""
    path = Path(exp) / "ledger" / f"rank{rank}.jsonl"
    if path.exists():
        with open(path, "a") as f:
            f.write(json.dumps({"resumed_from": step}) + "\n")


def read_ledger(exp: str | Path, rank: int = 0) -> list[dict]:
    """The steps of rank ``rank`` that count: lines undone by a later ``resumed_from`` are dropped
    (a torn last line, from a process killed mid-write, is ignored)."""
    steps: list[dict] = []
    for line in (Path(exp) / "ledger" / f"rank{rank}.jsonl").read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "resumed_from" in rec:
            steps = [s for s in steps if s["step"] <= rec["resumed_from"]]
        else:
            steps.append(rec)
    return steps


def ledger_ranks(exp: str | Path) -> list[int]:
    return sorted(int(p.stem[4:]) for p in (Path(exp) / "ledger").glob("rank*.jsonl"))


def coverage(exp: str | Path) -> dict[int, Counter]:
    """{epoch: Counter(utterance key -> times trained on)} over every rank's ledger."""
    out: dict[int, Counter] = {}
    for rank in ledger_ranks(exp):
        for rec in read_ledger(exp, rank):
            out.setdefault(rec["epoch"], Counter()).update(rec["keys"])
    return out


def epoch_coverage(exp: str | Path, epoch: int, keys: set[str]) -> dict:
    """How the utterances ``keys`` were used in ``epoch``: exactly once, more than once, never."""
    c = coverage(exp).get(epoch, Counter())
    return {"once": sum(1 for k in keys if c[k] == 1), "more_than_once": sum(1 for k in keys if c[k] > 1),
            "never": sum(1 for k in keys if c[k] == 0)}
