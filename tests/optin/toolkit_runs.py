#!/usr/bin/env python3
"""Real runs of real toolkits (Hugging Face Accelerate, SpeechBrain, ESPnet), broken on purpose, kept as the
fixtures under ``tests/fixtures/toolkit_runs/<toolkit>/<case>/`` with the truth of what was done to them.

The toolkits live in a virtual environment of their own, outside the repository (see
``tests/fixtures/toolkit_runs/README.md`` for how it is made); each job runs with that environment's Python:

    .venv/bin/python tests/optin/toolkit_runs.py --venv /work/optin/venv                # every case
    .venv/bin/python tests/optin/toolkit_runs.py --venv /work/optin/venv accelerate/nan_rank1  # some
    .venv/bin/python tests/optin/toolkit_runs.py --venv /work/optin/venv --list

A case folder holds ``console.log`` (the launcher's stdout and stderr, as a terminal or a batch system would
have kept them; ``console_2.log`` for the second run of a resume), ``exp/`` (the small text files the
toolkit wrote into its experiment folder), ``files.txt`` (every file the run left there, with its size:
checkpoints are named, not kept) and ``truth.yaml`` (what was done, and what happened, as caused).

Every run is bounded in time: past its ``timeout_s`` the launcher gets SIGTERM, 15 s later its process group
SIGKILL (the launcher is started in a session of its own, so the group is the job's and nothing else).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "toolkit_runs"
MAX_KEPT = 100_000  # bytes: a file larger than this is listed in files.txt, not kept
TEXT_SUFFIXES = {".txt", ".log", ".yaml", ".yml", ".json", ".scp", ".csv", ".cfg", ".conf", ".sh", ".list", ""}


# --------------------------------------------------------------------------- the machinery


@dataclass
class Action:
    """Something done to a running job: when ``pattern`` first appears in its console (or at once), wait
    ``delay_s``, then send ``sig`` to the launcher."""

    pattern: str | None
    sig: int
    delay_s: float = 0.0


@dataclass
class Phase:
    """One launch: ``argv`` (``{py}``: the toolkit environment's python, ``{data}``: the corpus,
    ``{exp}``: the case's experiment folder, ``{here}``: tests/optin) and its environment."""

    argv: list[str]
    env: dict = field(default_factory=dict)
    action: Action | None = None
    timeout_s: float = 150
    log: str = "console.log"


@dataclass
class Case:
    toolkit: str
    name: str
    phases: list[Phase]
    truth: dict  # what_you_did, verdict, culprit, notes
    expect: list[str] = field(default_factory=list)  # regexes the (last phase's) console must hold
    prepare: object = None  # callable(data_dir, exp, work) -> dict of extra {names} for argv, run before

    @property
    def key(self) -> str:
        return f"{self.toolkit}/{self.name}"


def _fmt(s: str, ctx: dict) -> str:
    return s.format(**ctx) if "{" in s else s


def run_phase(phase: Phase, ctx: dict, log_path: Path) -> dict:
    """Run one launch to its end (or its timeout); returns its exit code, time and what was done to it."""
    argv = [_fmt(a, ctx) for a in phase.argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for k in ("PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(k, None)
    env.update({k: _fmt(str(v), ctx) for k, v in phase.env.items()})
    done: dict = {"argv": argv, "env": {k: _fmt(str(v), ctx) for k, v in phase.env.items()}}
    t0 = time.time()
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ctx["exp"], start_new_session=True
        )
        fired_at = None
        seen_at = None
        pattern = re.compile(phase.action.pattern) if phase.action and phase.action.pattern else None
        seen: dict[int, str] = {}
        polls = 0
        while proc.poll() is None:
            now = time.time()
            if polls % 10 == 0:
                seen.update(_descendants(proc.pid))
            polls += 1
            if phase.action and fired_at is None:
                if seen_at is None and (pattern is None or pattern.search(log_path.read_text(errors="replace"))):
                    seen_at = now
                if seen_at is not None and now - seen_at >= phase.action.delay_s:
                    last = _last_line(log_path)
                    proc.send_signal(phase.action.sig)
                    fired_at = now
                    done["signal"] = {
                        "sig": signal.Signals(phase.action.sig).name,
                        "to": "launcher",
                        "after_s": round(now - t0, 1),
                        "last_line_before": last,
                    }
            if now - t0 > phase.timeout_s:
                done["timed_out"] = True
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)  # the job's own group: it was started in its own session
                break
            time.sleep(0.1)
        proc.wait()
    # whatever of the job outlived its launcher (an orphaned rank or worker) is ended too, by its pid
    left = [pid for pid, start in seen.items() if _start_time(pid) == start]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if left:
        done["orphans_killed"] = len(left)
    done["exit_code"] = proc.returncode
    done["wall_s"] = round(time.time() - t0, 1)
    return done


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _children() -> dict[int, list[int]]:
    """ppid -> pids, from /proc."""
    tree: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(d.name))
    return tree


def _start_time(pid: int) -> str | None:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _descendants(pid: int) -> dict[int, str]:
    """Every process under pid (torchrun starts each rank in a session of its own: not in the launcher's
    group), with its start time, so that a pid used again later is not taken for it."""
    tree, out, todo = _children(), {}, [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            start = _start_time(child)
            if start is not None:
                out[child] = start
                todo.append(child)
    return out


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def make_corpus(root: Path) -> Path:
    """asrlab's embedded corpus, small, with WAV files and raw.list (WeNet's raw mode); made once per root."""
    if not (root / "train" / "raw.list").exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "asrlab.cli",
                "synth",
                str(root),
                "--utts",
                "96",
                "--held",
                "16",
                "--raw",
                "--quiet",
            ],
            check=True,
            cwd=ROOT,
            timeout=300,
        )
    return root


def collect(exp: Path, dest: Path) -> None:
    """The experiment folder's small text files into dest/exp/, and every file's name and size into files.txt."""
    listing = []
    for p in sorted(exp.rglob("*")):
        if p.is_dir() or p.is_symlink() and not p.exists():
            continue
        rel = p.relative_to(exp)
        if rel.parts[0] == "_work":
            continue
        size = p.stat().st_size
        listing.append(f"{size:>10}  {rel}")
        # text files; TensorBoard's event files and asrlab watch's folder (.jsonl, .times) whatever their suffix
        kept = p.suffix in TEXT_SUFFIXES and _is_text(p) or "tfevents" in p.name or rel.parts[0] == "watch"
        if size <= MAX_KEPT and kept and "git-info" not in p.name:  # NeMo's git-info: the diff of whatever repo ran it
            target = dest / "exp" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, target)
    (dest / "files.txt").write_text("# size (bytes)  path under the experiment folder\n" + "\n".join(listing) + "\n")


def _is_text(p: Path) -> bool:
    try:
        p.read_bytes()[:4096].decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def make(case: Case, venv: Path, corpus: Path, out: Path) -> dict:
    """Run a case into out/<toolkit>/<case>/ (replaced); return its truth."""
    dest = out / case.toolkit / case.name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    exp = dest / "_run"
    exp.mkdir()
    work = exp / "_work"  # data the case made for itself (a broken list, a FIFO): not kept
    work.mkdir()
    ctx = {
        "py": str(venv / "bin" / "python"),
        "venv": str(venv),
        "data": str(corpus),
        "exp": str(exp),
        "here": str(HERE),
        "work": str(work),
        "port": str(_free_port()),
    }
    os.environ["_TOOLKIT_PY"] = ctx["py"]  # for a prepare step that runs the toolkit's tools
    if case.prepare:
        ctx.update(case.prepare(corpus, exp, work) or {})
    runs = []
    for phase in case.phases:
        runs.append(run_phase(phase, ctx, dest / phase.log))
    collect(exp, dest)
    shutil.rmtree(exp)
    truth = {
        "toolkit": case.toolkit,
        "case": case.name,
        "command": [" ".join(_short(a, ctx) for a in r["argv"]) for r in runs],
        "env": [r["env"] for r in runs],
        **case.truth,
        "runs": [{k: v for k, v in r.items() if k not in ("argv", "env")} for r in runs],
        "expect_in_console": case.expect,
        "versions": versions(venv, case.toolkit),
    }
    (dest / "truth.yaml").write_text(yaml.safe_dump(truth, sort_keys=False, allow_unicode=True, width=110))
    return truth


def _short(a: str, ctx: dict) -> str:
    for k in ("py", "here", "exp", "data", "venv"):
        a = a.replace(ctx[k], "{" + k + "}")
    return a


_VERSIONS: dict = {}


def versions(venv: Path, toolkit: str) -> dict:
    if toolkit not in _VERSIONS:
        mods = {
            "accelerate": ["accelerate", "transformers"],
            "speechbrain": ["speechbrain"],
            "espnet": ["espnet"],
            "hf_trainer": ["transformers", "accelerate", "tensorboard"],
            "nemo": ["nemo_toolkit", "lightning"],
            "keras": ["keras"],
            "ignite": ["pytorch-ignite"],
            "fastai": ["fastai", "fastprogress"],
        }
        code = (
            "import importlib.metadata as m, json, sys, torch; "
            f"print(json.dumps({{'python': sys.version.split()[0], 'torch': torch.__version__, "
            f"**{{n: m.version(n) for n in {mods.get(toolkit, [])!r}}}}}))"
        )
        p = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=120)
        _VERSIONS[toolkit] = json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr[-300:]}
    return _VERSIONS[toolkit]


# --------------------------------------------------------------------------- the data's faults


def raw_list_with(corpus: Path, work: Path, index: int, wav: str) -> Path:
    """train/raw.list with item ``index``'s WAV replaced by ``wav``."""
    lines = (corpus / "train" / "raw.list").read_text().splitlines()
    item = json.loads(lines[index])
    item["wav"] = wav
    lines[index] = json.dumps(item)
    out = work / "raw.list"
    out.write_text("\n".join(lines) + "\n")
    return out


def _fifo(work: Path) -> str:
    path = work / "never_written.wav"
    if not path.exists():
        os.mkfifo(path)
    return str(path)


def bad_wav_missing(corpus, exp, work):
    """A case's ``prepare``: the job is told to read a WAV that is not there (``{bad_wav}``)."""
    return {"bad_wav": str(work / "missing.wav")}


def bad_wav_fifo(corpus, exp, work):
    """A case's ``prepare``: the job is told to read a FIFO nobody writes (``{bad_wav}``): its read hangs."""
    return {"bad_wav": _fifo(work)}


# --------------------------------------------------------------------------- Accelerate

# 96 utterances, batch 4, 2 ranks: 12 micro-batches per rank and epoch; gradient_accumulation_steps=2: 6
# optimizer steps per epoch, 24 in 4 epochs. Accelerate deals batches round-robin (shuffle off): rank r's
# micro-batch m (0-based in the epoch) is the list's batch 2m + r, items 4(2m + r) .. +3. Rank 1's
# micro-batch 6 (the first of step 4) begins with item 4 * 13 = 52.
ACC_DATA_ITEM = 52
ACC_DATA_STEP = 4
# --standalone: a free port of its own (runs beside each other, or beside a test, do not collide on 29500)
TORCHRUN = ["{py}", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
ACC_LOOP = ["{here}/accel_loop.py", "--out", "{exp}", "--cpu"]


def _acc(*extra, data="{data}/train/raw.list", launcher=None):
    return [*(launcher or TORCHRUN), *ACC_LOOP, "--data", data, *extra]


# `accelerate launch --multi_gpu --cpu` is refused ("You can only use one of `--cpu`, `--multi_gpu`, ..."), and
# `--cpu --num_processes 2` starts one process: on a machine without GPUs the two ranks come from --multi_gpu
# (torchrun's elastic agent inside accelerate's launcher) and the script's Accelerator(cpu=True).
ACC_LAUNCH = ["{venv}/bin/accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--main_process_port", "{port}"]


def _missing(corpus, exp, work):
    return {"bad_list": str(raw_list_with(corpus, work, ACC_DATA_ITEM, str(work / "missing.wav")))}


def _hang(corpus, exp, work):
    return {"bad_list": str(raw_list_with(corpus, work, ACC_DATA_ITEM, _fifo(work)))}


ACCELERATE = [
    Case(
        "accelerate",
        "healthy_torchrun",
        [Phase(_acc())],
        {
            "what_you_did": "nothing: 2 gloo ranks on the CPU under torchrun, 4 epochs, 24 optimizer steps",
            "verdict": "no_failure_seen",
            "culprit": None,
            "notes": "save_state every 5 steps (step_5 .. step_20) and at the end (final/)",
        },
        expect=[r"rank 1 epoch 3 step 24 loss", r"training finished"],
    ),
    Case(
        "accelerate",
        "healthy_accelerate_launch",
        [Phase(_acc(launcher=ACC_LAUNCH))],
        {
            "what_you_did": "nothing: `accelerate launch --multi_gpu --num_processes 2` (no config file), the "
            "script's Accelerator(cpu=True): 2 gloo ranks",
            "verdict": "no_failure_seen",
            "culprit": None,
            "notes": "accelerate launch prints its own warnings about the missing config first",
        },
        expect=[r"rank 1 epoch 3 step 24 loss", r"training finished"],
    ),
    Case(
        "accelerate",
        "launch_refuses_multi_gpu_with_cpu",
        [
            Phase(
                [
                    "{venv}/bin/accelerate",
                    "launch",
                    "--multi_gpu",
                    "--cpu",
                    "--num_processes",
                    "2",
                    *ACC_LOOP,
                    "--data",
                    "{data}/train/raw.list",
                ]
            )
        ],
        {
            "what_you_did": "`accelerate launch --multi_gpu --cpu --num_processes 2`: the flags the CPU user reaches "
            "for first",
            "verdict": "crashed",
            "culprit": None,
            "notes": "accelerate's launcher refuses the flags before any rank starts (ValueError, exit 1); no "
            "step, no rank",
        },
        expect=[r"ValueError: You can only use one of `--cpu`, `--multi_gpu`"],
    ),
    Case(
        "accelerate",
        "not_distributed_without_cpu_flag",
        [Phase([*TORCHRUN, "{here}/accel_loop.py", "--out", "{exp}", "--data", "{data}/train/raw.list"])],
        {
            "what_you_did": "torchrun with 2 processes, but Accelerator() without cpu=True on a machine with a "
            "CUDA build of torch and no GPU",
            "verdict": "no_failure_seen",
            "culprit": None,
            "notes": "Accelerate falls back to DistributedType.NO: each process trains the whole data alone "
            "(48 steps, both logging as [RANK 0]) and both save into the same step_N folders; exit 0. "
            "Not a failure any log line names.",
        },
        expect=[r"Distributed environment: DistributedType.NO", r"step 48 loss"],
    ),
    Case(
        "accelerate",
        "nan_rank1_step9",
        [Phase(_acc(), env={"FAULT": "nan", "FAULT_RANK": "1", "FAULT_STEP": "9"})],
        {
            "what_you_did": "rank 1 multiplies its loss by float('nan') in both micro-batches of optimizer step 9",
            "verdict": "nonfinite",
            "culprit": {"rank": 1, "step": 9},
            "notes": "nothing in the loop checks the loss: the NaN gradient is all-reduced into both ranks' "
            "weights, every later loss on every rank is nan, and the run finishes with exit 0. Rank 0's own "
            "loss at step 9 is finite; both are nan from step 10.",
        },
        expect=[r"rank 1 epoch 1 step 9 loss nan", r"rank 0 epoch 1 step 10 loss nan", r"training finished"],
    ),
    Case(
        "accelerate",
        "sigkill_rank1_step9",
        [Phase(_acc(), env={"FAULT": "kill", "FAULT_RANK": "1", "FAULT_STEP": "9"})],
        {
            "what_you_did": "rank 1 sends itself SIGKILL right after logging optimizer step 9",
            "verdict": "killed",
            "culprit": {"rank": 1, "step": 9},
            "notes": "step 9 is rank 1's last logged step; rank 0 waits in step 10's all-reduce until torchrun ends it",
        },
        expect=[r"Signal 9 \(SIGKILL\)", r"rank 1 epoch 1 step 9 loss"],
    ),
    Case(
        "accelerate",
        "sigkill_rank1_step9_accelerate_launch",
        [Phase(_acc(launcher=ACC_LAUNCH), env={"FAULT": "kill", "FAULT_RANK": "1", "FAULT_STEP": "9"})],
        {
            "what_you_did": "as sigkill_rank1_step9, under `accelerate launch --multi_gpu --num_processes 2`",
            "verdict": "killed",
            "culprit": {"rank": 1, "step": 9},
            "notes": "accelerate launch runs torchrun's elastic agent in its own process: the same failure "
            "summary, then accelerate's own traceback of the launcher",
        },
        expect=[r"Signal 9 \(SIGKILL\)", r"rank 1 epoch 1 step 9 loss"],
    ),
    Case(
        "accelerate",
        "missing_wav_rank1_step4",
        [Phase(_acc(data="{bad_list}"))],
        {
            "what_you_did": f"raw.list item {ACC_DATA_ITEM} points at a WAV that does not exist; it is in rank 1's "
            f"micro-batch 6 of epoch 0, the first of optimizer step {ACC_DATA_STEP}",
            "verdict": "crashed",
            "culprit": {"rank": 1, "step": ACC_DATA_STEP},
            "notes": "soundfile raises in the DataLoader worker; Accelerate's DataLoaderShard fetches one "
            "batch ahead, so rank 1 raises when it asks for micro-batch 5: its last logged step is 2, and "
            "micro-batch 4 (first half of step 3) was trained. The worker's error reaches the rank as "
            "'soundfile.LibsndfileError: <exception str() failed>': neither the file's name nor the worker's "
            "original traceback is printed. Rank 0 then fails in step 3's all-reduce ('Connection closed by peer').",
        },
        expect=[r"\[rank1\]: soundfile.LibsndfileError", r"rank 1 epoch 0 step 2 loss"],
        prepare=_missing,
    ),
    Case(
        "accelerate",
        "hang_rank1_step4_pg_timeout",
        [Phase(_acc(data="{bad_list}"), env={"TIMEOUT_S": "20"}, timeout_s=150)],
        {
            "what_you_did": f"raw.list item {ACC_DATA_ITEM} is a FIFO nobody writes: rank 1's DataLoader worker "
            f"blocks opening it (data of optimizer step {ACC_DATA_STEP}); the process group's timeout is 20 s "
            "(InitProcessGroupKwargs)",
            "verdict": "stalled",
            "culprit": {"rank": 1, "step": ACC_DATA_STEP},
            "notes": "rank 1 blocks while fetching micro-batch 6 (asked for 5: Accelerate reads one ahead), "
            "after logging step 2; rank 0 waits in step 3's gradient all-reduce until gloo's 20 s timeout "
            "raises on it; torchrun then ends rank 1. The error is rank 0's, the cause rank 1's.",
        },
        expect=[r"rank 1 epoch 0 step 2 loss", r"[Tt]imed out|[Tt]imeout"],
        prepare=_hang,
    ),
    Case(
        "accelerate",
        "hang_rank1_step4_sigterm",
        [Phase(_acc(data="{bad_list}"), action=Action(r"rank 1 epoch 0 step 2 loss", signal.SIGTERM, 60))],
        {
            "what_you_did": f"raw.list item {ACC_DATA_ITEM} is a FIFO nobody writes (rank 1, data of optimizer "
            f"step {ACC_DATA_STEP}); torch's default 30-minute timeout; SIGTERM to torchrun 60 s after rank 1 "
            "logged step 2",
            "verdict": "stalled",
            "culprit": {"rank": 1, "step": ACC_DATA_STEP},
            "notes": "rank 0 waits in step 3's all-reduce; nothing is printed for 60 s; then torchrun forwards "
            "SIGTERM to both ranks and raises SignalException",
        },
        expect=[r"rank 1 epoch 0 step 2 loss", r"SIGTERM|SignalException|Signal 15"],
        prepare=_hang,
    ),
    Case(
        "accelerate",
        "sigterm_launcher_step14",
        [Phase(_acc(), action=Action(r"rank 0 epoch 2 step 14 loss", signal.SIGTERM, 0))],
        {
            "what_you_did": "SIGTERM to torchrun as soon as rank 0 logged optimizer step 14",
            "verdict": "killed",
            "culprit": {"rank": None, "step": 14},
            "notes": "the signal went to the launcher, not a rank: torchrun forwards it to every rank and exits "
            "with a SignalException. The ranks may log a step or two more before it lands (see runs[0].signal)",
        },
        expect=[r"SignalException|Signal 15|SIGTERM"],
    ),
    Case(
        "accelerate",
        "resume_after_sigkill",
        [
            Phase(_acc(), env={"FAULT": "kill", "FAULT_RANK": "1", "FAULT_STEP": "12"}),
            Phase(_acc("--resume"), log="console_2.log"),
        ],
        {
            "what_you_did": "run 1: rank 1 SIGKILLs itself after optimizer step 12 (console.log); run 2: the same "
            "command with --resume (console_2.log): load_state of step_10, skip_first_batches of epoch 1's first "
            "8 micro-batches, steps 11..24",
            "verdict": "no_failure_seen",
            "culprit": None,
            "notes": "run 1 alone: killed, rank 1, step 12. Run 2 resumes from step_10 (the newest save): steps 11 "
            "and 12 are trained twice over the two runs, nothing is skipped, and it finishes",
        },
        expect=[r"Resumed from checkpoint: .*step_10", r"rank 1 epoch 1 step 11 loss", r"training finished"],
    ),
]

# --------------------------------------------------------------------------- SpeechBrain

# sb_recipe.py on the corpus's real audio (DynamicItemDataset, read_audio, Fbank). SpeechBrain counts epochs
# from 1 and batches (``Brain.step``) from 1 in each epoch; 96 utterances, batch 4: 24 batches an epoch in one
# process, 12 per rank under DDP, 3 epochs. The faults of sb_recipe.py start at ``--fault_epoch``/
# ``--fault_batch``. Under DDP SpeechBrain shuffles with torch's DistributedSampler (seed 0, set_epoch(epoch)):
# rank 1's batch 3 of epoch 1 is computed, not guessed (``_sb_ddp_item``).
SB_RECIPE = [
    "{here}/sb_recipe.py",
    "{here}/sb_hparams.yaml",
    "--output_folder",
    "{exp}",
    "--device",
    "cpu",
    "--n_tokens",
    "28",
    "--valid_list",
    "{data}/dev/raw.list",
]


def _sb(*extra, data="{data}/train/raw.list", ddp=True):
    launch = [*TORCHRUN] if ddp else ["{py}"]
    return [*launch, *SB_RECIPE, "--data_list", data, *(["--distributed_backend", "gloo"] if ddp else []), *extra]


def _sb_ddp_item(rank=1, epoch=1, batch=3, n=96, batch_size=4) -> int:
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(n), num_replicas=2, rank=rank, shuffle=True)
    sampler.set_epoch(epoch)
    return list(sampler)[(batch - 1) * batch_size]


def _sb_missing(corpus, exp, work):
    return {"bad_list": str(raw_list_with(corpus, work, _sb_ddp_item(), str(work / "missing.wav")))}


def _sb_fifo(corpus, exp, work):
    return {"fifo": _fifo(work)}


SPEECHBRAIN = [
    Case(
        "speechbrain",
        "healthy_single",
        [Phase(_sb(ddp=False))],
        {
            "what_you_did": "nothing: one process, 3 epochs of 24 batches",
            "verdict": "no_failure_seen",
            "culprit": None,
            "notes": "train_log.txt has one line per epoch; the console has tqdm bars (carriage returns) and the "
            "logger's lines",
        },
        expect=[r"epoch: 3, lr: .* - train loss: .* - valid loss"],
    ),
    Case(
        "speechbrain",
        "healthy_torchrun",
        [Phase(_sb())],
        {
            "what_you_did": "nothing: 2 gloo ranks under torchrun, 3 epochs of 12 batches a rank",
            "verdict": "no_failure_seen",
            "culprit": None,
            "notes": "only rank 0 logs and writes train_log.txt",
        },
        expect=[r"epoch: 3, lr: .* - train loss: .* - valid loss"],
    ),
    Case(
        "speechbrain",
        "nan_rank1_e2b1",
        [Phase(_sb(), env={"FAULT": "nan", "FAULT_RANK": "1"})],
        {
            "what_you_did": "rank 1 multiplies its loss by NaN from epoch 2, batch 1 on (sb_recipe.py FAULT=nan)",
            "verdict": "nonfinite",
            "culprit": {"rank": 1, "epoch": 2, "step": 1},
            "notes": "SpeechBrain's check_loss_isfinite skips the batch and warns 'Patience not yet exhausted' "
            "(only on rank 1), then raises 'Loss is not finite and patience is exhausted' at batch 4 of epoch 2 "
            "(--nonfinite_patience 3); rank 0 is then ended by torchrun",
        },
        expect=[r"Patience not yet exhausted", r"Loss is not finite and patience is exhausted"],
    ),
    Case(
        "speechbrain",
        "sigkill_rank1_e2b5",
        [Phase(_sb("--fault_batch", "5"), env={"FAULT": "kill", "FAULT_RANK": "1"})],
        {
            "what_you_did": "rank 1 SIGKILLs itself in compute_objectives of epoch 2, batch 5",
            "verdict": "killed",
            "culprit": {"rank": 1, "epoch": 2, "step": 5},
            "notes": "SpeechBrain prints no step lines: where it was is in the tqdm bar of rank 0 only",
        },
        expect=[r"Signal 9 \(SIGKILL\)"],
    ),
    Case(
        "speechbrain",
        "missing_wav_rank1_e1b3",
        [Phase(_sb(data="{bad_list}"))],
        {
            "what_you_did": "one raw.list line points at a missing WAV; DistributedSampler (seed 0, epoch 1) puts it "
            "first in rank 1's batch 3 of epoch 1",
            "verdict": "crashed",
            "culprit": {"rank": 1, "epoch": 1, "step": 3},
            "notes": "read_audio raises in the data pipeline (num_workers 0: no read-ahead); rank 0 waits in the "
            "all-reduce until torchrun ends it",
        },
        expect=[r"missing\.wav", r"Failed to load audio|Error opening"],
        prepare=_sb_missing,
    ),
    Case(
        "speechbrain",
        "hang_rank1_e2b3_sigterm",
        [
            Phase(
                _sb("--fault_batch", "3"),
                env={"FAULT": "hang", "FAULT_RANK": "1", "FAULT_FIFO": "{fifo}"},
                action=Action(r"Going into epoch 2", signal.SIGTERM, 60),
                timeout_s=180,
            )
        ],
        {
            "what_you_did": "rank 1 blocks opening a FIFO nobody writes in compute_objectives of epoch 2, batch 3; "
            "SIGTERM to torchrun 60 s after 'Going into epoch 2'",
            "verdict": "stalled",
            "culprit": {"rank": 1, "epoch": 2, "step": 3},
            "notes": "SpeechBrain's process group timeout is 2 hours (ddp_init_group): nothing ends the hang but the "
            "signal; rank 0 waits in batch 3's all-reduce, its tqdm bar stopped at 2/12",
        },
        expect=[r"Going into epoch 2", r"SignalException|Signal 15|SIGTERM"],
        prepare=_sb_fifo,
    ),
    Case(
        "speechbrain",
        "sigterm_launcher_e2",
        [Phase(_sb(), action=Action(r"Going into epoch 2", signal.SIGTERM, 0.3))],
        {
            "what_you_did": "SIGTERM to torchrun 0.3 s after 'Going into epoch 2'",
            "verdict": "killed",
            "culprit": {"rank": None, "epoch": 2, "step": None},
            "notes": "the signal went to the launcher; the batch it landed in shows only in rank 0's tqdm bar",
        },
        expect=[r"SignalException|Signal 15|SIGTERM"],
    ),
    Case(
        "speechbrain",
        "resume_after_sigkill",
        [
            Phase(_sb("--fault_batch", "7", "--ckpt_interval_steps", "4"), env={"FAULT": "kill", "FAULT_RANK": "1"}),
            Phase(_sb("--ckpt_interval_steps", "4"), log="console_2.log"),
        ],
        {
            "what_you_did": "run 1: intra-epoch checkpoints every 4 batches, rank 1 SIGKILLs itself at epoch 2, "
            "batch 7 (console.log); run 2: the same command without the fault (console_2.log)",
            "verdict": "no_failure_seen",
            "culprit": None,
            "notes": "run 1 alone: killed, rank 1, epoch 2 batch 7. Run 2 loads the newest checkpoint and goes on "
            "from epoch 2 (SpeechBrain logs its intra-epoch saves at DEBUG level only, so which one it was, the "
            "intra-epoch one of epoch 2 batch 4 or the end of epoch 1, shows in the checkpoint's name, not in the logs)",
        },
        expect=[r"Loading a checkpoint from", r"epoch: 3, lr: "],
    ),
]

# --------------------------------------------------------------------------- ESPnet

# espnet2's own trainer, `python -m espnet2.bin.asr_train` with espnet_tiny.yaml (1-layer LSTM, CTC only), on
# the corpus laid out by espnet_tools.py prep (wav.scp, text, char token list, shape files). ESPnet counts
# epochs from 1 and batches from 1 within each epoch; under DDP each mini-batch of 4 is split over the 2 ranks
# (24 batches an epoch on every rank), and only rank 0 logs (rank 1's logger is set to ERROR). 3 epochs.
# Code faults come from espnet_faults/sitecustomize.py (PYTHONPATH), data faults from a wav.scp line.
ESP_TRAIN = [
    "-m", "espnet2.bin.asr_train", "--config", "{here}/espnet_tiny.yaml", "--output_dir", "{exp}/asr",
    "--ngpu", "0", "--token_type", "char", "--token_list", "{esp}/token_list.txt",
    "--train_data_path_and_name_and_type", "{esp}/dump/raw/train/wav.scp,speech,sound",
    "--train_data_path_and_name_and_type", "{esp}/dump/raw/train/text,text,text",
    "--valid_data_path_and_name_and_type", "{esp}/dump/raw/dev/wav.scp,speech,sound",
    "--valid_data_path_and_name_and_type", "{esp}/dump/raw/dev/text,text,text",
    "--train_shape_file", "{esp}/stats/train/speech_shape", "--train_shape_file", "{esp}/stats/train/text_shape.char",
    "--valid_shape_file", "{esp}/stats/dev/speech_shape", "--valid_shape_file", "{esp}/stats/dev/text_shape.char",
]  # fmt: skip
ESP_DDP = ["--multiprocessing_distributed", "false", "--dist_backend", "gloo"]


def _esp(*extra, ddp=True):
    if ddp:
        return [*TORCHRUN, *ESP_TRAIN, *ESP_DDP, *extra]
    return ["{py}", *ESP_TRAIN, *extra]


def _esp_fault(kind, epoch, batch, rank, **more):
    return {
        "PYTHONPATH": "{here}/espnet_faults",
        "ESPNET_FAULT": kind,
        "ESPNET_FAULT_EPOCH": str(epoch),
        "ESPNET_FAULT_BATCH": str(batch),
        "ESPNET_FAULT_RANK": str(rank),
        **more,
    }


def _esp_tools(venv_py, *args):
    return subprocess.run(
        [venv_py, str(HERE / "espnet_tools.py"), *map(str, args)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout.strip()


def _esp_data(corpus, exp, work, swap=None):
    esp = work / "espnet"
    py = str(Path(os.environ["_TOOLKIT_PY"]))
    _esp_tools(py, "prep", corpus, esp)
    extra = {"esp": str(esp)}
    if swap:
        key = _esp_tools(py, "locate", esp, "--epoch", 1, "--batch", 3, "--rank", 1, "--world", 2)
        target = str(work / "missing.wav") if swap == "missing" else _fifo(work)
        _esp_tools(py, "swap", esp, key, target)
        extra.update(bad_key=key, bad_path=target)
    return extra


def _esp_plain(corpus, exp, work):
    return _esp_data(corpus, exp, work)


def _esp_missing(corpus, exp, work):
    return _esp_data(corpus, exp, work, swap="missing")


def _esp_fifo(corpus, exp, work):
    extra = _esp_data(corpus, exp, work, swap="fifo")
    return extra


def _esp_fifo_fault(corpus, exp, work):
    extra = _esp_data(corpus, exp, work)
    extra["fifo"] = _fifo(work)
    return extra


ESPNET = [
    Case(
        "espnet",
        "healthy_single",
        [Phase(_esp(ddp=False))],
        {
            "what_you_did": "nothing: one process, 3 epochs of 24 batches",
            "verdict": "no_failure_seen",
            "culprit": None,
            "notes": "ESPnet's reporter drops a ', ' between two fields of some lines (reporter.py compares the field "
            "index with the number of batches: 'optim0_lr0=0.002train_time=0.119')",
        },
        expect=[r"3epoch:train:23-24batch", r"The training was finished at 3 epochs"],
        prepare=_esp_plain,
    ),
    Case(
        "espnet",
        "healthy_torchrun",
        [Phase(_esp())],
        {
            "what_you_did": "nothing: 2 gloo ranks under torchrun (--multiprocessing_distributed false), 3 epochs",
            "verdict": "no_failure_seen",
            "culprit": None,
            "notes": "only rank 0 logs; its lines carry [host:0/2]",
        },
        expect=[r"3epoch:train:23-24batch", r"The training was finished at 3 epochs"],
        prepare=_esp_plain,
    ),
    Case(
        "espnet",
        "nan_single_e2b5",
        [Phase(_esp(ddp=False), env=_esp_fault("nan", 2, 5, 0))],
        {
            "what_you_did": "the audio of every batch from epoch 2, batch 5 on is multiplied by NaN (sitecustomize "
            "hook around Trainer.train_one_epoch's iterator)",
            "verdict": "nonfinite",
            "culprit": {"rank": 0, "epoch": 2, "batch": 5},
            "notes": "ESPnet warns 'The grad norm is nan. Skipping updating the model.' at every such batch and goes "
            "on; epoch 3 has no valid step, so it stops: 'The gradients at all steps are invalid in this epoch. "
            "Something seems wrong. This training was stopped at 3epoch' (exit 0)",
        },
        expect=[r"The grad norm is nan\. Skipping updating the model", r"gradients at all steps are invalid"],
        prepare=_esp_plain,
    ),
    Case(
        "espnet",
        "nan_rank1_e2b5",
        [Phase(_esp(), env=_esp_fault("nan", 2, 5, 1))],
        {
            "what_you_did": "rank 1's audio is multiplied by NaN from epoch 2, batch 5 on",
            "verdict": "nonfinite",
            "culprit": {"rank": 1, "epoch": 2, "batch": 5},
            "notes": "only rank 0 logs: its own loss stays finite in the batch lines, but the all-reduced grad norm is "
            "nan, so rank 0 warns 'The grad norm is nan' from epoch 2, batch 5 on; nothing names rank 1",
        },
        expect=[r"The grad norm is nan\. Skipping updating the model"],
        prepare=_esp_plain,
    ),
    Case(
        "espnet",
        "sigkill_rank1_e2b5",
        [Phase(_esp(), env=_esp_fault("kill", 2, 5, 1))],
        {
            "what_you_did": "rank 1 SIGKILLs itself before training epoch 2, batch 5",
            "verdict": "killed",
            "culprit": {"rank": 1, "epoch": 2, "batch": 5},
            "notes": "rank 0's last line is 2epoch:train:3-4batch; it then fails in the next collective and torchrun "
            "reports rank 1's SIGKILL as the root cause",
        },
        expect=[r"Signal 9 \(SIGKILL\)", r"2epoch:train:3-4batch"],
        prepare=_esp_plain,
    ),
    Case(
        "espnet",
        "missing_wav_rank1_e1b3",
        [Phase(_esp())],
        {
            "what_you_did": "one wav.scp line points at a missing WAV; ESPnet's batching (folded, split over ranks, "
            "shuffled with RandomState(epoch + seed)) puts it in rank 1's batch 3 of epoch 1 (espnet_tools.py locate)",
            "verdict": "crashed",
            "culprit": {"rank": 1, "epoch": 1, "batch": 3},
            "notes": "soundfile raises in rank 1's DataLoader worker; rank 1 logs only at ERROR level, so its "
            "traceback is the [rank1]: lines torchrun adds",
        },
        expect=[r"missing\.wav|LibsndfileError|Error opening"],
        prepare=_esp_missing,
    ),
    Case(
        "espnet",
        "hang_rank1_e1b3_sigterm",
        [Phase(_esp(), action=Action(r"1epoch:train:1-2batch", signal.SIGTERM, 60), timeout_s=200)],
        {
            "what_you_did": "one wav.scp line is a FIFO nobody writes, in rank 1's batch 3 of epoch 1: rank 1's "
            "DataLoader worker blocks opening it; SIGTERM to torchrun 60 s after rank 0 logged 1epoch:train:1-2batch",
            "verdict": "stalled",
            "culprit": {"rank": 1, "epoch": 1, "batch": 3},
            "notes": "rank 0 waits in ESPnet's per-batch all_reduce of the iterator-stop flag (trainer.py, before "
            "the forward), not in a gradient all-reduce; torch's default 30-minute timeout: only the signal ends it",
        },
        expect=[r"1epoch:train:1-2batch", r"SignalException|Signal 15|SIGTERM"],
        prepare=_esp_fifo,
    ),
    Case(
        "espnet",
        "sigterm_launcher_e2b6",
        [Phase(_esp(), action=Action(r"2epoch:train:5-6batch", signal.SIGTERM, 0))],
        {
            "what_you_did": "SIGTERM to torchrun as soon as rank 0 logged 2epoch:train:5-6batch",
            "verdict": "killed",
            "culprit": {"rank": None, "epoch": 2, "batch": 6},
            "notes": "the signal went to the launcher; a batch or two more may be trained before it lands",
        },
        expect=[r"2epoch:train:5-6batch", r"SignalException|Signal 15|SIGTERM"],
        prepare=_esp_plain,
    ),
    Case(
        "espnet",
        "resume_after_sigkill",
        [Phase(_esp(), env=_esp_fault("kill", 2, 5, 1)), Phase(_esp("--resume", "true"), log="console_2.log")],
        {
            "what_you_did": "run 1: rank 1 SIGKILLs itself before epoch 2, batch 5 (console.log); run 2: the same "
            "command with --resume true (console_2.log)",
            "verdict": "no_failure_seen",
            "culprit": None,
            "notes": "run 1 alone: killed, rank 1, epoch 2 batch 5. ESPnet checkpoints at epoch ends only "
            "(checkpoint.pth): run 2 resumes at the start of epoch 2, so batches 1-4 of epoch 2 are trained twice "
            "over the two runs",
        },
        expect=[r"2/3epoch started", r"The training was finished at 3 epochs"],
        prepare=_esp_plain,
    ),
]

TOOLKITS = {"accelerate": ACCELERATE, "speechbrain": SPEECHBRAIN, "espnet": ESPNET}


def _more_toolkits() -> None:
    """The toolkits whose cases live in a module of their own (``<toolkit>_cases.py`` beside this file, each
    defining ``TOOLKIT`` and ``CASES`` with this module's ``Case``, ``Phase`` and ``Action``)."""
    import importlib

    sys.path.insert(0, str(HERE))
    for f in sorted(HERE.glob("*_cases.py")):
        m = importlib.import_module(f.stem)
        TOOLKITS[m.TOOLKIT] = m.CASES


def all_cases() -> list[Case]:
    _more_toolkits()  # at call time: a cases module imports this one
    return [c for cases in TOOLKITS.values() for c in cases]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", help="TOOLKIT or TOOLKIT/CASE (default: all)")
    ap.add_argument("--venv", default=os.environ.get("ASRLAB_OPTIN", "/work/optin/venv"))
    ap.add_argument("--out", default=str(FIXTURES))
    ap.add_argument("--corpus", default=None, help="default: VENV/../corpus")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    chosen = [c for c in all_cases() if not args.cases or c.key in args.cases or c.toolkit in args.cases]
    if args.list:
        for c in chosen:
            print(f"{c.key:50s} {c.truth['verdict']}")
        return 0
    venv = Path(args.venv).resolve()
    corpus = make_corpus(Path(args.corpus) if args.corpus else venv.parent / "corpus")
    for c in chosen:
        t0 = time.time()
        truth = make(c, venv, corpus, Path(args.out))
        console = (Path(args.out) / c.toolkit / c.name / c.phases[-1].log).read_text(errors="replace")
        missing = [e for e in c.expect if not re.search(e, console)]
        rc = [r["exit_code"] for r in truth["runs"]]
        print(f"{c.key:50s} exit {rc} {time.time() - t0:5.1f} s" + (f"  MISSING {missing}" if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
