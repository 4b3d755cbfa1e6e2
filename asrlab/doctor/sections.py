"""The sections of a diagnosis, each readable alone: step times and their spread, corpora, non-finite
steps, the loss scale, resumes, ledger coverage and checkpoint integrity."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from ..lab import layout
from ..data.plan import mix_counts
from ..files import read_jsonl
from ..lab.metrics import summarize
from ..lab.numerics.events import read_events
from ..lab.state import checkpoint
from ..lab.state.ledger import coverage, coverage_report, ledger_path, ledger_ranks, read_untrained
from ..lab.timing import bound, split_of_phases, step_split
from .read import kept_steps, read_json
from .timeline import resumes

FIRST = 5  # keys, steps, ... named in the text before "+N more"
# a rank's reads hold the others up when its data-wait share is this far above the others' median, and this
# many times it: sampled shares of equal ranks differ by up to 10 points, and ranks that all wait for data
# alike (a loader too slow everywhere) have no one rank to blame
SLOW_READ_POINTS = 0.15
SLOW_READ_TIMES = 2.0


def slow_reader(shares: dict[int, float]) -> int | None:
    """The rank whose reads hold the others up, from each rank's share of its time waiting for data: the one
    at least :data:`SLOW_READ_POINTS` above the median of the others and :data:`SLOW_READ_TIMES` times it;
    None when no rank stands out so (one rank alone, equal ranks, every rank slow alike)."""
    if len(shares) < 2:
        return None
    rank = max(shares, key=lambda r: shares[r])
    others = sorted(v for r, v in shares.items() if r != rank)
    mid = len(others) // 2
    median = others[mid] if len(others) % 2 else (others[mid - 1] + others[mid]) / 2
    return rank if shares[rank] >= median + SLOW_READ_POINTS and shares[rank] >= SLOW_READ_TIMES * median else None


def step_times(metrics: dict[str, list[dict]], beats: dict[int, dict]) -> dict:
    """Per rank: steps, median step time, share of it waiting for data (:func:`summarize`, the first step
    left out), and the spread: the slowest rank and how much slower than the fastest its median step is.
    ``metrics``: each rank's metric lines (``{"rank0": [...]}``); ``beats``: the ranks' heartbeats."""
    missing = None
    try:
        ranks = summarize(metrics)
    except KeyError as e:  # a loop's metrics without the trainer's timing keys
        ranks, missing = [], f"the metrics lines have no {e}"
    ranks = ranks or _heartbeat_times(beats)  # a loop without asrlab's metrics: its heartbeat's time per phase
    if not ranks and missing:
        return {"ranks": [], "spread": None, "missing": missing}
    out: dict = {
        "ranks": [
            {
                **r,
                "median_step_s": None if r["median_step_s"] is None else round(r["median_step_s"], 6),
                "data_wait_share": round(r["data_wait_share"], 4),
            }
            for r in ranks
        ],
        "spread": None,
    }
    for r in out["ranks"]:
        if r.get("source") is None:  # from metrics lines: where the steps' wall clock went
            try:
                r["split"] = step_split(metrics[f"rank{r['rank']}"][1:])
            except KeyError:  # a loop's metrics without the timing keys
                r["split"] = None
        elif r.get("shares"):  # sampled stacks (and the GPU's busy share, where the watch read NVML)
            r["split"] = split_of_phases(r["shares"], r.get("gpu_busy"))
        if r.get("split"):
            r["bound"] = bound(r["split"], r.get("gpu_busy"), ranks=len(ranks))
    if any(r.get("rank_known") is False for r in ranks):  # processes no launcher named: no ranks to compare
        pass
    elif len(ranks) > 1 and any(r["median_step_s"] is None for r in ranks):  # sampled from outside: no step times
        most = max(ranks, key=lambda r: r["data_wait_share"])
        out["spread"] = {"most_data_wait_rank": most["rank"], "data_wait_share": round(most["data_wait_share"], 4)}
    elif len(ranks) > 1:
        slow = max(ranks, key=lambda r: r["median_step_s"])
        fast = min(ranks, key=lambda r: r["median_step_s"])
        out["spread"] = {
            "slowest_rank": slow["rank"],
            "fastest_rank": fast["rank"],
            "slowest_s": round(slow["median_step_s"], 6),
            "fastest_s": round(fast["median_step_s"], 6),
            "ratio": round(slow["median_step_s"] / max(1e-9, fast["median_step_s"]), 3),
        }
    if out["spread"] is not None:
        out["spread"]["slow_reader"] = slow_reader({r["rank"]: r["data_wait_share"] for r in ranks})
    return out


def corpus_throughput(metrics: dict[str, list[dict]]) -> dict | None:
    """Per corpus of a mixed run, over every rank's metrics (the steps that count): utterances, audio
    hours, and audio seconds per second of loader work (reading and decoding), the slowest named: a
    corpus far slower than the rest starves the ranks that draw it. None for a run on one list."""
    total = mix_counts([m for lines in metrics.values() for m in kept_steps(lines)])
    if not total:
        return None
    out = {
        c: {"utts": n, "hours": round(a / 3600, 4), "audio_per_load_s": round(a / w, 1) if w > 0 else None}
        for c, (n, a, w) in sorted(total.items())
    }
    rated = [c for c in out if out[c]["audio_per_load_s"]]
    return {"corpora": out, "slowest": min(rated, key=lambda c: out[c]["audio_per_load_s"]) if len(rated) > 1 else None}


def _heartbeat_times(beats: dict[int, dict]) -> list[dict]:
    """Per rank, from the time a StallWatch heartbeat kept per phase (a loop without asrlab's metrics):
    steps done, mean seconds per step (``median_step_s`` holds the mean), share of it waiting for data."""
    out = []
    for rank, b in sorted(beats.items()):
        if b.get("watched"):  # asrlab watch: seconds per phase from sampled stacks, no step count
            spent = {p: s for p, s in (b.get("phase_s") or {}).items() if p not in ("start", "done")}
            total = sum(spent.values())
            if total > 0:
                out.append(
                    {
                        "rank": rank,
                        "rank_known": b.get("rank_known") is not False,
                        "pid": b.get("pid"),
                        "steps": None,
                        "median_step_s": None,
                        "data_wait_share": spent.get("data", 0.0) / total,
                        "source": "sampled stacks",
                        "shares": {p: round(t / total, 4) for p, t in sorted(spent.items(), key=lambda x: -x[1])},
                        "gpu_busy": b.get("gpu_busy"),
                    }
                )
            continue
        spent = {p: s for p, s in (b.get("phase_s") or {}).items() if p not in ("start", "epoch_end", "done", "eval")}
        steps = b.get("completed", 0)
        if steps and sum(spent.values()) > 0:
            total = sum(spent.values())
            out.append(
                {
                    "rank": rank,
                    "steps": steps,
                    "median_step_s": total / steps,
                    "data_wait_share": spent.get("data", 0.0) / total,
                    "source": "heartbeat (mean)",
                }
            )
    return out


def nonfinite_events(exp: str | Path, metrics: dict[str, list[dict]]) -> dict:
    """The replay bundles of non-finite steps (``EXP/nonfinite/step*-rank*/``: step, kind, module, direction,
    utterance ids), every non-finite step the numerics guard logged (``log``: each with the utterances that
    were not finite where it could tell; ``by_utterance``: their steps) and the steps any rank's metrics marked non-finite (its loss, or gradients; fp16
    overflows the loss scaler handles are counted in :func:`loss_scale_history`). Every rank's: a rank's
    own non-finite loss is marked on that rank only."""
    events = []
    for report in sorted(Path(exp).glob("nonfinite/step*-rank*/report.json")):
        m = read_json(report)
        if m is None:
            continue
        events.append(
            {
                **{
                    k: m.get(k)
                    for k in (
                        "step",
                        "rank",
                        "epoch",
                        "kind",
                        "module",
                        "direction",
                        "where",
                        "keys",
                        "loss",
                        "grad_norm",
                        "loss_scale",
                        "precision",
                        "cause",
                        "utterances",
                        "found_by",
                        "micro_batch",
                        "micro_batches",
                    )
                },
                "bundle": str(report.parent),
            }
        )
    steps = sorted({m["step"] for lines in metrics.values() for m in lines if m.get("nonfinite") in ("loss", "grad")})
    log, other = read_events(exp)
    by_utt: dict[str, list[int]] = {}
    for e in log:
        for k in e.get("utterances") or []:
            by_utt.setdefault(k, []).append(e["step"])
    return {
        "events": events,
        "steps": steps,
        "log": log,
        "count": len({e["step"] for e in log}),
        "by_utterance": by_utt,
        "other_versions": other,
    }


def loss_scale_history(rank0: list[dict]) -> dict | None:
    """Rank 0's loss scale over the steps that count (first, min, last, how often it changed) and the
    skipped steps by kind (``scaler``: fp16 overflow the scaler handles; ``loss``/``grad``: not finite)."""
    if not rank0:
        return None
    scales = [m["loss_scale"] for m in rank0 if m.get("loss_scale") is not None]
    kinds = Counter(m.get("nonfinite") for m in rank0 if m.get("nonfinite"))
    out = {
        "skipped": rank0[-1].get("skipped", 0),
        "skipped_by_kind": dict(kinds),
        "rollbacks": rank0[-1].get("rollbacks", 0),
    }
    if scales:
        out.update(
            first=scales[0],
            min=min(scales),
            last=scales[-1],
            changes=sum(1 for a, b in zip(scales, scales[1:]) if a != b),
        )
    return out


def resume_points(exp: str | Path, raw: list[dict]) -> dict:
    """Where the run went back to a checkpoint: the ledger's ``resumed_from`` lines (a resume or a
    rollback), per rank; and where rank 0's metrics (``raw``, as written) went back (only resumes that lost
    steps show there)."""
    exp = Path(exp)
    per_rank = {
        r: [x["resumed_from"] for x in read_jsonl(ledger_path(exp, r)) if "resumed_from" in x]
        for r in ledger_ranks(exp)
    }
    steps = sorted({s for v in per_rank.values() for s in v})
    redone = [
        {"after_step": a["step"], "back_to_step": b["step"] - 1} for a, b in zip(raw, raw[1:]) if b["step"] <= a["step"]
    ]
    return resumes(
        ledger=bool(per_rank),
        resumed_from=steps,
        per_rank={str(r): v for r, v in per_rank.items()},
        trained_again=redone,
    )


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


def ledger_coverage(exp: str | Path, lab: dict | None = None, ckpts: dict | None = None) -> dict | None:
    """Per epoch of the ledger: trained exactly once, else the keys repeated and skipped.

    An epoch is over when the ledger goes on into a later one, a checkpoint marker closes it, or a rank
    stopped it with data left (``status`` "cut short", never "complete"). A complete epoch must hold every
    expected key exactly once; one in progress no key twice. ``status``, ``skipped`` and ``exactly_once``
    are the one reading the text renders. The
    expected keys are ``lab.json``'s ``epoch_keys`` when the run names them; otherwise (asrlab's trainer
    does not record its data list) every key seen in any epoch of the run, so a key left out of every
    epoch, or of the only epoch, cannot be seen: an epoch over is then "ended", never "complete"
    (``exactly_once``: every key seen, once; whether all were seen is not known). Returns None without a ledger.
    """
    exp = Path(exp)
    if not ledger_ranks(exp):
        return None
    cov = coverage(exp)
    expected, against = _expected_keys(exp, lab or {})
    known = expected is not None  # else judged against the keys seen: whether all were seen is not known
    if expected is None:
        expected = set().union(*cov.values()) if cov else set()
    closed = {c["epoch"] for c in (ckpts or checkpoint_integrity(exp))["files"] if c.get("epoch_done")}
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
                "keys": x["untrained"][:FIRST],
                "known": len(x["untrained"]),
            }
            for r, x in sorted(left.get(e, {}).items())
        }
        # over when closed by a checkpoint marker (asrlab's trainer), followed by a later epoch, the last epoch
        # of a loop that says it finished (lab.json) holding every expected key, or cut short: a rank stopped
        # with data left
        ended = (lab or {}).get("status") == "finished" and e == max(cov)
        over = bool(cut) or e in closed or any(later > e for later in cov) or (ended and expected <= set(cov[e]))
        r = coverage_report(exp, e, expected, FIRST, cov)
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


def checkpoint_integrity(exp: str | Path) -> dict:
    """Each checkpoint: its marker, its bytes against the marker's SHA-256; the newest a resume would
    load (:func:`asrlab.lab.state.checkpoint.load_latest`), and the training clock it holds."""
    d = layout.checkpoints_dir(exp)
    files = []
    for m in checkpoint.list_checkpoints(d):
        path = d / m["file"]
        entry = {
            "step": m["step"],
            "epoch": m.get("epoch"),
            "epoch_done": m.get("epoch_done"),
            "file": m["file"],
            "marker": m["complete"],
            "sha256_ok": None,
        }
        try:
            entry["bytes"] = path.stat().st_size
            if m["complete"]:
                entry["sha256_ok"] = checkpoint.sha256(path) == m.get("sha256")
        except FileNotFoundError:  # a live run's keep_last removed it just now
            continue
        entry["state"] = (
            "ok"
            if entry["sha256_ok"]
            else "no marker (write interrupted: never loaded)"
            if not m["complete"]
            else "SHA-256 mismatch (truncated or corrupt: never loaded)"
        )
        files.append(entry)
    files += _lightning_checkpoints(exp)
    partial = sorted(p.name for p in d.glob("*.tmp")) if d.is_dir() else []
    newest = clock = None
    if any(f["sha256_ok"] for f in files):
        found = checkpoint.load_latest(d)
        if found is not None:
            state, marker = found
            newest = marker["file"]
            from ..lab.state.run_state import upgrade  # torch is loaded by now, to read the checkpoint

            try:
                clock = (upgrade(state, newest)["extra"].get("clock") or {}).get("elapsed_s")
            except ValueError:  # a checkpoint of another schema: its clock is not known here
                clock = None
    if newest is None:  # Lightning's, by step: what fit(ckpt_path=...) would restore
        newest = next(
            (
                f["file"]
                for f in sorted(files, key=lambda f: f["step"], reverse=True)
                if f.get("lightning") and f["state"].startswith("ok")
            ),
            None,
        )
    return {"files": files, "partial_writes": partial, "newest_loadable": newest, "clock_s": clock}


def _lightning_checkpoints(exp: str | Path) -> list[dict]:
    """The checkpoint files Lightning saved (as ``AsrlabCallback`` recorded them), the newest record of each,
    with its state now: ok (its size and time as saved), missing, or changed since (another run wrote it)."""
    newest: dict[str, dict] = {}
    path = layout.lightning_checkpoints(exp)
    for r in read_jsonl(path) if path.exists() else []:
        newest[r["file"]] = r
    out = []
    for r in sorted(newest.values(), key=lambda r: r["step"]):
        try:
            st = Path(r["file"]).stat()
            state = "ok" if (st.st_mtime, st.st_size) == (r["mtime"], r["bytes"]) else "changed since it was saved"
        except OSError:
            state = "missing"
        out.append(
            {
                "step": r["step"],
                "epoch": r["epoch"],
                "epoch_done": None,
                "file": r["file"],
                "marker": None,
                "sha256_ok": None,
                "bytes": r["bytes"],
                "state": f"{state} (Lightning's)",
                "lightning": True,
            }
        )
    return out
