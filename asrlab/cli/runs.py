"""What a run left: ``asrlab doctor``, ``asrlab ckpt``, ``asrlab decode``; and ``asrlab notebooks``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..lab import layout
from ..errors import UsageError
from .args import command


def _speeds(text: str) -> tuple[float, ...]:
    """``"0.9,1.0,1.1"`` -> ``(0.9, 1.0, 1.1)`` (their range is ``data.speed``'s check, in ``decode_exp``)."""
    try:
        return tuple(float(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"speeds are numbers separated by commas, not {text!r}") from None


def cmd_decode(a: argparse.Namespace) -> int:
    from ..decode import decode_exp

    r = decode_exp(a.exp, a.data, a.name, a.lexicon, a.beam, a.lm_weight, a.word_bonus, a.speeds, a.device)
    short = r["decoded"] - r["utts"]
    short = f", {short} of them too short for CTC to align" if short else ""
    print(
        f"{r['data']}: CER {100 * r['cer']:.2f}%, WER {100 * r['wer']:.2f}% over {r['decoded']} utterances "
        f"(checkpoint step {r['step']}, greedy{short}); hypotheses in {r['hyps_path']}"
    )
    if "lexicon" in r:
        lx = r["lexicon"]
        speeds = "" if lx["speeds"] == [1.0] else ", speeds " + ",".join(f"{s:g}" for s in lx["speeds"])
        print(
            f"{r['data']}: CER {100 * lx['cer']:.2f}%, WER {100 * lx['wer']:.2f}% with the lexicon of {a.lexicon} "
            f"(beam {lx['beam']}, LM weight {lx['lm_weight']}, word bonus {lx['word_bonus']}{speeds}); hypotheses in {lx['hyps_path']}"
        )
    return 0


def cmd_ckpt(a: argparse.Namespace) -> int:
    from ..lab.state import checkpoint

    ckpt_dir = Path(a.exp) / layout.CHECKPOINTS
    rows = checkpoint.list_checkpoints(ckpt_dir)
    if not rows:
        raise UsageError(f"no checkpoints in {ckpt_dir}")
    print(f"{'step':>8} {'epoch':>5}  {'state':10s} position (rank 0: per worker source/offset/block/batch)")
    for m in rows:
        state = "complete" if m["complete"] else "INCOMPLETE"
        where = (
            "epoch done"
            if m.get("epoch_done")
            else "  ".join(
                f"w{w}: {p['source']}/{p['offset']}/{p['block']}/{p['batch']}"
                for w, p in sorted((m.get("rank0_position") or {}).items())
            )
        )
        print(f"{m['step']:>8} {m.get('epoch', '?'):>5}  {state:10s} {where or '-'}")
    if a.digest:
        found = checkpoint.load_latest(ckpt_dir)
        if found is None:
            raise UsageError(f"no complete checkpoint in {ckpt_dir}")
        state, marker = found
        print(f"{checkpoint.state_digest(state)}  {marker['file']} (model and optimizer tensors)")
    return 0


def cmd_doctor(a: argparse.Namespace) -> int:
    from ..doctor import diagnose  # torch comes with the reading of a run: a wrong folder is said without it

    if a.pid is not None:
        return _doctor_pid(a)
    if not a.exp:
        raise UsageError(
            "asrlab doctor EXP [EXP ...], asrlab doctor LOG [LOG ...], or asrlab doctor --pid PID for a job running now"
        )
    d = diagnose(a.exp)
    if a.json:
        print(json.dumps(d, indent=1, default=str))
    else:
        from ..doctor import format_diagnosis

        if d["nodes"]:
            print(f"(the {len(a.exp)} folders {', '.join(map(str, a.exp))} read as one run)")
        print(format_diagnosis(d).rstrip("\n"))
    return 0 if d["ok"] else 1


def _running(d: dict) -> bool:
    """A look's word that the job runs: a rank moved (its stacks, its loop's count), or one computed."""
    return d["moved"] or bool(d["busy"])


def pid_diagnosis(d: dict, pid: int) -> dict:
    """What ``asrlab doctor --pid`` saw (:func:`asrlab.watch.look.look`) in the doctor's one JSON shape: stalled
    where no rank moved (its stacks, its loop's count) and none computed, else running; the culprit where, of
    several ranks, one alone is not waiting for the others (one process alone is no one's culprit: its rank may
    be a launcher's, mp.spawn's parent)."""
    from ..doctor import conform
    from ..lab.stall.verdict import WAITING

    lead = [r for r in d["ranks"] if r["phase"] not in WAITING]
    c = lead[0] if len(lead) == 1 and len(d["ranks"]) > 1 and not d["moved"] else {}
    running = _running(d)
    said = {
        "verdict": "running" if running else "stalled",
        "summary": d["verdict"],
        "ok": running,
        "culprit": {"rank": c.get("rank"), "step": c.get("step"), "epoch": None, "batch": None},
        "world_size": d["world_size"],
        "ranks": d["ranks"],
        "stall": {"verdict": d["verdict"], "root": d["root"], "moved": d["moved"]},
    }
    return conform(said, "pid", [str(pid)])


def _doctor_pid(a: argparse.Namespace) -> int:
    """A live job looked at from outside: exit 1 when no rank moved and none computed (stuck), 0 when it runs."""
    from ..watch.look import look

    try:
        d = look(a.pid)
    except ValueError as e:
        raise UsageError(str(e)) from None
    running = _running(d)
    if a.json:
        print(json.dumps(pid_diagnosis(d, a.pid), indent=1))
        return 0 if running else 1
    print(("RUNNING: " if d["moved"] else "BUSY: " if d["busy"] else "STUCK: ") + d["verdict"])
    for r in d["ranks"]:
        print(f"\n--- rank {r['rank']} (pid {r['pid']}): {r['phase']} ---")
        for name, lines in sorted(r["stacks"].items(), key=lambda kv: kv[0] != "MainThread"):
            print(f"[{name}]")
            print("\n".join(lines[-12:]))
        for w, lines in sorted(r["workers"].items()):
            print(f"[worker pid {w}]")
            print("\n".join(lines[-8:]))
    return 0 if running else 1


def cmd_notebooks(a: argparse.Namespace) -> int:
    from ..nb import root
    from ..runner import run_notebooks

    # the project's notebooks: the checkout's up from here, else the one this package was installed from (pip
    # install -e), so that asrlab notebooks runs from a folder of one's own too
    here = root() / "notebooks"
    installed = Path(__file__).resolve().parents[2] / "notebooks"
    records = run_notebooks(
        here if here.is_dir() or not installed.is_dir() else installed,
        Path(a.out) if a.out else None,
        a.only,
        a.params,
        report=lambda m: print(m, flush=True),
        html=a.html,
    )
    failed = [r for r in records if not r["ok"]]
    where = Path(records[0]["output"]).parent.parent
    print(
        f"{len(records) - len(failed)} of {len(records)} notebooks ran; "
        f"total {sum(r['seconds'] for r in records):.0f} s; executed copies under {where}/"
        + (f", figures in {Path(a.out) / 'figures'}/" if a.out else "")
    )
    for r in records:
        if r.get("html"):
            print(f"  {r['html']}")
    for r in failed:
        print(f"FAILED {r['notebook']}: {r['error']} (see {r['output']})", file=sys.stderr)
    return 1 if failed else 0


def add_commands(sub) -> None:
    """The parsers of decode, ckpt, doctor, notebooks."""
    d = command(
        sub,
        "decode",
        "Transcribe a data list with a run's newest checkpoint and print its character and "
        "word error rates (CER, WER); the transcripts go to EXP/decode/.",
    )
    d.add_argument("--exp", required=True, help="the run's experiment folder (what asrlab train got as --exp)")
    d.add_argument("--data", required=True, help="data.list (shard or raw), Kaldi dir or NeMo manifest to transcribe")
    d.add_argument("--name", help="name of the output (default: from the data path)")
    d.add_argument(
        "--lexicon",
        metavar="DATA_LIST",
        help="search only sentences of the words of this list's transcripts (usually train's)",
    )
    d.add_argument("--beam", type=int, default=32, help="prefixes kept per frame (with --lexicon)")
    d.add_argument(
        "--lm-weight",
        type=float,
        default=1.0,
        help="weight of the word trigram of the --lexicon transcripts (0: lexicon only)",
    )
    d.add_argument(
        "--word-bonus",
        type=float,
        default=3.0,
        help="nats added per word (with --lexicon): offsets the LM's cost of each word, which "
        "otherwise favours dropping a faint one",
    )
    d.add_argument(
        "--speeds",
        type=_speeds,
        default=(1.0,),
        metavar="S1,S2,...",
        help="with --lexicon: search the audio played at each of these speeds (a test-time warp "
        "of the voice, e.g. 0.9,1.0,1.1) and keep the transcript best over all of them",
    )
    d.add_argument(
        "--device",
        help="where the model runs, e.g. cpu or cuda:1 (default: the first GPU if there is one, else the CPU)",
    )
    d.set_defaults(func=cmd_decode)

    c = command(sub, "ckpt", "List a run's checkpoints (step, epoch, complete or not, where in the data each resumes).")
    c.add_argument("exp", help="the run's experiment folder")
    c.add_argument("--digest", action="store_true", help="one SHA-256 over the model and optimizer tensors")
    c.set_defaults(func=cmd_ckpt)

    dr = command(
        sub,
        "doctor",
        "Say what happened to a run (finished, running, stopped, stalled, crashed, killed, "
        "out of memory, non-finite) and why, from its folder or from the logs it left "
        "(WeNet, ESPnet, icefall, NeMo/Lightning, SpeechBrain, torchrun, a loop's own); "
        "exit 1 when it failed.",
    )
    dr.add_argument(
        "exp",
        nargs="*",
        metavar="EXP|LOG",
        help="the run's folder (several: one per node, read as one run), or its log files, folders of "
        "logs or - for standard input (plain or compressed; the format is recognised from the lines)",
    )
    dr.add_argument(
        "--pid",
        type=int,
        help="instead of EXP: a job running now (its torchrun agent, any rank or "
        "worker), its stacks sampled from outside with py-spy; exit 1 if stuck",
    )
    dr.add_argument("--json", action="store_true", help="the diagnosis as JSON")
    dr.set_defaults(func=cmd_doctor)

    n = command(
        sub,
        "notebooks",
        "Run every notebook of the lab headless (each reproduces a training failure, "
        "measures it and shows the fix) and save the executed copies and figures.",
    )
    n.add_argument("--only", help="run only the notebooks whose name contains this")
    n.add_argument("--params", help="YAML parameter file, e.g. notebooks/params/gpu.yaml")
    n.add_argument(
        "--out",
        help="put everything the run writes under this folder (executed copies, results.json, "
        "experiments, figures); default: the project's runs/ (ASRLAB_FIGURES=figures refreshes the "
        "tracked figures the README shows)",
    )
    n.add_argument("--html", action="store_true", help="also write each executed notebook as a standalone HTML page")
    n.set_defaults(func=cmd_notebooks)
