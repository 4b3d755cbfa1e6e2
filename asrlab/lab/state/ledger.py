"""The ledger: which utterances each rank trained on, step by step (``train.ledger=true``, ``--ledger``).

``EXP/ledger/rank{R}.jsonl`` gets one line per optimizer step, ``{"step", "epoch", "keys"}``, and
a line ``{"resumed_from": S}`` whenever the run goes back to the checkpoint of step S (a resume
after a crash, a rollback), and a line ``{"untrained": [keys], "epoch", "after_step", "after_batch",
"batches", "utterances", "exact"}`` when the rank stopped its epoch with data left (the uneven guard's early stop:
another rank ran out). Nothing is rewritten: the steps after S that were trained and then
lost stay in the file, and :func:`read_ledger` drops them, so what is left is what the final
model was trained on. :func:`coverage` counts each utterance per epoch over all ranks.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from .. import layout
from ...files import JsonLines, append_jsonl, read_jsonl


def ledger_path(exp: str | Path, rank: int) -> Path:
    return Path(exp) / layout.LEDGER / f"rank{rank}.jsonl"


class LedgerWriter:
    def __init__(self, exp: Path, rank: int):
        self.f = JsonLines(ledger_path(exp, rank))

    def step(self, step: int, epoch: int, keys: list[str]) -> None:
        self.f.write({"step": step, "epoch": epoch, "keys": keys})

    def resumed(self, step: int) -> None:
        self.f.write({"resumed_from": step})

    def untrained(
        self,
        step: int,
        epoch: int,
        keys: list[str],
        batches: int | None,
        utterances: int | None,
        exact: bool,
        after_batch: int | None = None,
    ) -> None:
        self.f.write(
            {
                "untrained": keys,
                "epoch": epoch,
                "after_step": step,
                "after_batch": after_batch,
                "batches": batches,
                "utterances": utterances,
                "exact": exact,
            }
        )

    def flush(self) -> None:
        self.f.f.flush()

    def close(self) -> None:
        self.f.close()


def ledger_sizes(exp: str | Path, world_size: int) -> list[int]:
    """The size in bytes of each rank's ledger in ``exp`` (0 where there is none)."""
    return [ledger_path(exp, r).stat().st_size if ledger_path(exp, r).exists() else 0 for r in range(world_size)]


def ledger_tail(exp: str | Path, rank: int, start: int) -> bytes:
    """Rank ``rank``'s ledger from byte ``start`` on (lines are only ever appended)."""
    try:
        with open(ledger_path(exp, rank), "rb") as f:
            f.seek(start)
            return f.read()
    except OSError:
        return b""


def put_ledger_tail(exp: str | Path, rank: int, start: int, data: bytes) -> None:
    """Write ``data`` into this folder's copy of rank ``rank``'s ledger at byte ``start`` (the copy of a rank
    on a node with a folder of its own, brought up to date at each checkpoint)."""
    path = ledger_path(exp, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "r+b" if path.exists() else "wb") as f:
        f.truncate(start)
        f.seek(start)
        f.write(data)


def mark_resumed(exp: str | Path, rank: int, step: int) -> None:
    """Add a ``resumed_from`` line to rank ``rank``'s ledger (a rank the resumed run no longer has)."""
    if ledger_path(exp, rank).exists():
        append_jsonl(ledger_path(exp, rank), [{"resumed_from": step}])


def note_resume(
    exp: str | Path, ledger: LedgerWriter | None, step: int, rank: int, world_size: int, saved_world_size: int
) -> None:
    """The steps after ``step`` are undone: said in this rank's ledger and (rank 0) in the ledgers of the
    ranks the saved layout had and this one has not (nothing without a ledger)."""
    if ledger is None:
        return
    ledger.resumed(step)
    if rank == 0:
        for r in range(world_size, saved_world_size):
            mark_resumed(exp, r, step)


def _read(exp: str | Path, rank: int) -> tuple[list[dict], list[dict]]:
    steps: list[dict] = []
    left: list[dict] = []
    for rec in read_jsonl(ledger_path(exp, rank)):
        if "resumed_from" in rec:
            steps = [s for s in steps if s["step"] <= rec["resumed_from"]]
            left = [x for x in left if x["after_step"] <= rec["resumed_from"]]
        elif "untrained" in rec:
            left.append(rec)
        else:
            steps.append(rec)
    return steps, left


def read_ledger(exp: str | Path, rank: int = 0) -> list[dict]:
    """The steps of rank ``rank`` that count: lines undone by a later ``resumed_from`` are dropped
    (a torn last line, from a process killed mid-write, is ignored)."""
    return _read(exp, rank)[0]


def read_untrained(exp: str | Path) -> dict[int, dict[int, dict]]:
    """``{epoch: {rank: record}}``: what each rank left untrained when its epoch was cut short (the
    ``untrained`` lines that count, as :func:`read_ledger` keeps steps)."""
    out: dict[int, dict[int, dict]] = {}
    for rank in ledger_ranks(exp):
        for rec in _read(exp, rank)[1]:
            out.setdefault(rec["epoch"], {})[rank] = rec
    return out


def ledger_ranks(exp: str | Path) -> list[int]:
    return sorted(int(p.stem[4:]) for p in (Path(exp) / layout.LEDGER).glob("rank*.jsonl"))


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
    return {
        "once": sum(1 for k in keys if c[k] == 1),
        "more_than_once": sum(1 for k in keys if c[k] > 1),
        "never": sum(1 for k in keys if c[k] == 0),
    }


def epoch_steps(exp: str | Path, epoch: int) -> list[tuple[int, list[str]]]:
    """``[(step, keys of every rank at that step), ...]`` of ``epoch``, in training order (the steps that
    count: undone ones dropped, as in :func:`read_ledger`)."""
    by_step: dict[int, list[str]] = {}
    for rank in ledger_ranks(exp):
        for rec in read_ledger(exp, rank):
            if rec["epoch"] == epoch:
                by_step.setdefault(rec["step"], []).extend(rec["keys"])
    return sorted(by_step.items())


def counts_until(steps: list[tuple[int, list[str]]], keys: list[str], step: int | None = None) -> list[int]:
    """How many times each of ``keys`` was trained in ``steps`` up to ``step`` (all of them: None)."""
    c: Counter = Counter()
    for s, ks in steps:
        if step is not None and s > step:
            break
        c.update(ks)
    return [c[k] for k in keys]


def coverage_report(
    exp: str | Path, epoch: int, keys: set[str] | None = None, show: int = 10, counts: dict[int, Counter] | None = None
) -> dict:
    """Whether ``epoch`` trained every key exactly once over all ranks, across kills and resumes.

    ``keys``: the epoch's utterances (without them, the keys any epoch of the ledger trained, which
    cannot see an utterance no epoch reached). Returns ``exactly_once``, the counts, and up to ``show``
    of the ``skipped`` and ``repeated`` keys (with their count). ``counts``: :func:`coverage` of ``exp``,
    when the caller has it already.
    """
    counts = coverage(exp) if counts is None else counts
    c = counts.get(epoch, Counter())
    if keys is None:
        keys = set().union(*counts.values()) if c else set()
    skipped = sorted(k for k in keys if c[k] == 0)
    repeated = sorted((k for k in c if c[k] > 1), key=lambda k: (-c[k], k))
    unknown = sorted(k for k in c if k not in keys)
    return {
        "epoch": epoch,
        "keys": len(keys),
        "once": sum(1 for k in keys if c[k] == 1),
        "skipped_count": len(skipped),
        "repeated_count": len(repeated),
        "unknown_count": len(unknown),
        "skipped": skipped[:show],
        "repeated": [(k, c[k]) for k in repeated[:show]],
        "unknown": unknown[:show],
        "exactly_once": not skipped and not repeated and not unknown and bool(keys),
    }


def _expected_keys(exp: Path, lab: dict) -> tuple[set[str] | None, str]:
    """The keys each epoch should train on once: ``lab.json``'s ``epoch_keys`` (a file of keys, one a line,
    or a JSON list), else None (judged against the keys seen in any epoch)."""
    ref = lab.get("epoch_keys")
    if not ref or not isinstance(ref, str):
        return None, "every key seen in any epoch; the run does not record the keys it expects"
    path = Path(ref) if Path(ref).is_absolute() else exp / ref
    try:
        text = path.read_text(encoding="utf-8")
        keys = json.loads(text) if path.suffix == ".json" else [ln.split()[0] for ln in text.splitlines() if ln.strip()]
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise ValueError("not a list of keys")
    except (OSError, ValueError, RecursionError) as e:  # ValueError: not UTF-8, not JSON, not a list of strings
        return None, f"every key seen in any epoch; lab.json's epoch_keys {path} cannot be read ({type(e).__name__})"
    return set(keys), f"the {len(keys)} keys of {path}"


def epoch_coverage_report(
    exp: str | Path, lab: dict | None = None, closed: set[int] = frozenset(), show: int = 5
) -> dict | None:
    """Per epoch of the ledger: trained exactly once, else the keys repeated and skipped.

    An epoch is over when the ledger goes on into a later one, a checkpoint marker closes it, or a rank
    stopped it with data left (``status`` "cut short", never "complete"). A complete epoch must hold every
    expected key exactly once; one in progress no key twice. ``status``, ``skipped`` and ``exactly_once``
    are the one reading the text renders. The
    expected keys are ``lab.json``'s ``epoch_keys`` when the run names them; otherwise (asrlab's trainer
    does not record its data list) every key seen in any epoch of the run, so a key left out of every
    epoch, or of the only epoch, cannot be seen: an epoch over is then "ended", never "complete"
    (``exactly_once``: every key seen, once; whether all were seen is not known). ``closed``: the epochs a
    checkpoint marker closed; ``show``: keys named per list. Returns None without a ledger.
    """
    exp = Path(exp)
    if not ledger_ranks(exp):
        return None
    cov = coverage(exp)
    expected, against = _expected_keys(exp, lab or {})
    known = expected is not None  # else judged against the keys seen: whether all were seen is not known
    if expected is None:
        expected = set().union(*cov.values()) if cov else set()
    left = read_untrained(exp)
    epochs = []
    for e in sorted(cov):
        cut = {
            str(r): {
                "utterances": x["utterances"],
                "batches": x["batches"],
                "exact": x["exact"],
                "after_step": x["after_step"],
                "after_batch": x.get("after_batch"),
                "keys": x["untrained"][:show],
                "known": len(x["untrained"]),
            }
            for r, x in sorted(left.get(e, {}).items())
        }
        # over when closed by a checkpoint marker (asrlab's trainer), followed by a later epoch, the last epoch
        # of a loop that says it finished (lab.json) holding every expected key, or cut short: a rank stopped
        # with data left
        ended = (lab or {}).get("status") == "finished" and e == max(cov)
        over = bool(cut) or e in closed or any(later > e for later in cov) or (ended and expected <= set(cov[e]))
        r = coverage_report(exp, e, expected, show, cov)
        # the one reading of the epoch, for the text and the JSON alike; an epoch still going has not
        # reached its skipped keys yet
        status = "cut short" if cut else ("complete" if known else "ended") if over else "in progress"
        epochs.append(
            {
                "epoch": e,
                "status": status,
                "complete": status == "complete",
                "keys": len(cov[e]),
                "once": r["once"],
                "cut_short": cut,
                "repeated": r["repeated_count"],
                "repeated_keys": dict(r["repeated"]),
                "skipped": r["skipped_count"] if over else 0,
                "skipped_keys": r["skipped"] if over else [],
                "unexpected": r["unknown_count"],
                "unexpected_keys": r["unknown"],
                "exactly_once": (r["exactly_once"] and not cut) if over else None,
            }
        )
    broken = any(x["repeated"] or x["cut_short"] or x["exactly_once"] is False for x in epochs)
    return {"expected": len(expected), "expected_known": known, "against": against, "epochs": epochs, "broken": broken}


def resumed_from(exp: str | Path) -> dict[int, list[int]]:
    """Per rank, the steps its ledger says the run went back to (a resume or a rollback)."""
    return {
        r: [x["resumed_from"] for x in read_jsonl(ledger_path(exp, r)) if "resumed_from" in x]
        for r in ledger_ranks(exp)
    }
