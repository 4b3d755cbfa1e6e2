"""NVIDIA NeMo's own ASR training script, broken on purpose: the cases of ``tests/optin/toolkit_runs.py`` for
TOOLKIT "nemo" (loaded by its ``_more_toolkits``).

The job is ``tests/optin/nemo/speech_to_text_ctc.py``, NeMo's ``examples/asr/asr_ctc/speech_to_text_ctc.py``
unchanged (the repository's snapshot whose ``nemo/package_info.py`` says 2.6.0rc0), run
with the installed nemo-toolkit on ``tests/optin/nemo/tiny_ctc.yaml`` (NeMo's
``examples/asr/conf/conformer/conformer_ctc_char.yaml`` shrunk: a 2-layer Conformer of d_model 32, the corpus's
characters as labels, batch 4, 3 epochs). Nothing is downloaded, no pretrained model.

The data: the corpus's raw.list (JSON lines: key, wav, txt) written as NeMo's manifests (JSON lines:
audio_filepath, duration, text) by ``_manifests``. Two ranks are Lightning's own DDP on the CPU
(``trainer.strategy=ddp trainer.devices=2``, as NeMo's docs launch it, no torchrun): the launched process is
rank 0, and Lightning's ``_SubprocessScriptLauncher`` starts rank 1 as its child, the same command plus Hydra's
``hydra.run.dir="." hydra.job.name=train_ddp_process_1 hydra.output_subdir=null``, with LOCAL_RANK=1, NODE_RANK=0,
WORLD_SIZE=2, MASTER_ADDR, MASTER_PORT (and NeMo's NEMO_EXPM_VERSION) in its environment, no RANK; the gloo
backend. Lightning counts ``global_step`` from 0 (the optimizer steps done before this one); its progress bar's
``Epoch E: ... n/12`` counts batches from 1 within the 0-based epoch E. 96 utterances, batch 4: 24 steps an
epoch in one process, 12 per rank under DDP, whose DistributedSampler shuffles with seed 0 and
set_epoch(epoch): rank 1's batch is computed, not guessed (``_ddp_item``).

Code faults come from ``tests/optin/nemo_faults/sitecustomize.py`` on PYTHONPATH (NEMO_FAULT, NEMO_FAULT_STEP,
NEMO_FAULT_RANK), data faults from a manifest line.
"""

from __future__ import annotations

import json
import signal
import wave
from pathlib import Path

from toolkit_runs import ROOT, Action, Case, Phase, _fifo

TOOLKIT = "nemo"

STEPS_PER_EPOCH = 12  # per rank, under DDP
DATA_STEP = 5  # global_step whose rank-1 batch holds the broken manifest line (epoch 0, batch 6 of 12)
FAULT_STEP = 15  # global_step of the code faults (epoch 1, batch 4 of 12)

JOB = [
    "{here}/nemo/speech_to_text_ctc.py",
    "--config-path={here}/nemo",
    "--config-name=tiny_ctc",
    "model.train_ds.manifest_filepath={train}",
    "model.validation_ds.manifest_filepath={dev}",
    "exp_manager.exp_dir={exp}",
    "trainer.accelerator=cpu",
    "trainer.log_every_n_steps=1",
    "trainer.max_epochs=3",
]
DDP = ["trainer.devices=2", "trainer.strategy=ddp"]
WATCH = [str(ROOT / ".venv" / "bin" / "asrlab"), "watch", "--exp", "{exp}/watch"]


def _nemo(*extra, ddp=True, watch=None):
    job = ["{py}", *JOB, *(DDP if ddp else ["trainer.devices=1", "trainer.strategy=auto"]), *extra]
    return [*WATCH, *watch, "--", *job] if watch is not None else job


# NeMo's exp_manager writes git-info.log (`git rev-parse HEAD` and the whole `git diff`) when the job's folder is
# in a git work tree, as the case folders under tests/fixtures are: git is kept from looking above the case's
# folder, as in a re-make under a temporary folder
NO_GIT = {"GIT_CEILING_DIRECTORIES": "{ceiling}"}


def _fault(kind, step=FAULT_STEP, rank=1):
    return {
        **NO_GIT,
        "PYTHONPATH": "{here}/nemo_faults",
        "NEMO_FAULT": kind,
        "NEMO_FAULT_STEP": str(step),
        "NEMO_FAULT_RANK": str(rank),
    }


# --------------------------------------------------------------------------- what the machinery lacks


def _manifest(raw_list: Path, out: Path, swap: dict | None = None) -> Path:
    """raw.list as NeMo's manifest; ``swap``: {index: path} of items whose audio is replaced (the duration kept)."""
    lines = []
    for i, line in enumerate(raw_list.read_text().splitlines()):
        item = json.loads(line)
        with wave.open(item["wav"]) as w:
            duration = w.getnframes() / w.getframerate()
        audio = (swap or {}).get(i, item["wav"])
        lines.append(json.dumps({"audio_filepath": audio, "duration": round(duration, 4), "text": item["txt"]}))
    out.write_text("\n".join(lines) + "\n")
    return out


def _ddp_item(step=DATA_STEP, rank=1, n=96, batch_size=4) -> int:
    """The first item of rank ``rank``'s batch at ``global_step`` ``step`` under Lightning's DistributedSampler."""
    from torch.utils.data import DistributedSampler

    epoch, batch = divmod(step, STEPS_PER_EPOCH)
    sampler = DistributedSampler(range(n), num_replicas=2, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(epoch)
    return list(sampler)[batch * batch_size]


def _manifests(corpus, exp, work, swap=None):
    extra = {"dev": str(_manifest(corpus / "dev" / "raw.list", work / "dev.json")), "ceiling": str(exp.parent)}
    if swap:
        item = _ddp_item()
        extra["bad_item"] = str(item)
        swap = {item: str(work / "missing.wav") if swap == "missing" else _fifo(work)}
    extra["train"] = str(_manifest(corpus / "train" / "raw.list", work / "train.json", swap))
    return extra


def _plain(corpus, exp, work):
    return _manifests(corpus, exp, work)


def _missing(corpus, exp, work):
    return _manifests(corpus, exp, work, swap="missing")


def _hang(corpus, exp, work):
    return _manifests(corpus, exp, work, swap="fifo")


def _truth(shows=None, **kw):
    """A case's truth; ``shows``: what its log shows where that differs from what was caused (``log_shows``, with
    ``log_shows``' words as its ``why``)."""
    if shows is not None:
        why = kw.pop("log_shows", None)
        kw["log_shows"] = {**shows, **({"why": why} if why and "why" not in shows else {})}
    return kw


FINISHED = r"`Trainer.fit` stopped: `max_epochs=3` reached"
RANK1_UP = r"Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2"


def _bar(epoch: int, n: int, of: int = STEPS_PER_EPOCH) -> str:
    """Lightning's tqdm bar (rank 0's) after n batches of the 0-based epoch."""
    return rf"Epoch {epoch}: +\d+%\|[^\r\n|]*\| {n}/{of} "


CASES = [
    Case(
        TOOLKIT,
        "healthy_single",
        [Phase(_nemo(ddp=False), env=NO_GIT)],
        _truth(
            what_you_did="nothing: one process (trainer.devices=1), 3 epochs of 24 steps",
            verdict="no_failure_seen",
            culprit=None,
            notes="NeMo prints no loss line: the console has Lightning's tqdm bar (carriage returns) and NeMo's "
            "'WER reference:'/'WER predicted:' lines at every step (log_prediction, log_every_n_steps=1); the "
            "losses (train_loss, val_loss, val_wer by global_step) are only in the TensorBoard events. NeMo 3.0 "
            "writes nemo_log_globalrank-*_localrank-*.txt only under NEMO_TESTING=1: its folder "
            "(exp_dir/TinyConformerCTC/<date-time>/) has cmd-args.log, hparams.yaml, lightning_logs.txt (the model "
            "summary), nemo_error_log.txt (its warnings), the events and checkpoints/ (.ckpt of the best val_wer and "
            "-last, .nemo). The tiny model learns little in 3 epochs (val_wer stays 1.0, predictions empty)",
        ),
        expect=[_bar(2, 24, 24), FINISHED],
        prepare=_plain,
    ),
    Case(
        TOOLKIT,
        "healthy_ddp2",
        [Phase(_nemo(), env=NO_GIT)],
        _truth(
            what_you_did="nothing: 2 gloo ranks (trainer.devices=2 trainer.strategy=ddp, Lightning's own launcher: "
            "rank 1 is the launched process's child), 3 epochs of 12 steps a rank",
            verdict="no_failure_seen",
            culprit=None,
            notes="only rank 0 logs and writes the experiment folder; rank 1's own lines are 'Initializing "
            "distributed: GLOBAL_RANK: 1, MEMBER: 2/2' and NeMo's OneLogger lines, which say 'rank=0' on both "
            "ranks (OneLogger reads RANK, which Lightning's launcher does not set)",
        ),
        expect=[RANK1_UP, _bar(2, 12), FINISHED],
        prepare=_plain,
    ),
    Case(
        TOOLKIT,
        "nan_rank1",
        [Phase(_nemo(), env=_fault("nan"))],
        _truth(
            what_you_did=f"rank 1 multiplies its loss by NaN from global_step {FAULT_STEP} on (epoch 1, batch 4 of "
            "12; sitecustomize wraps EncDecCTCModel.training_step)",
            verdict="nonfinite",
            culprit={"rank": 1, "step": FAULT_STEP},
            shows={"rank": None, "step": 16},
            log_shows="no text line: nothing checks the loss (skip_nan_grad false, Lightning does not look), the NaN "
            "gradient is all-reduced into both ranks' weights and the run finishes with exit 0. Rank 0's "
            "TensorBoard events (files.txt; only rank 0 logs) have train_loss finite at global_step 15 and nan "
            "from 16 to 35, val_loss nan after epochs 1 and 2; in the console only NeMo's 'WER predicted:' "
            "changes, from '' to ' ' (every frame decoded as the space) from step 16 on",
            notes="rank 1's own NaN losses are logged nowhere: NeMo logs rank 0's loss, not the all-reduced one",
        ),
        expect=[RANK1_UP, _bar(1, 4), FINISHED],
        prepare=_plain,
    ),
    Case(
        TOOLKIT,
        "raising_item_rank1",
        [Phase(_nemo(), env=NO_GIT)],
        _truth(
            what_you_did=f"one manifest line points at a missing WAV; Lightning's DistributedSampler (seed 0, epoch "
            f"0) puts it first in rank 1's batch of global_step {DATA_STEP} (epoch 0, batch 6 of 12)",
            verdict="crashed",
            culprit={"rank": 1, "step": DATA_STEP},
            shows={"rank": None, "step": 5},
            log_shows="two tracebacks, neither marked with a rank (Lightning's launcher prefixes nothing): rank 1's, "
            "from next(data_fetcher) in the DataLoader's reraise, 'soundfile.LibsndfileError: <exception str() "
            "failed>' (no file name, no worker traceback); then rank 0's, in DDP's _sync_buffers of step 5's "
            "forward, 'RuntimeError: [.../gloo/transport/tcp/pair.cc:547] Connection closed by peer'. Rank 0's bar "
            "stops at 'Epoch 0: 42% 5/12' (5 steps done)",
            notes="Lightning does not prefetch a sized DataLoader: the error comes exactly when global_step 5's "
            "batch is fetched (the DataLoader worker had raised it ahead). Rank 0 raises too, so the launcher's exit "
            "is 1",
        ),
        expect=[r"soundfile\.LibsndfileError", r"Connection closed by peer", _bar(0, 5)],
        prepare=_missing,
    ),
    Case(
        TOOLKIT,
        "sigkill_rank1",
        [Phase(_nemo(), env=_fault("kill"))],
        _truth(
            what_you_did=f"rank 1 SIGKILLs itself at the start of global_step {FAULT_STEP}'s training_step (epoch 1, "
            "batch 4 of 12)",
            verdict="killed",
            shows={
                "rank": 1,
                "epoch": 1,
                "step": 3,
                "why": "rank 0's bar (Epoch 1, 3/12) with Lightning's '[rank: 1] Child process with PID N terminated with code -9' glued after it",
            },
            culprit={"rank": 1, "step": FAULT_STEP},
            notes="Lightning's child-process observer thread in rank 0 (the launcher) sees its child die: '[rank: 1] "
            "Child process with PID N terminated with code -9. Forcefully terminating all other processes to avoid "
            "zombies' and SIGKILLs itself (exit -9, no traceback, no checkpoint). Rank 0's bar's last state is "
            "'Epoch 1: 25% 3/12' (global_step 15 under way)",
        ),
        expect=[r"\[rank: 1\] Child process with PID \d+ terminated with code -9", _bar(1, 3)],
        prepare=_plain,
    ),
    Case(
        TOOLKIT,
        "hang_rank1_watch",
        [Phase(_nemo(watch=["--stall-timeout", "60", "--on-stall", "kill"]), env=NO_GIT, timeout_s=400)],
        _truth(
            what_you_did=f"one manifest line is a FIFO nobody writes, in rank 1's batch of global_step {DATA_STEP} "
            "(epoch 0, batch 6 of 12): rank 1's DataLoader worker blocks opening it; the job runs under "
            "`asrlab watch --stall-timeout 60 --on-stall kill`",
            verdict="stalled",
            culprit={"rank": 1, "step": DATA_STEP},
            shows={"verdict": "stalled", "rank": 1, "step": None},
            log_shows="the watch names both ranks (lab.json world_size 2: rank 0 the launched process, rank 1 "
            "Lightning's child with LOCAL_RANK=1 and no RANK): 'asrlab watch: stalled: rank 1 has waited 180 s for "
            "data (loop at speech_to_text_ctc.py:92 in main; worker pid N at a read); rank 0 is waiting in a "
            "collective (torch.distributed)', after the first-step allowance (3x 60 s: the steps before the hang "
            "took under a second, too short for the watch to see rank 1 train). The step is left unsaid: the "
            "bar shows 5/12, the watch's own copy of the output ends its last full redraw at 4/12",
            notes="on the watch's signal rank 1 prints '[rank: 1] Received SIGTERM: 15' and raises 'DataLoader "
            "worker (pid N) is killed by signal: Terminated', then rank 0 '[rank: 0] Received SIGTERM: 15' and "
            "'Connection closed by peer'. The exit the watch passes on is 1 or 137 from one try to the next "
            "(whether rank 0 is SIGKILLed before it exits: a race; runs[0].exit_code says which). Without the "
            "watch nothing would end it for Lightning's 30-minute process-group timeout",
        ),
        expect=[r"asrlab watch: no rank has moved for \d+ s", r"asrlab watch: ending the stalled job", _bar(0, 5)],
        prepare=_hang,
    ),
    Case(
        TOOLKIT,
        "sigterm_launcher",
        [Phase(_nemo(), env=NO_GIT, action=Action(_bar(1, 6), signal.SIGTERM, 0))],
        _truth(
            what_you_did="SIGTERM to the launched process (rank 0, Lightning's launcher) as soon as its bar showed "
            "'Epoch 1: 50% 6/12' (global_step 18 under way)",
            verdict="stopped",
            verdict_why="a signal to the launcher stops the job: no rank failed of its own (Lightning prints "
            "'[rank: N] Received SIGTERM: 15' on every rank, then exits 0)",
            culprit={"rank": None, "step": 18},
            shows={"rank": None, "epoch": 1, "step": 6},
            log_shows="'[rank: 0] Received SIGTERM: 15', '[rank: 1] Received SIGTERM: 15' (Lightning's launcher "
            "passes the signal on to its child), one more batch on the bar, and the job ends with exit 0 and no "
            "other line",
            notes="steps take about 0.1 s here, as long as the maker's poll of the console: the signal lands at the "
            "step of runs[0].signal.last_line_before or one later. Lightning's SIGTERM handler only sets a flag; "
            "the step under way finishes and the loop raises SIGTERMException, a SystemExit without a code: exit 0 "
            "on both ranks, no traceback, no checkpoint of its own. A job ended from outside looks like a finished "
            "one by its exit code",
        ),
        expect=[r"\[rank: 0\] Received SIGTERM: 15", r"\[rank: 1\] Received SIGTERM: 15"],
        prepare=_plain,
    ),
    Case(
        TOOLKIT,
        "healthy_ddp2_watch",
        [Phase(_nemo(watch=[]), env=NO_GIT, timeout_s=400)],
        _truth(
            what_you_did="nothing: the healthy 2-rank job under `asrlab watch` with its default timeouts",
            verdict="no_failure_seen",
            shows={
                "verdict": "finished",
                "why": "the watch's own folder (exp/watch, lab.json status finished) is read with the console",
            },
            culprit=None,
            notes="the watch left it alone and printed nothing: exit 0 passed through, lab.json status finished; it "
            "recorded world_size 1 (rank 0 only, as in hang_rank1_watch)",
        ),
        expect=[RANK1_UP, FINISHED],
        prepare=_plain,
    ),
]
