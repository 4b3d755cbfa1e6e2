"""``asrlab train`` (one process, or N ranks under torchrun) and ``asrlab stop``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..lab import layout
from ..errors import UsageError
from .args import command


_LAUNCHER_FLAGS = ("--nproc", "--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-id", "--max-restarts")


def _strip_launcher(argv: list[str]) -> list[str]:
    """``argv`` without the flags the launcher gives torchrun (the ranks' arguments)."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in _LAUNCHER_FLAGS:
            skip = True
        elif not x.startswith(tuple(f + "=" for f in _LAUNCHER_FLAGS)):
            out.append(x)
    return out


def cmd_train(a: argparse.Namespace) -> int:
    from ..config import load_config
    from ..train import launch

    flags = [
        f"train.{k}={v}"
        for k, v in (
            ("max_steps", a.max_steps),
            ("save_every_steps", a.save_every_steps),
            ("precision", a.precision),
            ("max_minutes", a.max_minutes),
            ("uneven", a.uneven),
            ("stall_timeout_s", a.stall_timeout),
            ("backend", a.backend),
            ("nonfinite", a.nonfinite),
            ("ledger", a.ledger or None),
        )
        if v is not None
    ]
    cfg = load_config(a.config, flags + a.overrides)  # a bad key fails here, before any rank starts
    nodes = None
    if a.nnodes > 1 or a.rdzv_endpoint:
        if not a.rdzv_endpoint:
            raise UsageError("--nnodes needs --rdzv-endpoint HOST:PORT: where the first node's agent listens")
        nodes = launch.Nodes(a.nnodes, a.node_rank, a.rdzv_endpoint, a.rdzv_id)
    if (a.nproc > 1 or nodes is not None or a.max_restarts) and not launch.under_torchrun():
        return launch.launch(
            a.nproc,
            _strip_launcher(a.argv[a.argv.index("train") + 1 :]),
            a.exp,
            cfg.train.stall_timeout_s,
            cfg.train.first_step_timeout_s,
            nodes=nodes,
            max_restarts=a.max_restarts,
        )
    if launch.under_torchrun():
        launch.settle_rank()
    try:
        return _train_here(a, cfg)
    except Exception as e:
        if not launch.under_torchrun():
            raise
        from ..lab import record_rank_error

        record_rank_error(a.exp, e)
        if not os.environ.get(launch.QUIET_ENV):  # a torchrun of the user's own: each rank says it
            raise
        return 2 if isinstance(e, (UsageError, FileNotFoundError)) else 1  # the launcher says it once


def _train_here(a: argparse.Namespace, cfg) -> int:
    """This process's part of ``asrlab train``: alone, or one rank under torchrun."""
    from ..data.sources import load_data, load_sources

    load_data(a.data)  # a missing or empty list is an error before anything starts
    if a.cv:
        load_sources(a.cv)
    from ..lab import HALT_EXIT, NonFiniteHalt
    from ..lab import stop_on_signals, stop_signal
    from ..train.launch import under_torchrun
    from ..train.trainer import run

    with stop_on_signals():  # SIGTERM, SIGINT: a clean stop, as EXP/STOP
        try:
            result = run(cfg, a.data, a.cv, a.exp, resume=a.resume)
        except NonFiniteHalt as e:
            print(f"training halted: {e}", file=sys.stderr)
            return HALT_EXIT
        sig = stop_signal()
    if sig is not None:
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"asrlab train: stopped on {sig.name}; checkpoint in {a.exp}", file=sys.stderr)
        return 0 if under_torchrun() else 128 + sig  # a rank's non-zero code is a failure to torch elastic
    if result and int(os.environ.get("RANK", "0")) == 0:
        print(
            f"cv: loss {result['loss']:.4f}, CER {100 * result['cer']:.2f}%, WER {100 * result['wer']:.2f}% "
            f"({result['utts']} utterances)"
        )
    return 0


def cmd_stop(a: argparse.Namespace) -> int:
    from ..lab import request_stop

    if not (Path(a.exp) / layout.METRICS).is_dir():
        raise FileNotFoundError(f"{a.exp}: no run there (no metrics/ folder)")
    path = request_stop(a.exp, "asrlab stop")
    print(f"asked the run in {a.exp} to stop after its current step ({path}); it writes a checkpoint and exits 0")
    return 0


def add_commands(sub) -> None:
    """The parsers of train, stop."""
    t = command(
        sub,
        "train",
        "Train a speech recognizer on your data lists, in one process or on N GPUs "
        "(--nproc N), with checkpoints, resume and stall and NaN guards.",
    )
    t.add_argument("--config", default="tiny", help="shipped config name (tiny, base) or a YAML path")
    t.add_argument(
        "--data",
        required=True,
        action="append",
        help="training data.list (shard or raw), Kaldi dir or NeMo manifest; given several times, "
        "the corpora are mixed: [NAME=]LIST[:WEIGHT] each (drawn by weight, every utterance "
        "once an epoch)",
    )
    t.add_argument("--cv", help="validation data.list, evaluated at epoch ends")
    t.add_argument("--exp", required=True, help="experiment dir: checkpoints, metrics, units.txt, config.yaml")
    t.add_argument("--nproc", type=int, default=1, help="local ranks; >1 starts torchrun (gloo on CPU, nccl on GPUs)")
    t.add_argument(
        "--nnodes",
        type=int,
        default=1,
        help="nodes of the job (the same command on each; torchrun's rendezvous at --rdzv-endpoint)",
    )
    t.add_argument(
        "--node-rank",
        type=int,
        help="this node's rank, 0 to nnodes-1 (SLURM_NODEID); without it "
        "the nodes are ranked as they join (torchrun's c10d rendezvous)",
    )
    t.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="the first node's address and a free port")
    t.add_argument("--rdzv-id", help="the job's id, the same on every node (SLURM_JOB_ID)")
    t.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="torch elastic restarts of every rank after a failure (each resumes from the last checkpoint)",
    )
    t.add_argument(
        "--precision",
        choices=["auto", "fp32", "fp16", "bf16"],
        help="number format of the training (default from the config; auto: bf16 or fp16 on a GPU "
        "that has it, fp32 on the CPU)",
    )
    t.add_argument("--max-steps", type=int, help="stop after this many optimizer steps")
    t.add_argument("--max-minutes", type=float, help="stop (with a checkpoint) after this many minutes of training")
    t.add_argument("--save-every-steps", type=int, help="write a checkpoint every N steps")
    t.add_argument(
        "--uneven",
        choices=["stop", "join", "none"],
        help="ranks with unequal data: stop together (default), DDP Join, or unprotected",
    )
    t.add_argument(
        "--ledger",
        action="store_true",
        help="write the utterance keys of every step to EXP/ledger/rank{R}.jsonl (to check coverage)",
    )
    t.add_argument(
        "--nonfinite",
        choices=["skip", "rollback", "halt"],
        help="a step whose loss or gradients are not finite: skip and count it (default), roll back "
        "to the last checkpoint with a lower LR, or halt (exit 4) with a report",
    )
    t.add_argument(
        "--stall-timeout",
        type=float,
        metavar="S",
        help="seconds without progress on any rank before the stall report and exit (0: off)",
    )
    t.add_argument(
        "--backend", choices=["auto", "nccl", "gloo"], help="how ranks talk (auto: nccl on GPUs, gloo on CPU)"
    )
    t.add_argument(
        "--resume",
        choices=["auto", "none"],
        default="auto",
        help="auto: continue from the newest complete checkpoint in EXP",
    )
    t.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. optim.lr=0.002")
    t.set_defaults(func=cmd_train)

    st = command(
        sub,
        "stop",
        "Ask a running training to stop cleanly after its current step (it writes a checkpoint and exits 0).",
    )
    st.add_argument("exp", help="the run's experiment folder (what asrlab train got as --exp)")
    st.set_defaults(func=cmd_stop)
