"""``asrlab doctor PATH ...``: what happened to a run, from what it left (asrlab's run folders, a job's logs, a
toolkit's folder). :func:`diagnose` gives a JSON-ready dict of :data:`SCHEMA`'s keys, :func:`format_diagnosis` its
text; :mod:`.verdict` takes the first failure by time over every source. Nothing here writes to what it reads: a
doctor may look at a live run."""

from __future__ import annotations

import math
import re
from pathlib import Path

from ..errors import UsageError
from ..files import read_json
from ..lab import layout
from ..lab.layout import is_run
from ..lab.timing import bound, with_gpu_busy
from .timeline import resumes
from .verdict import FAILED, VERDICTS, in_epoch


# the renderer imports torch (via lab.timing, lab.state): loaded on first use, so that a wrong folder is said at
# once and ``asrlab doctor`` starts without it
def __getattr__(name: str):
    if name == "format_diagnosis":
        from .render import format_diagnosis

        return format_diagnosis
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# the keys of every diagnosis, whatever was read (None where the paths held nothing of the kind): what happened,
# then asrlab's run folder's sections, then a log's and a toolkit folder's
SCHEMA = (
    "read", "paths", "verdict", "summary", "ok", "culprit", "next", "first", "history", "world_size", "ranks", "nonfinite",
    "resumes", "checkpoints", "warnings", "series", "sources",
    "exp", "time", "launched", "config", "last_step", "stop_requested", "steps", "corpora", "loss_scale", "coverage",
    "coverage_not_measured", "error", "halt", "stall", "ended_by", "basis", "job_output", "nodes",
    "files", "lines", "unread", "formats", "events", "hang", "step_spread", "read_s",
)  # fmt: skip
_DECIDED = ("verdict", "summary", "culprit", "first", "basis", "history")  # of decide()'s answer, as it says them


def diagnose(paths, now: float | None = None) -> dict:
    """What ``asrlab doctor PATH ...`` says, as a JSON-ready dict with the keys of :data:`SCHEMA`: run folders
    (several: one per node, read as one run), else logs and toolkit folders. Raises :class:`UsageError` for
    nothing there, or for run folders beside other paths."""
    paths = [str(paths)] if isinstance(paths, (str, Path)) else [str(p) for p in paths]
    if not paths:
        raise UsageError("nothing to read: give a run's folder, its logs, or a toolkit's folder")
    for p in paths:
        if p != "-" and not Path(p).exists():
            give = "give a run's folder, what asrlab train got as --exp, or the run's log files"
            raise UsageError(f"{p}: not a directory, nothing is there ({give})")
    runs = [p != "-" and is_run(p) for p in paths]
    from .render import next_step  # (render imports this package: here, not at the top)

    if not any(runs):
        d = diagnose_logs(paths)
        return conform({**d, "next": d.get("next") or next_step(d, log=True)}, "logs", paths)
    if not all(runs):
        bad = ", ".join(p for p, r in zip(paths, runs) if not r)
        raise UsageError(f"give run folders or logs, not both: {bad} is not a run folder")

    if len(paths) == 1:
        d = diagnose_run(paths[0], now)
        return conform({**d, "next": next_step(d)}, "run folder", paths)
    import tempfile

    from .merge import merge_runs

    with tempfile.TemporaryDirectory(prefix="asrlab-doctor-") as tmp:  # the nodes' files side by side, read, gone
        d = _rehomed(diagnose_run(merge_runs(paths, tmp), now, nodes=paths), tmp, paths)
    d["exp"], d["nodes"] = ", ".join(paths), paths
    c = d["culprit"]["rank"]
    if d["stall"] and c is not None:  # the report of the node whose own stall files hold the culprit's stacks
        own = next((n for n in paths if (Path(n) / layout.STALL / f"rank{c}.json").exists()), None)
        if own is not None and (Path(own) / layout.STALL_TEXT).exists():
            d["stall"]["report"] = str(Path(own) / layout.STALL_TEXT)
    return conform({**d, "next": next_step(d)}, "run folder", paths)


def _rehomed(x, tmp: str, nodes: list[str]):
    """``x`` with every path into the merged folder ``tmp`` (a stall report, a step's bundle) made the path of the
    node folder that holds the same file, or None where none does: the merged folder is gone once read."""
    if isinstance(x, dict):
        return {k: _rehomed(v, tmp, nodes) for k, v in x.items()}
    if isinstance(x, list):
        return [_rehomed(v, tmp, nodes) for v in x]
    if isinstance(x, str) and x.startswith(tmp):
        rel = Path(x).relative_to(tmp)
        return next((str(Path(n) / rel) for n in nodes if (Path(n) / rel).exists()), None)
    return x


def diagnose_logs(paths: list[str]) -> dict:
    """What logs and toolkit folders say (``diagnose`` of paths that hold no asrlab run folder)."""
    return read_and_diagnose(paths)[1]


def read_and_diagnose(paths: list[str]) -> tuple:
    """``(LogRun, diagnosis)``: the logs' step records (for plots) and what the doctor says of everything at
    ``paths``: the logs and the tables beside them (event files, a trainer's state, a metrics CSV)."""
    from .logs.run import LogRun, log_files
    from .sources import files_of, job_output, read_sources, run_folder, text_log
    from .verdict import decide

    files = files_of(paths)  # the folders walked once, for every source
    # asrlab's own folders inside a toolkit's (asrlab watch's beside the toolkit's output): run folders of their own;
    # a file given by name is read as itself (a watched run's EXP/job.log: its lines, not its folder)
    given = {Path(p) for p in paths}
    runs = sorted({f.parent for f in files if f not in given and is_run(f.parent)})
    folders = []
    for d in runs:
        folder = run_folder.read(d)
        folders += [r for r in (folder, job_output.read(d, folder.sections["launched"])) if r is not None]
    tables = folders + read_sources(files)
    skip = {f for r in tables for f in r.files} | {f for d in runs for f in log_files([str(d)])}
    log = text_log.read(paths, skip=skip)  # a metrics.csv is a table, not a log; a run folder's files its own
    if log is None and not tables:
        raise UsageError(
            f"{paths[0]}: no run there (none of asrlab's {', '.join(layout.RUN_FILES)}), no log files (*.log, "
            "*.txt, *.out, log-train-*, rank*) and no TensorBoard event files, trainer_state.json or metrics.csv"
        )
    said = [log] if log and (log.raw.lines or len(tables) == len(folders)) else []  # an empty log beside tables: theirs
    v = decide(folders + said + tables[len(folders) :])  # precedence: asrlab's own, the log, tables
    d = dict(log.sections) if log else dict(EMPTY_LOG, resumes=resumes())  # a section of its own, not shared
    d.update({k: v[k] for k in _DECIDED})
    if folders:  # a watched run's folder inside: its jobs' lines place what its folder does not
        _place_from_jobs(d, [r for r in folders if r.source == "job output"])
    # one rule for any path: a stop on request is no failure; data a restart trained twice is
    d["ok"] = d["verdict"] not in FAILED and not _twice(d)
    d["series"] = {r.source: {k: {"steps": [s for s, _ in p], "values": [x for _, x in p]} for k, p in r.series.items()}
                   for r in tables if r.series}  # fmt: skip
    d["warnings"] = [{**w, "source": r.source} for r in ([log] if log else []) + tables for w in r.warnings]
    d["sources"] = [{"source": r.source, "files": r.files, "notes": r.notes} for r in tables]
    if (d["verdict"] == "no_failure_seen" or d["basis"] == "series") and d["warnings"] and "; but " not in d["summary"]:
        d["summary"] += ("; but " if d["verdict"] == "no_failure_seen" else "; also, ") + d["warnings"][0]["text"]
    from .logs.checkpoints import checkpoints  # torch, only where there are checkpoints to open

    d["checkpoints"] = checkpoints(paths)
    inside = next((Path(p).parent for p in paths if Path(p).is_file() and is_run(Path(p).parent)), None)
    if inside is None and runs and d["verdict"] == "stalled":  # the watch's folders inside (a node's each)
        d["next"] = f"asrlab doctor {' '.join(map(str, runs))} reads the ranks' stacks the watch saved there"
    if inside is not None:  # a watched job's log read alone: the watch's own records of it are beside it
        d["next"] = (
            f"asrlab doctor {inside} reads what the watch recorded beside this log (stacks, heartbeats, its stop)"
        )
    # a checkpoint saved at or after the first non-finite step (not a transient one) may hold what went non-finite
    bad = d["culprit"]["step"] if d["verdict"] == "nonfinite" and not (d["nonfinite"] or {}).get("transient") else None
    if bad is not None and d["checkpoints"]:
        c = d["culprit"]  # a place in its epoch (a bar's count) is no global step: a later epoch is after it
        placed = in_epoch(c)
        for r in d["checkpoints"]["files"]:
            after = r["epoch"] is not None and r["epoch"] > c["epoch"] if placed else r["step"] is not None
            r["after_failure"] = after and (placed or r["step"] >= bad)
    return (log.raw if log else LogRun()), d


# a log's sections where no log was read (a folder of event files alone)
EMPTY_LOG = {
    "hang": None, "nonfinite": None, "resumes": resumes(), "ranks": [], "step_spread": None, "files": [], "lines": 0,
    "unread": 0, "formats": {}, "world_size": None, "events": {}, "read_s": 0.0,
}  # fmt: skip


def conform(d: dict, read: str, paths: list[str]) -> dict:
    """``d`` with every key of :data:`SCHEMA` (None where not read), in its order, JSON-ready whatever was read (a
    series' nan as "nan": strict JSON has none); a key outside it is a bug."""
    extra = set(d) - set(SCHEMA)
    assert not extra, f"keys outside the doctor's schema: {sorted(extra)}"
    d = {**d, "read": read, "paths": paths}
    return json_ready({k: d.get(k) for k in SCHEMA})


def diagnose_run(exp: str | Path, now: float | None = None, nodes: list[str] | None = None) -> dict:
    """What ``asrlab doctor EXP`` says of the run in ``exp`` (and of the job ``asrlab watch`` kept the output of
    there); ``nodes``: the folders ``exp`` merges, whose watched jobs' output is read from each."""
    exp = Path(exp)
    from .sources import job_output, run_events, run_folder
    from .verdict import decide, first_failure, spoke

    folder = run_folder.read(exp, now)
    inner = [run_folder.read(p, now) for p in folder.inside]
    jobs = [j for p in nodes or [exp] if (j := job_output.read(Path(p), folder.sections["launched"])) is not None]
    job = jobs[0] if jobs else None
    for e in folder.events if jobs else ():  # a vanished rank the job's output holds no traceback of: a signal ended
        # it, or it left on its own without a word (which, nothing here says)
        unsaid = e.get("guess") and e["rank"] is not None and run_events.UNSAID in e["text"]
        said = (x for j in jobs for x in j.events if spoke(x))
        if unsaid and not any(x.get("rank") == e["rank"] for x in said):
            said = "the job's output shows no error of it: killed by a signal (SIGKILL: the OOM killer, a lost node)"
            e["text"] = e["text"].replace(run_events.UNSAID, f"{said}, or it left on its own without a word")
    v = decide([folder, *inner, *jobs])
    d = folder.sections
    for r in inner:
        _fill(d, r.sections)
    if inner:
        d["sources"] = [
            {"source": r.source, "files": r.files, "notes": ["the watched job's own run folder"]} for r in inner
        ]
    d.update({k: v[k] for k in _DECIDED})
    d["ended_by"] = v["first"].get("ended_by") if v["first"] else v.get("ended_by")
    c = d["culprit"]
    if d["verdict"] == "stopped" and (d["last_step"] or -1) > (-1 if c["step"] is None else c["step"]):
        c.update(step=d["last_step"], epoch=None, batch=None)  # stopped where the furthest record is, not an older line
    if job is not None:
        d["job_output"] = job.sections
        if not d["checkpoints"]["files"]:  # none of asrlab's: the watched loop's own, in the folder, as a log's are
            d["checkpoints"] = _own_checkpoints(exp) or d["checkpoints"]
        if not d["nonfinite"]["count"] and (job.sections["nonfinite"] or {}).get("count"):
            d["nonfinite"]["count"] = job.sections["nonfinite"]["count"]  # --json's one count: the job's lines'
        if not d["resumes"]["ledger"] and job.sections["resumes"]["from_output"]:
            # no ledger in the folder: the job's own lines show where a restart went back to
            d["resumes"]["from_output"] = job.sections["resumes"]["from_output"]
            if d["verdict"] in ("finished", "running"):  # a restart that went back to batch 0 is said first
                d["summary"] += "; " + d["resumes"]["from_output"][0]["text"]
        if job.warnings:  # a loss that diverged and stayed so, an evaluation's nan: said where the run did not fail
            d["warnings"] = [{**w, "source": job.source} for w in job.warnings]
            if d["verdict"] in ("finished", "running"):
                d["summary"] += "; but " + job.warnings[0]["text"]
        _place_from_jobs(d, jobs)
        if d["verdict"] == "stalled" and c["rank"] is None:  # a hang the job's pace told: who held the others up
            c["rank"] = _holding(d["ranks"], d["world_size"] or len(d["ranks"]))
            held = next((r for r in d["ranks"] if r["rank"] == c["rank"]), None) if c["rank"] is not None else None
            if held is not None:
                d["summary"] += f"; its last heartbeats: rank {c['rank']} outside any collective ({held['detail']}), "
                d["summary"] += "every other rank waiting in one"
        own = first_failure(folder.events)
        if v["basis"] == "job output" and own and not own.get("guess") and own.get("lost_peer") and d["error"]:
            d["error"]["lost_peer"] = True  # said under the cause, not as the first error
    broken = d["coverage"] is not None and d["coverage"]["broken"]
    if broken:  # said on the first line too: a run that finished but trained keys twice or left some out is not ok
        d["summary"] += "; but " + _broken(d["coverage"])
    d["ok"] = d["verdict"] not in FAILED and not broken and not _twice(d)
    return d


def _place_from_jobs(d: dict, jobs: list) -> None:
    """The culprit's step from the watched jobs' own lines, where the watch's folder has none: the watch samples
    stacks, not steps (lines of no rank mark are one rank's printing for all: the last step the job printed); a stop
    said at each rank's last step."""
    c, last = d["culprit"], [x for j in jobs for x in j.sections["last_steps"]]
    if c["rank"] is not None and c["step"] is None:
        unmarked = {**last[0]["culprit"], "rank": c["rank"]} if len(last) == 1 and last[0]["rank"] is None else c
        c.update(next((x["culprit"] for x in last if x["rank"] == c["rank"]), unmarked))
    if d["verdict"] == "stopped" and not re.search(r" at (?:step|epoch|batch) \d", d["summary"]) and last:
        if len({r["last"] for r in last}) == 1:  # every rank at one place
            d["summary"] += " at " + last[0]["last"]
        else:
            where = ", ".join(r["last"] if r["rank"] is None else f"rank {r['rank']} {r['last']}" for r in last)
            d["summary"] += f" (each rank's last: {where})"
        far = max((x["culprit"] for x in last), key=lambda x: (x["epoch"] or 0, x["step"] or 0))
        c.update(step=far["step"], epoch=far["epoch"], batch=far["batch"])  # where it was when stopped


def _holding(ranks: list[dict], world: int) -> int | None:
    """The one rank the last heartbeats show outside a collective while every other waits in one (it holds them
    up: a step of its own far longer than the others', or a loop it never left); None where that is not so."""
    from ..lab.stall.classify import held_phase
    from ..lab.stall.verdict import WAITING

    outside = [r["rank"] for r in ranks if held_phase(r.get("phase") or "", world) not in WAITING]
    return outside[0] if len(outside) == 1 and len(ranks) > 1 else None


def _twice(d: dict) -> bool:
    """Whether a restart the output shows trained data twice (its step went on from the checkpoint, its data not)."""
    return any(r.get("trained_twice") for r in d["resumes"]["from_output"])


def _own_checkpoints(exp: Path) -> dict | None:
    """A watched loop's own checkpoints in its folder and one level below (``ckpt/snap_it0030.pt``, WeNet's
    ``10.pt``), and so in the job's working folder where the run folder is inside it (``--exp exp/watched``), in
    the run folder's shape; ``own``: a resume is the loop's own doing."""
    from .logs.checkpoints import checkpoints  # torch, only where there are checkpoints to open

    cwd = (read_json(exp / layout.LAB) or {}).get("cwd")
    inside = cwd is not None and Path(cwd).resolve() in exp.resolve().parents
    found = checkpoints([str(exp)] + ([cwd] if inside else []))
    if found is None:
        return None
    files = [
        {**{k: r[k] for k in ("file", "epoch", "step")}, "state": "ok" if r["intact"] else r["why"]}
        for r in found["files"]
    ]
    return {"files": files, "partial_writes": [], "newest_loadable": found["newest"], "clock_s": None, "own": True}


def _broken(coverage: dict) -> str:
    """``epoch 0: 80 keys trained twice`` for each epoch whose coverage is broken."""
    said = []
    for e in coverage["epochs"]:
        counts = ((e["repeated"], "trained twice"), (e["skipped"], "skipped"), (e["unexpected"], "not expected"))
        what = [f"{n} key{'s' * (n > 1)} {how}" for n, how in counts if n] + (["cut short"] if e["cut_short"] else [])
        if what:
            said.append(f"epoch {e['epoch']}: {', '.join(what)}")
    return "; ".join(said)


def _fill(d: dict, inner: dict) -> None:
    """The sections of the watch's folder ``d`` that it did not record, from the watched job's own run folder
    (asrlab train's metrics, checkpoints, stall report); its step times beside the watch's sampled ones."""
    for k in ("config", "last_step", "corpora", "loss_scale", "coverage", "error", "halt", "stall"):
        if d.get(k) is None:
            d[k] = inner.get(k)
    if not d["nonfinite"]["count"] and not d["nonfinite"]["events"]:
        d["nonfinite"] = inner["nonfinite"]
    if not d["resumes"]["ledger"] and not d["resumes"]["resumed_from"]:
        d["resumes"] = inner["resumes"]
    if not d["checkpoints"]["files"]:
        d["checkpoints"] = inner["checkpoints"]
    timed = [r for r in inner["steps"]["ranks"] if r.get("median_step_s") is not None]
    for sampled in d["steps"]["ranks"]:  # one bound per rank: its timed steps', told with the GPU the watch read
        same = next((r for r in timed if r["rank"] == sampled["rank"] and r.get("split")), None)
        if same is None or sampled.pop("bound", None) is None:
            continue
        if (busy := sampled.get("gpu_busy")) is not None:
            same.update(gpu_busy=busy, split=with_gpu_busy(same["split"], busy))
            same["bound"] = bound(same["split"], busy, ranks=len(timed))
    d["steps"] = {**d["steps"], "ranks": timed + d["steps"]["ranks"]}
    d["world_size"] = max(d["world_size"], inner["world_size"])


def json_ready(x: object) -> object:
    """JSON-ready: inf and nan as strings (strict JSON has neither)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_ready(v) for v in x]
    return x


__all__ = ["FAILED", "VERDICTS", "is_run", "SCHEMA", "conform", "diagnose", "diagnose_logs", "json_ready"]
__all__ += ["read_and_diagnose", "format_diagnosis"]
