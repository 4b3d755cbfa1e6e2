"""The Keras 3 cases of ``toolkit_runs.py`` (fixtures under ``tests/fixtures/toolkit_runs/keras/``):
``keras_fit.py``, ``model.fit`` on the PyTorch backend (``KERAS_BACKEND=torch``), one process on the CPU, a tiny
Conv1D + BiGRU CTC model over a ``keras.utils.PyDataset`` of the corpus's WAVs (fbank), batch 8: 12 batches an
epoch, 3 epochs, ``CSVLogger(training.csv)``, ``ModelCheckpoint(ckpt/epoch_{epoch:02d}.keras)`` (and
``TerminateOnNaN`` in the NaN cases). The environment: ``/work/optin/venv`` with ``pip install keras``.

Keras prints ``Epoch E/3`` (E from 1) and, with ``verbose=1``, a progress bar redrawn in place (``\\r``, ``\\b``
and ANSI colours: it counts ``sys.modules['posix']`` as a terminal, so a log file gets the redraws too) whose
counter is ``N/12`` with N from 1 (the batches done); with ``verbose=2`` one line an epoch. Its callbacks, and so
``TerminateOnNaN``'s message (``Batch N: Invalid loss``) and ``training.csv``'s ``epoch`` column, count from 0.
The truth's ``epoch`` and ``step`` are as the console's bar counts them: epoch from 1, step = batch from 1.
"""

from __future__ import annotations

import signal

from toolkit_runs import Action, bad_wav_fifo, bad_wav_missing, Case, Phase

TOOLKIT = "keras"

JOB = ["{py}", "{here}/keras_fit.py", "--data", "{data}/train/raw.list", "--out", "{exp}"]
ENV = {"KERAS_BACKEND": "torch"}

NAN = (2, 4)  # epoch, batch (from 1, as the console counts)
WAV = (2, 5)
KILL = (2, 7)
HANG = (2, 3)
TERM = (2, 6)


def _job(*extra, verbose=1):
    return [*JOB, "--verbose", str(verbose), *extra]


def _fault(kind, at, **more):
    return {**ENV, "FAULT": kind, "FAULT_EPOCH": str(at[0]), "FAULT_BATCH": str(at[1]), **more}


def _bar(epoch: int, batch: int) -> str:
    """A regex for the verbose=1 bar of epoch ``epoch`` at ``batch``/12 (the bar's counter is bold: ESC[1m), not
    crossing into the next epoch; the console is read as text, where the bar's carriage returns are newlines."""
    return rf"Epoch {epoch}/3\n(?:[^E]|E(?!poch ))*?\x1b\[1m{batch:>2}/12\x1b\[0m"


CASES = [
    Case(
        TOOLKIT,
        "healthy_v1",
        [Phase(_job(), env=ENV)],
        {
            "what_you_did": "nothing: one process on the CPU, model.fit(verbose=1), 3 epochs of 12 batches",
            "verdict": "no_failure_seen",
            "culprit": None,
            "notes": "the progress bar is redrawn in place (\\r, \\b, ANSI colours) even into a file; "
            "training.csv counts epochs from 0 and has a val_loss column of NA; ckpt/epoch_01..03.keras",
        },
        expect=[_bar(3, 12), r"training finished: 3 epochs"],
    ),
    Case(
        TOOLKIT,
        "healthy_v2",
        [Phase(_job(verbose=2), env=ENV)],
        {
            "what_you_did": "nothing: as healthy_v1 with model.fit(verbose=2): one line an epoch",
            "verdict": "no_failure_seen",
            "culprit": None,
            "notes": "the console shows no batch at all: 'Epoch E/3' then '12/12 - Ns - ...ms/step - loss: X'",
        },
        expect=[r"Epoch 3/3", r"training finished: 3 epochs"],
    ),
    Case(
        TOOLKIT,
        "nan_e2b4",
        [Phase(_job("--terminate-on-nan"), env=_fault("nan", NAN))],
        {
            "what_you_did": f"the loss (a keras.losses.CTC subclass) is multiplied by float('nan') in epoch {NAN[0]} "
            f"batch {NAN[1]}; TerminateOnNaN on",
            "verdict": "nonfinite",
            "culprit": {"rank": 0, "epoch": NAN[0], "step": NAN[1]},
            "log_shows": {
                "epoch": NAN[0],
                "step": NAN[1],
                "why": f"the bar shows {NAN[1]}/12 with 'loss: nan' (the running mean of the epoch), then "
                f"TerminateOnNaN prints 'Batch {NAN[1] - 1}: Invalid loss, terminating training': its batch "
                "counts from 0, one less than the bar's",
            },
            "notes": "TerminateOnNaN sets stop_training: fit returns, the script prints 'training finished: 2 "
            "epochs, loss nan' and exits 0; training.csv has epoch 1 (0-based) with loss nan; ModelCheckpoint "
            "still saves ckpt/epoch_02.keras (NaN weights); after the message the bar is finalized at '12/12 ... "
            "loss: nan' though only 4 batches ran",
        },
        expect=[_bar(NAN[0], NAN[1]) + r"[^\n]*loss: nan", rf"Batch {NAN[1] - 1}: Invalid loss, terminating training"],
    ),
    Case(
        TOOLKIT,
        "nan_e2b4_v2",
        [Phase(_job("--terminate-on-nan", verbose=2), env=_fault("nan", NAN))],
        {
            "what_you_did": f"as nan_e2b4 (loss x NaN in epoch {NAN[0]} batch {NAN[1]}, TerminateOnNaN) with "
            "model.fit(verbose=2)",
            "verdict": "nonfinite",
            "culprit": {"rank": 0, "epoch": NAN[0], "step": NAN[1]},
            "log_shows": {
                "epoch": NAN[0],
                "step": NAN[1] - 1,
                "why": f"no bar: the only batch number is TerminateOnNaN's 'Batch {NAN[1] - 1}: Invalid loss, "
                "terminating training', counted from 0; the epoch line follows it",
            },
            "notes": "exit 0, as nan_e2b4; the epoch's line then reads '12/12 - 1s - ...ms/step - loss: nan' "
            "though only 4 batches ran (the bar is finalized at its target when the epoch ends)",
        },
        expect=[rf"Batch {NAN[1] - 1}: Invalid loss, terminating training"],
    ),
    Case(
        TOOLKIT,
        "raising_item_e2b5",
        [Phase(_job(), env=_fault("wav", WAV, FAULT_WAV="{bad_wav}"))],
        {
            "what_you_did": f"the PyDataset reads a WAV that does not exist in place of the first of epoch {WAV[0]} "
            f"batch {WAV[1]}'s utterances",
            "verdict": "crashed",
            "culprit": {"rank": 0, "epoch": WAV[0], "step": WAV[1]},
            "log_shows": {
                "epoch": WAV[0],
                "step": WAV[1] - 1,
                "why": f"the bar shows {WAV[1] - 1}/12 last (the batches done); batch {WAV[1]} is read when it is "
                "asked for (workers=1, no read-ahead) and raises before it is trained",
            },
            "notes": "soundfile.LibsndfileError from __getitem__, through Keras's epoch iterator; the traceback "
            "follows the bar on its line (no newline after the bar); exit 1",
        },
        expect=[_bar(WAV[0], WAV[1] - 1), r"LibsndfileError: Error opening .*missing\.wav"],
        prepare=bad_wav_missing,
    ),
    Case(
        TOOLKIT,
        "sigkill_e2b7",
        [Phase(_job(), env=_fault("kill", KILL))],
        {
            "what_you_did": f"a callback SIGKILLs the process in on_train_batch_begin of epoch {KILL[0]} batch "
            f"{KILL[1]} (before that batch is trained)",
            "verdict": "killed",
            "culprit": {"rank": 0, "epoch": KILL[0], "step": KILL[1]},
            "log_shows": {
                "epoch": KILL[0],
                "step": KILL[1] - 1,
                "why": f"the bar shows {KILL[1] - 1}/12 last and nothing follows it (not even a newline); "
                "a SIGKILL leaves no line: only the exit code (-9, 137 from a shell) says so",
            },
            "notes": "exit -9; ckpt/epoch_01.keras only",
        },
        expect=[_bar(KILL[0], KILL[1] - 1)],
    ),
    Case(
        TOOLKIT,
        "hang_e2b3_sigterm",
        [
            Phase(
                _job(),
                env=_fault("wav", HANG, FAULT_WAV="{bad_wav}"),
                action=Action(_bar(HANG[0], HANG[1] - 1), signal.SIGTERM, 60),
                timeout_s=150,
            )
        ],
        {
            "what_you_did": f"the PyDataset opens a FIFO nobody writes in place of the first WAV of epoch {HANG[0]} "
            f"batch {HANG[1]}; SIGTERM to the process 60 s after the bar showed {HANG[1] - 1}/12",
            "verdict": "stalled",
            "culprit": {"rank": 0, "epoch": HANG[0], "step": HANG[1]},
            "log_shows": {
                "epoch": HANG[0],
                "step": HANG[1] - 1,
                "why": f"the bar shows {HANG[1] - 1}/12 last; nothing for 60 s; Python's default SIGTERM "
                "action ends the process without a line",
            },
            "notes": "exit -15; the console ends in the bar's line, no traceback",
        },
        expect=[_bar(HANG[0], HANG[1] - 1)],
        prepare=bad_wav_fifo,
    ),
    Case(
        TOOLKIT,
        "sigterm_launcher_e2b6",
        [Phase(_job(), env=ENV, action=Action(_bar(TERM[0], TERM[1]), signal.SIGTERM, 0))],
        {
            "what_you_did": f"SIGTERM to the process (the launcher: one process, no torchrun) as soon as the bar "
            f"showed {TERM[1]}/12 in epoch {TERM[0]}",
            "verdict": "stopped",
            "culprit": {"rank": None, "epoch": TERM[0], "step": TERM[1]},
            "notes": "Keras installs no signal handler: the process ends at once (exit -15), no line; the "
            "signal may land in the next batch (see runs[0].signal)",
        },
        expect=[_bar(TERM[0], TERM[1])],
    ),
]
