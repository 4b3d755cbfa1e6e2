"""The PyTorch-Ignite cases of ``toolkit_runs.py`` (fixtures under ``tests/fixtures/toolkit_runs/ignite/``):
``ignite_ctc.py``, a tiny Conv1d + GRU CTC model trained by an Ignite ``Engine`` (its own update function),
``idist.auto_model`` / ``auto_optim`` / ``auto_dataloader``, its 2 gloo ranks started by Ignite's own launcher,
``idist.Parallel(backend="gloo", nproc_per_node=2)`` (torch.multiprocessing spawn: the launched process is no
rank; it spawns ranks 0 and 1 and waits for them), or one process (``--nproc 1``, backend None). 12 iterations an
epoch on every rank, 3 epochs. The environment: ``/work/optin/venv`` with ``pip install pytorch-ignite``.

Ignite's logging is rank 0's only (``setup_logger`` gives the other ranks a NullHandler): Parallel's and
auto_*'s INFO lines, the engine's (``Engine run starting``, ``Epoch[e] Complete``), the job's handler
``Epoch[e] Iteration[i/12] Loss: x`` (i within the epoch, from 1) and the tqdm ``ProgressBar``
(``Epoch [e/3]: [i/12]``, carriage returns). Ignite's ``engine.state.iteration`` counts from 1 over the whole
run (epoch 2 iteration 4 is its iteration 16; the checkpoints are named by it: ``ctc_checkpoint_12.pt``). The
truth's ``epoch`` and ``step`` are as the log line counts them (epoch from 1, step = iteration within the epoch
from 1); ``iteration`` is Ignite's global one.
"""

from __future__ import annotations

import signal

from toolkit_runs import Action, bad_wav_fifo, bad_wav_missing, Case, Phase, ROOT

TOOLKIT = "ignite"

ASRLAB = str(ROOT / ".venv" / "bin" / "asrlab")
JOB = ["{py}", "{here}/ignite_ctc.py", "--data", "{data}/train/raw.list", "--out", "{exp}"]
N = 12  # iterations an epoch a rank

NAN = (2, 4)  # epoch, iteration within it (from 1)
WAV = (2, 5)
KILL = (2, 7)
HANG = (2, 3)
TERM = (2, 6)


def _job(*extra, nproc=2):
    return [*JOB, "--nproc", str(nproc), *(["--port", "{port}"] if nproc > 1 else []), *extra]


def _fault(kind, at, rank=1, **more):
    return {"FAULT": kind, "FAULT_RANK": str(rank), "FAULT_EPOCH": str(at[0]), "FAULT_ITER": str(at[1]), **more}


def _line(epoch, it):
    """A regex for rank 0's loss line of an iteration."""
    return rf"Epoch\[{epoch}\] Iteration\[{it}/{N}\] Loss: "


def _culprit(at, rank=1):
    return {"rank": rank, "epoch": at[0], "step": at[1], "iteration": (at[0] - 1) * N + at[1]}


CASES = [
    Case(
        TOOLKIT,
        "healthy_ddp2",
        [Phase(_job())],
        {
            "what_you_did": "nothing: 2 gloo ranks started by idist.Parallel(nproc_per_node=2), 3 epochs of 12 "
            "iterations a rank",
            "verdict": "no_failure_seen",
            "culprit": None,
            "notes": "only rank 0 prints (setup_logger gives rank 1 a NullHandler); the tqdm bar's redraws and the "
            "loss lines share console lines (a log line starts right after the bar's last redraw, no newline); "
            "ckpt/ctc_checkpoint_12.pt, _24, _36 are named by Ignite's global iteration; tb/'s event file (rank 0's "
            "loss at every global iteration) is kept; exit 0 after 'Parallel INFO: End of run'",
        },
        expect=[_line(3, N), r"training finished: 3 epochs, iteration 36", r"Parallel INFO: End of run"],
    ),
    Case(
        TOOLKIT,
        "healthy_single",
        [Phase(_job(nproc=1))],
        {
            "what_you_did": "nothing: one process (idist.Parallel(backend=None)), batch 8, 3 epochs of 12 iterations",
            "verdict": "no_failure_seen",
            "culprit": None,
            "notes": "no spawn: Parallel runs the function in this process ('Run ... in 1 processes'); "
            "auto_dataloader keeps batch 8 (no DistributedSampler); ckpt/ctc_checkpoint_12/24/36.pt; exit 0",
        },
        expect=[_line(3, N), r"training finished: 3 epochs, iteration 36"],
    ),
    Case(
        TOOLKIT,
        "nan_rank1_e2i4",
        [Phase(_job("--terminate-on-nan"), env=_fault("nan", NAN))],
        {
            "what_you_did": f"rank 1 multiplies its loss by float('nan') from epoch {NAN[0]} iteration {NAN[1]} on "
            "(its update function); TerminateOnNan attached on every rank",
            "verdict": "nonfinite",
            "culprit": _culprit(NAN),
            "log_shows": {
                "rank": None,
                "epoch": NAN[0],
                "step": NAN[1],
                "why": "rank 1's TerminateOnNan prints 'TerminateOnNan: Output 'nan' contains NaN or Inf. Stop "
                "training' (Python's last-resort handler: no time, no rank, no iteration); the last loss line is rank "
                f"0's Epoch[{NAN[0]}] Iteration[{NAN[1]}/{N}] with its own, finite loss; the only rank the console "
                "names is the victim: '-- Process 0 terminated with the following error' ('Connection closed by peer')",
            },
            "notes": f"TerminateOnNan ends rank 1's run after its iteration {NAN[1]} (engine.terminate: no "
            "EPOCH_COMPLETED, no checkpoint); rank 1's function returns and the process exits 0; rank 0, in "
            f"iteration {NAN[1] + 1}'s backward (DDP's gradient all-reduce), gets 'Connection closed by peer', its "
            "engine logs 'Engine run is terminating due to exception', and torch's spawn raises "
            "ProcessRaisedException naming process 0 in the launcher: exit 1. ckpt/ctc_checkpoint_12.pt only; the "
            f"TensorBoard events (rank 0's) have finite losses up to global iteration {(NAN[0] - 1) * N + NAN[1]}",
        },
        expect=[
            _line(NAN[0], NAN[1]),
            r"TerminateOnNan: Output 'nan' contains NaN or Inf\. Stop training",
            r"-- Process 0 terminated with the following error",
            r"Connection closed by peer",
        ],
    ),
    Case(
        TOOLKIT,
        "missing_wav_rank1_e2i5",
        [Phase(_job(), env=_fault("wav", WAV, FAULT_WAV="{bad_wav}"))],
        {
            "what_you_did": f"rank 1's dataset reads a WAV that does not exist in place of the first item of epoch "
            f"{WAV[0]} iteration {WAV[1]}'s batch",
            "verdict": "crashed",
            "culprit": _culprit(WAV),
            "log_shows": {
                "rank": 1,
                "epoch": WAV[0],
                "step": WAV[1] - 1,
                "why": f"the last loss line is rank 0's Epoch[{WAV[0]}] Iteration[{WAV[1] - 1}/{N}]; rank 1 raises "
                f"fetching iteration {WAV[1]}'s batch (GET_BATCH, num_workers 0), before it starts: no line names "
                "the iteration; the launcher's '-- Process 1 terminated with the following error' names the rank",
            },
            "notes": "soundfile.LibsndfileError in rank 1's __getitem__ through Ignite's engine (rank 1 logs nothing: "
            f"NullHandler); rank 0's engine logs 'Current run is terminating due to exception: ... Connection closed "
            "by peer' first (rank 0 waited in iteration "
            f"{WAV[1]}'s all-reduce); then torch's spawn SIGTERMs rank 0 ('Terminating process N via signal "
            "SIGTERM') and the launcher raises ProcessRaisedException with rank 1's traceback: exit 1",
        },
        expect=[
            _line(WAV[0], WAV[1] - 1),
            r"-- Process 1 terminated with the following error",
            r"LibsndfileError: Error opening .*missing\.wav",
        ],
        prepare=bad_wav_missing,
    ),
    Case(
        TOOLKIT,
        "sigkill_rank1_e2i7",
        [Phase(_job(), env=_fault("kill", KILL))],
        {
            "what_you_did": f"rank 1 SIGKILLs itself at ITERATION_STARTED of epoch {KILL[0]} iteration {KILL[1]} "
            "(before it is trained)",
            "verdict": "killed",
            "culprit": _culprit(KILL),
            "log_shows": {
                "rank": 1,
                "epoch": KILL[0],
                "step": KILL[1] - 1,
                "why": f"the last loss line is rank 0's Epoch[{KILL[0]}] Iteration[{KILL[1] - 1}/{N}] (the killed "
                "iteration never started); 'ProcessExitedException: process 1 terminated with signal SIGKILL' names "
                "the rank",
            },
            "notes": "torch's spawn in the launcher sees process 1 end by SIGKILL, SIGTERMs rank 0 ('Terminating "
            "process N via signal SIGTERM') and raises ProcessExitedException: exit 1; rank 0 logs no error of its "
            "own; ckpt/ctc_checkpoint_12.pt only",
        },
        expect=[_line(KILL[0], KILL[1] - 1), r"ProcessExitedException: process 1 terminated with signal SIGKILL"],
    ),
    Case(
        TOOLKIT,
        "hang_rank1_e2i3_sigterm",
        [
            Phase(
                _job(),
                env=_fault("wav", HANG, FAULT_WAV="{bad_wav}"),
                action=Action(_line(HANG[0], HANG[1] - 1), signal.SIGTERM, 60),
                timeout_s=200,
            )
        ],
        {
            "what_you_did": f"rank 1's dataset opens a FIFO nobody writes in place of the first item of epoch "
            f"{HANG[0]} iteration {HANG[1]}'s batch; SIGTERM to the launcher (the idist.Parallel process) 60 s "
            f"after rank 0 logged iteration {HANG[1] - 1}",
            "verdict": "stalled",
            "culprit": _culprit(HANG),
            "log_shows": {
                "rank": None,
                "epoch": HANG[0],
                "step": HANG[1] - 1,
                "why": f"the last loss line is rank 0's Epoch[{HANG[0]}] Iteration[{HANG[1] - 1}/{N}] and the bar at "
                f"[{HANG[1] - 1}/{N}]; then nothing, not even for the signal: the launcher (torch's spawn, waiting in "
                "join) has no SIGTERM handler and dies without a line (exit -15); no line names a rank",
            },
            "notes": "rank 1 blocks in open() of the FIFO fetching the batch; rank 0 waits in the next iteration's "
            "gradient all-reduce (gloo, default 30-minute timeout). SIGTERM ends the launcher only: its ranks are "
            "left running, orphaned (the harness then SIGKILLs them by pid: runs[0].orphans_killed counts the 2 ranks "
            "and multiprocessing's resource tracker); under a shell or a batch system without a kill of the process "
            "group they would hang on. ckpt/ctc_checkpoint_12.pt only",
        },
        expect=[_line(HANG[0], HANG[1] - 1)],
        prepare=bad_wav_fifo,
    ),
    Case(
        TOOLKIT,
        "hang_rank1_watch",
        [
            Phase(
                [ASRLAB, "watch", "--exp", "{exp}/watch", "--stall-timeout", "20", "--on-stall", "kill", "--", *_job()],
                env=_fault("wav", HANG, FAULT_WAV="{bad_wav}"),
                timeout_s=200,
            )
        ],
        {
            "what_you_did": f"as hang_rank1_e2i3_sigterm (rank 1 opens a FIFO nobody writes, data of epoch {HANG[0]} "
            f"iteration {HANG[1]}), the same command under `asrlab watch --stall-timeout 20 --on-stall kill` "
            "(this checkout's .venv), no signal from outside",
            "verdict": "stalled",
            "culprit": _culprit(HANG),
            "log_shows": {
                "rank": 1,
                "epoch": HANG[0],
                "step": HANG[1] - 1,
                "why": f"Ignite's log shows rank 0's Epoch[{HANG[0]}] Iteration[{HANG[1] - 1}/{N}] last; the watch's "
                "own lines name rank 1 waiting for data in __getitem__ and rank 0 in DDP's gradient all-reduce",
            },
            "notes": "the watch (py-spy; exp/watch/) finds both spawned ranks under the Parallel launcher; 20 s after "
            "the stacks stopped it reports the stall and ends the job: rank 1 first, then torch's spawn in the "
            "launcher SIGTERMs rank 0 ('Terminating process N via signal SIGTERM'), and the launcher is ended too "
            "(no traceback; lab.json: exit_code 143). The watch exits 3 (its stall code), not the job's 143",
        },
        expect=[
            _line(HANG[0], HANG[1] - 1),
            r"asrlab watch: stalled: rank 1 has waited .* for data",
            r"ending the stalled job",
        ],
        prepare=bad_wav_fifo,
    ),
    Case(
        TOOLKIT,
        "sigterm_launcher_e2i6",
        [Phase(_job(), action=Action(_line(TERM[0], TERM[1]), signal.SIGTERM, 0))],
        {
            "what_you_did": f"SIGTERM to the launcher (the idist.Parallel process, no rank) as soon as rank 0 logged "
            f"epoch {TERM[0]} iteration {TERM[1]}",
            "verdict": "stopped",
            "culprit": {"rank": None, "epoch": TERM[0], "step": TERM[1], "iteration": (TERM[0] - 1) * N + TERM[1]},
            "notes": "the launcher has no SIGTERM handler: it dies at once without a line (exit -15) and does not "
            "pass the signal on; its ranks go on training, orphaned, until the harness SIGKILLs them by pid "
            "(runs[0].orphans_killed); the console's last loss line is the one the signal followed, a later one "
            "may slip in before the orphans are ended (see runs[0].signal)",
        },
        expect=[_line(TERM[0], TERM[1])],
    ),
]
