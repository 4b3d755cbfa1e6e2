"""The fastai cases of ``toolkit_runs.py`` (fixtures under ``tests/fixtures/toolkit_runs/fastai/``):
``fastai_fit.py``, a fastai ``Learner`` over ``DataLoaders`` of two plain PyTorch DataLoaders (the corpus's WAVs,
fbank), a tiny Conv1d + BiGRU CTC model, ``nn.CTCLoss``, ``fit_one_cycle(3, 3e-3)``, one process on the CPU, batch
8: 12 batches an epoch (and 2 of validation), ``CSVLogger`` (history.csv), ``SaveModelCallback(every_epoch=True)``
(models/model_E.pth) and ``TerminateOnNaNCallback`` in one NaN case. The environment: ``/work/optin/venv`` with
``pip install fastai``.

The console is fastprogress's when not in a notebook (its ``printing()`` takes ``sys.stdout.isatty``, the bound
method, for true: a file gets everything a terminal would): a table, ``epoch     train_loss  valid_loss  time``, one
row an epoch with the epoch from 0, and the bars, redrawn with ``\\r`` and no newline, ``Epoch 2/3 : |██----| 16.67%
[2/12 00:00<00:01... 11.2239]`` whose epoch counts from 1 and whose counter is the batches done (from 1; the
validation's bar is ``[k/2``). history.csv has the table's rows (epoch from 0).

The case names count as people do (epoch 2 batch 4: the fourth batch of the second epoch). The truth's ``epoch``
and ``step`` are as fastai counts them: ``Learner.epoch`` (from 0: the table's epoch column, history.csv,
model_E.pth) and ``Learner.iter`` (the batch in the epoch, from 0); ``iteration`` is ``Learner.train_iter`` (the
training batches before this one in the fit, from 0). So epoch 2 batch 4 is ``epoch: 1, step: 3, iteration: 15``,
and the bar shows ``Epoch 2/3`` with ``[3/12`` when batch 4 begins.
"""

from __future__ import annotations

import signal

from toolkit_runs import Action, bad_wav_fifo, bad_wav_missing, Case, Phase

TOOLKIT = "fastai"

JOB = [
    "{py}", "{here}/fastai_fit.py", "--data", "{data}/train/raw.list", "--valid", "{data}/dev/raw.list",
    "--out", "{exp}",
]  # fmt: skip
N = 12  # training batches an epoch

NAN = (2, 4)  # epoch, batch (from 1, as people count: the case's name)
WAV = (2, 5)
KILL = (2, 7)
HANG = (2, 3)
TERM = (2, 6)  # the bar's count when the signal is sent


def _fault(kind, at, **more):
    return {"FAULT": kind, "FAULT_EPOCH": str(at[0]), "FAULT_BATCH": str(at[1]), **more}


def _at(at, rank=0):
    """The truth's culprit: as fastai counts (epoch and batch from 0; train_iter from 0 over the fit)."""
    return {"rank": rank, "epoch": at[0] - 1, "step": at[1] - 1, "iteration": (at[0] - 1) * N + at[1] - 1}


def _bar(epoch: int, done: int) -> str:
    """A regex for the training bar of epoch ``epoch`` (from 1, as the bar counts) at ``done``/12 batches done; the
    console is read as text, where the bar's carriage returns are newlines."""
    return rf"Epoch {epoch}/3 : \|[^|\n]*\| [\d.]+% \[{done}/{N} "


def _row(epoch0: int, loss: str = r"[\d.]+") -> str:
    """A regex for the table's row of epoch ``epoch0`` (from 0, as the table counts)."""
    return rf"(?m)^{epoch0}\s+{loss}\s+{loss}\s+\d\d:\d\d"


CASES = [
    Case(
        TOOLKIT,
        "healthy",
        [Phase(JOB)],
        {
            "what_you_did": "nothing: one process on the CPU, fit_one_cycle(3), 12 training batches an epoch",
            "verdict": "no_failure_seen",
            "culprit": None,
            "notes": "the table's rows count epochs from 0, the bars from 1 ('Epoch 1/3 : ...' before row 0); "
            "history.csv has the rows; models/model_0..2.pth; exit 0",
        },
        expect=[_row(2), r"training finished: 3 epochs"],
    ),
    Case(
        TOOLKIT,
        "nan_e2b4_terminate",
        [Phase([*JOB, "--terminate-on-nan"], env=_fault("nan", NAN))],
        {
            "what_you_did": f"the loss (nn.CTCLoss in a wrapper) is multiplied by float('nan') in epoch {NAN[0]} "
            f"batch {NAN[1]} (training); TerminateOnNaNCallback on",
            "verdict": "nonfinite",
            "culprit": _at(NAN),
            "log_shows": {
                "verdict": "unknown",
                "rank": None,
                "epoch": NAN[0] - 1,
                "step": NAN[1] - 2,
                "why": f"no NaN anywhere: TerminateOnNaNCallback raises CancelFitException without a word before the "
                f"bar is updated, so the bar of 'Epoch {NAN[0]}/3' stops at [{NAN[1] - 1}/{N} ... 10.5767] (its loss, "
                "finite, is the smoothed one of the batch before), the job's 'training finished: 1 epochs, train_loss "
                "11.9505' follows on the bar's line, exit 0; history.csv has epoch 0's row only",
            },
            "notes": "fit ends as if asked to (after_cancel_fit, after_fit): no row for epoch 1, no models/model_1.pth; "
            "the only trace is '1 epochs' of a fit_one_cycle(3) in the job's own last line",
        },
        expect=[_bar(NAN[0], NAN[1] - 1) + r"[^\n]*training finished: 1 epochs"],
    ),
    Case(
        TOOLKIT,
        "nan_e2b4",
        [Phase(JOB, env=_fault("nan", NAN))],
        {
            "what_you_did": f"the loss is multiplied by float('nan') in epoch {NAN[0]} batch {NAN[1]}; no "
            "TerminateOnNaNCallback",
            "verdict": "nonfinite",
            "culprit": _at(NAN),
            "log_shows": {
                "verdict": "nonfinite",
                "rank": None,
                "epoch": NAN[0] - 1,
                "step": NAN[1],
                "why": f"the bar's first 'nan' is at 'Epoch {NAN[0]}/3' [{NAN[1] + 1}/{N} ... nan]: the bar prints its "
                "count first and sets its loss text after, so the loss at [k/12] is the smoothed loss after batch k - 1 "
                f"(fastai's iter k - 2); read as the batch the count names, that is iter {NAN[1]}, one past the truth; the "
                f"table's row {NAN[0] - 1} (from 0) and history.csv then read 'nan nan'",
            },
            "notes": "one NaN loss makes Adam's step write NaN into the weights: every later loss is nan, valid_loss "
            "too; rows 1 and 2 of the table are 'nan nan'; SaveModelCallback still saves model_1.pth and model_2.pth "
            "(NaN weights); the job ends 'training finished: 3 epochs, train_loss nan', exit 0",
        },
        expect=[
            _bar(NAN[0], NAN[1] + 1) + r"[^\]\n]*\.\.\. nan\]",
            _row(NAN[0] - 1, "nan"),
            r"training finished: 3 epochs",
        ],
    ),
    Case(
        TOOLKIT,
        "missing_wav_e2b5",
        [Phase(JOB, env=_fault("wav", WAV, FAULT_WAV="{bad_wav}"))],
        {
            "what_you_did": f"the dataset reads a WAV that does not exist in place of the first of epoch {WAV[0]} "
            f"batch {WAV[1]}'s utterances",
            "verdict": "crashed",
            "culprit": _at(WAV),
            "log_shows": {
                "verdict": "crashed",
                "rank": None,
                "epoch": WAV[0] - 1,
                "step": WAV[1] - 2,
                "why": f"the bar of 'Epoch {WAV[0]}/3' shows [{WAV[1] - 1}/{N}] last (the batches done, fastai's iter "
                f"{WAV[1] - 2} last); batch {WAV[1]} is read when the DataLoader is asked for it (num_workers 0) and "
                "raises before it is trained: the traceback names no epoch or batch",
            },
            "notes": "soundfile.LibsndfileError from the dataset's __getitem__, through torch's DataLoader and "
            "fastai's all_batches; 'Traceback (most recent call last):' follows the bar on its line (no newline "
            "after a bar); exit 1; models/model_0.pth only",
        },
        expect=[_bar(WAV[0], WAV[1] - 1), r"LibsndfileError: Error opening .*missing\.wav"],
        prepare=bad_wav_missing,
    ),
    Case(
        TOOLKIT,
        "sigkill_e2b7",
        [Phase(JOB, env=_fault("kill", KILL))],
        {
            "what_you_did": f"a callback SIGKILLs the process in before_batch of epoch {KILL[0]} batch {KILL[1]} "
            "(before that batch is trained)",
            "verdict": "killed",
            "culprit": _at(KILL),
            "log_shows": {
                "verdict": "unknown",
                "rank": None,
                "epoch": KILL[0] - 1,
                "step": KILL[1] - 2,
                "why": f"the bar of 'Epoch {KILL[0]}/3' shows [{KILL[1] - 1}/{N}] last and nothing follows it (not "
                "even a newline); a SIGKILL leaves no line: only the exit code (-9, 137 from a shell) says so",
            },
            "notes": "exit -9; history.csv has epoch 0's row; models/model_0.pth only",
        },
        expect=[_bar(KILL[0], KILL[1] - 1)],
    ),
    Case(
        TOOLKIT,
        "hang_e2b3_sigterm",
        [
            Phase(
                JOB,
                env=_fault("wav", HANG, FAULT_WAV="{bad_wav}"),
                action=Action(_bar(HANG[0], HANG[1] - 1), signal.SIGTERM, 60),
                timeout_s=150,
            )
        ],
        {
            "what_you_did": f"the dataset opens a FIFO nobody writes in place of the first WAV of epoch {HANG[0]} "
            f"batch {HANG[1]}; SIGTERM to the process 60 s after the bar showed {HANG[1] - 1}/{N}",
            "verdict": "stalled",
            "culprit": _at(HANG),
            "log_shows": {
                "verdict": "unknown",
                "rank": None,
                "epoch": HANG[0] - 1,
                "step": HANG[1] - 2,
                "why": f"the bar of 'Epoch {HANG[0]}/3' shows [{HANG[1] - 1}/{N}] last; nothing for 60 s; Python's "
                "default SIGTERM action ends the process without a line",
            },
            "notes": "the dataset's sf.read blocks in open() of the FIFO; exit -15; the console ends in the bar's line, "
            "no traceback; models/model_0.pth only",
        },
        expect=[_bar(HANG[0], HANG[1] - 1)],
        prepare=bad_wav_fifo,
    ),
    Case(
        TOOLKIT,
        "sigterm_e2b6",
        [Phase(JOB, action=Action(_bar(TERM[0], TERM[1]), signal.SIGTERM, 0))],
        {
            "what_you_did": f"SIGTERM to the process (one process, no launcher) as soon as the bar showed "
            f"{TERM[1]}/{N} in epoch {TERM[0]}",
            "verdict": "stopped",
            "culprit": {**_at((TERM[0], TERM[1] + 1)), "rank": None},
            "log_shows": {
                "verdict": "unknown",
                "rank": None,
                "epoch": TERM[0] - 1,
                "step": TERM[1] - 1,
                "why": f"no line: the bar of 'Epoch {TERM[0]}/3' at [{TERM[1]}/{N}] (fastai's iter {TERM[1] - 1} "
                "done) is the last thing",
            },
            "notes": "fastai installs no signal handler: the process ends at once (exit -15), in the batch after the "
            f"one the bar counted (iter {TERM[1]}, the culprit's step); the signal may land a batch later (see "
            "runs[0].signal); models/model_0.pth only",
        },
        expect=[_bar(TERM[0], TERM[1])],
    ),
    Case(
        TOOLKIT,
        "sigint_e2b6",
        [Phase(JOB, action=Action(_bar(TERM[0], TERM[1]), signal.SIGINT, 0))],
        {
            "what_you_did": f"SIGINT (a Ctrl-C: KeyboardInterrupt) to the process as soon as the bar showed "
            f"{TERM[1]}/{N} in epoch {TERM[0]}",
            "verdict": "stopped",
            "culprit": {**_at((TERM[0], TERM[1] + 1)), "rank": None},
            "log_shows": {
                "rank": None,
                "epoch": TERM[0] - 1,
                "step": TERM[1] - 1,
                "why": f"the bar of 'Epoch {TERM[0]}/3' at [{TERM[1]}/{N}] (fastai's iter {TERM[1] - 1} done), then "
                "'Traceback (most recent call last):' on the bar's line and a bare 'KeyboardInterrupt' (raised where "
                "the main thread was, in the next batch's backward): no epoch or batch in it",
            },
            "notes": "fastai catches no KeyboardInterrupt (its _with_events catches its own Cancel*Exceptions only; "
            "fastprogress's on_interrupt is for Exception): after_fit is not run, no row for epoch 1; Python ends "
            "by SIGINT after the traceback (exit -2, 130 from a shell); models/model_0.pth only",
        },
        expect=[_bar(TERM[0], TERM[1]) + r"[^\n]*Traceback \(most recent call last\)", r"(?m)^KeyboardInterrupt$"],
    ),
]
