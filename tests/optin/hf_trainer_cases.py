"""The Hugging Face ``transformers.Trainer`` cases of ``toolkit_runs.py`` (fixtures under
``tests/fixtures/toolkit_runs/hf_trainer/``): ``hf_trainer_ctc.py``, a tiny randomly initialised
``Wav2Vec2ForCTC`` trained by ``Trainer`` for 24 optimizer steps (``global_step``, from 1; batch 4 a device:
12 steps an epoch on each of 2 ranks, 2 epochs), ``logging_steps=1``, ``save_steps=5`` (checkpoint-5 .. -20 and
checkpoint-24), ``report_to=["tensorboard"]`` (``{exp}/runs/<date>_<host>/events.out.tfevents.*``).

Trainer prints on rank 0 only: one dict a step (``{'loss': ..., 'grad_norm': ..., 'learning_rate': ...,
'epoch': ...}``, no step number: the step is ``epoch * 12`` under torchrun, ``epoch * 24`` in one process) and
its tqdm bar (``N/24``, carriage returns). The loss it logs is the mean over the ranks of each rank's loss
times the world size (``average_tokens_across_devices``: Wav2Vec2ForCTC takes ``**kwargs``, so Trainer
rescales a loss that never used ``num_items_in_batch``): about twice the single process's under torchrun.
"""

from __future__ import annotations

import signal

from toolkit_runs import Action, bad_wav_fifo, bad_wav_missing, Case, Phase, ROOT, TORCHRUN

TOOLKIT = "hf_trainer"

HF_JOB = ["{here}/hf_trainer_ctc.py", "--out", "{exp}"]
ASRLAB = str(ROOT / ".venv" / "bin" / "asrlab")

NAN_STEP = 9
KILL_STEP = 9
DATA_STEP = 10  # the step whose first item on rank 1 is the missing WAV or the FIFO
TERM_STEP = 14


def _hf(*extra, data="{data}/train/raw.list", single=False):
    return [*(["{py}"] if single else TORCHRUN), *HF_JOB, "--data", data, *extra]


def _epoch(step: int, steps_per_epoch: int = 12) -> str:
    """The 'epoch' of Trainer's log dict at a step, as ProgressCallback prints it (``f"{v:.4g}"``)."""
    return f"{step / steps_per_epoch:.4g}"


def _log_line(step: int) -> str:
    """A regex for rank 0's log dict of a step (under torchrun)."""
    return r"'epoch': '" + _epoch(step).replace(".", r"\.") + "'"


def _fault(kind, step, rank=1, **more):
    return {"FAULT": kind, "FAULT_RANK": str(rank), "FAULT_STEP": str(step), **more}


# --------------------------------------------------------------------------- what the machinery lacks


# --------------------------------------------------------------------------- the cases

_LAST = "the last log dict before the failure (Trainer prints no step: the step is its 'epoch' x 12)"

CASES = [
    Case(
        TOOLKIT,
        "healthy_single",
        [Phase(_hf(single=True))],
        {
            "what_you_did": "nothing: one process on the CPU, 24 optimizer steps (one epoch of 24 batches)",
            "verdict": "no_failure_seen",
            "culprit": None,
            "notes": "checkpoint-5 .. checkpoint-20 and checkpoint-24, each with trainer_state.json (log_history); "
            "one TensorBoard event file under runs/; the console's log dicts carry no step: their 'epoch' is "
            "step / 24 here (step 24: 'epoch': '1'); trainer_state.json and the events carry the step",
        },
        expect=[r"Total optimization steps = 24", r"'epoch': '1'\}", r"training finished: 24 steps"],
    ),
    Case(
        TOOLKIT,
        "healthy_torchrun",
        [Phase(_hf())],
        {
            "what_you_did": "nothing: 2 gloo ranks on the CPU under torchrun, 24 optimizer steps (2 epochs of 12)",
            "verdict": "no_failure_seen",
            "culprit": None,
            "notes": "only rank 0 prints and writes the event file and trainer_state.json; the console's log dicts' "
            "'epoch' is step / 12 (step 24: 'epoch': '2'); the logged loss is "
            "about twice the single process's (Trainer multiplies the loss by the world size: "
            "average_tokens_across_devices, for a model whose forward takes **kwargs)",
        },
        expect=[r"Total optimization steps = 24", r"'epoch': '2'\}", r"training finished: 24 steps"],
    ),
    Case(
        TOOLKIT,
        "nan_rank1_step9",
        [Phase(_hf(), env=_fault("nan", NAN_STEP))],
        {
            "what_you_did": f"rank 1 multiplies its loss by float('nan') at global step {NAN_STEP} (a Trainer "
            "subclass's compute_loss)",
            "verdict": "nonfinite",
            "culprit": {"rank": 1, "step": NAN_STEP},
            "log_shows": {
                "rank": None,
                "step": NAN_STEP,
                "why": "only rank 0 logs; the grad_norm it logs is all-reduced and its loss is NaN-filtered: nothing "
                f"says which rank; step {NAN_STEP} is the first with grad_norm nan ('epoch': '{_epoch(NAN_STEP)}' in "
                f"the console, step {NAN_STEP} in trainer_state.json and the events)",
            },
            "notes": "Trainer does not stop (exit 0). logging_nan_inf_filter (default True) hides the NaN loss: at "
            f"step {NAN_STEP} the logged loss is rank 0's alone, halved (finite), and from step {NAN_STEP + 1} on, "
            "with every rank's loss NaN, the logged loss is 0.0, in the console, in trainer_state.json's "
            "log_history and in the event files alike; only grad_norm shows it: nan from step "
            f"{NAN_STEP} on (console 'nan', trainer_state.json NaN, events nan). train_loss in the final "
            "metrics is finite. Nothing names rank 1. The log shows step {s} as 'epoch': '{e}' (console), step {s} "
            "in trainer_state.json and the events.".format(s=NAN_STEP, e=_epoch(NAN_STEP)),
        },
        expect=[
            _log_line(NAN_STEP - 1),
            r"'grad_norm': 'nan', 'learning_rate': '[^']*', " + _log_line(NAN_STEP),
            r"\{'loss': '0', 'grad_norm': 'nan'",
            r"training finished: 24 steps",
        ],
    ),
    Case(
        TOOLKIT,
        "raising_item_rank1_step10",
        [Phase(_hf(), env=_fault("wav", DATA_STEP, FAULT_WAV="{bad_wav}"))],
        {
            "what_you_did": f"rank 1's dataset reads a WAV that does not exist in place of the first utterance of "
            f"global step {DATA_STEP}'s batch (FAULT=wav: the rank's items are counted as asked for)",
            "verdict": "crashed",
            "culprit": {"rank": 1, "step": DATA_STEP},
            "log_shows": {
                "rank": 1,
                "step": DATA_STEP - 2,
                "why": f"what the log shows: {_LAST}; accelerate's "
                f"DataLoaderShard fetches one batch ahead, so rank 1 raises while asking for step "
                f"{DATA_STEP - 1}'s batch, before training it",
            },
            "notes": f"soundfile raises in rank 1's __getitem__ (num_workers 0), named in its [rank1]: traceback; "
            f"rank 0's last log dict is step {DATA_STEP - 2}'s ('epoch': '{_epoch(DATA_STEP - 2)}'); it then fails "
            "in Trainer's all_gather of "
            "num_items_in_batch (get_batch_samples) with 'Connection closed by peer', and torchrun names rank 1 "
            "as the root cause (exitcode 1)",
        },
        expect=[_log_line(DATA_STEP - 2), r"\[rank1\]: soundfile\.LibsndfileError: Error opening .*missing\.wav"],
        prepare=bad_wav_missing,
    ),
    Case(
        TOOLKIT,
        "sigkill_rank1_step9",
        [Phase(_hf(), env=_fault("kill", KILL_STEP))],
        {
            "what_you_did": f"rank 1 sends itself SIGKILL right after global step {KILL_STEP} was logged (a "
            "callback's on_log)",
            "verdict": "killed",
            "culprit": {"rank": 1, "step": KILL_STEP},
            "notes": f"step {KILL_STEP}'s log dict ('epoch': '{_epoch(KILL_STEP)}') is the last; rank 0 fails in "
            f"step {KILL_STEP + 1}'s all_gather "
            "of num_items_in_batch (before the forward) with 'Connection reset by peer', then torchrun SIGTERMs it "
            "and names rank 1's SIGKILL as the root cause",
        },
        expect=[_log_line(KILL_STEP), r"Signal 9 \(SIGKILL\)"],
    ),
    Case(
        TOOLKIT,
        "hang_rank1_step10_sigterm",
        [
            Phase(
                _hf(),
                env=_fault("wav", DATA_STEP, FAULT_WAV="{bad_wav}"),
                action=Action(_log_line(DATA_STEP - 2), signal.SIGTERM, 60),
                timeout_s=200,
            )
        ],
        {
            "what_you_did": f"rank 1's dataset opens a FIFO nobody writes in place of the first utterance of global "
            f"step {DATA_STEP}'s batch; ddp_timeout is Trainer's default 1800 s; SIGTERM to torchrun 60 s after "
            f"rank 0 logged step {DATA_STEP - 2}",
            "verdict": "stalled",
            "culprit": {"rank": 1, "step": DATA_STEP},
            "log_shows": {
                "rank": None,
                "step": DATA_STEP - 2,
                "why": f"what the log shows: {_LAST}; only rank 0 "
                "prints, and nothing names the hung rank: the signal's traceback is the launcher's",
            },
            "notes": f"rank 1 blocks while fetching step {DATA_STEP - 1}'s batch (DataLoaderShard reads one ahead); "
            f"rank 0 waits in step {DATA_STEP - 1}'s all_gather of num_items_in_batch; the log shows step "
            f"{DATA_STEP - 2} last ('epoch': '{_epoch(DATA_STEP - 2)}', tqdm {DATA_STEP - 2}/24); nothing is "
            "printed for 60 s, "
            "then torchrun forwards SIGTERM to both ranks and raises SignalException",
        },
        expect=[_log_line(DATA_STEP - 2), r"SIGTERM|SignalException|Signal 15"],
        prepare=bad_wav_fifo,
    ),
    Case(
        TOOLKIT,
        "sigterm_launcher_step14",
        [Phase(_hf(), action=Action(_log_line(TERM_STEP), signal.SIGTERM, 0))],
        {
            "what_you_did": f"SIGTERM to torchrun as soon as rank 0 printed the log dict of global step {TERM_STEP}",
            "verdict": "stopped",
            "culprit": {"rank": None, "step": TERM_STEP},
            "notes": "the signal went to the launcher, not a rank: torchrun forwards it to every rank and exits "
            f"with a SignalException; the log shows step {TERM_STEP} ('epoch': '{_epoch(TERM_STEP)}') last, a step "
            "more may be trained before the signal lands (see runs[0].signal)",
        },
        expect=[_log_line(TERM_STEP), r"SignalException|Signal 15|SIGTERM"],
    ),
    Case(
        TOOLKIT,
        "hang_rank1_watch",
        [
            Phase(
                [ASRLAB, "watch", "--exp", "{exp}/watch", "--stall-timeout", "30", "--on-stall", "kill", "--", *_hf()],
                env=_fault("wav", DATA_STEP, FAULT_WAV="{bad_wav}"),
                timeout_s=200,
            )
        ],
        {
            "what_you_did": f"as hang_rank1_step10_sigterm (rank 1 opens a FIFO nobody writes, data of global step "
            f"{DATA_STEP}), the same torchrun command under `asrlab watch --stall-timeout 30 --on-stall kill` "
            "(this checkout's .venv), no signal from outside",
            "verdict": "stalled",
            "culprit": {"rank": 1, "step": DATA_STEP},
            "log_shows": {
                "rank": 1,
                "step": DATA_STEP - 2,
                "why": f"what Trainer's log shows: {_LAST}; the watch's "
                "own last lines name rank 1 waiting for data in __getitem__",
            },
            "notes": "the watch (py-spy; exp/watch/: heartbeats, stall report, flight records) ends the job 30 s "
            "after the stacks stopped moving: SIGTERM to rank 1 first (the rank that held the others up), then to "
            "torchrun and rank 0. Rank 0 fails in its all_gather ('Connection closed by peer'), torchrun raises "
            "SignalException (no failure summary) and exits 1, which the watch passes through. Trainer's log "
            f"shows step {DATA_STEP - 2} last ('epoch': '{_epoch(DATA_STEP - 2)}')",
        },
        expect=[
            _log_line(DATA_STEP - 2),
            r"asrlab watch: stalled: rank 1 has waited .* for data",
            r"ending the stalled job",
        ],
        prepare=bad_wav_fifo,
    ),
]
