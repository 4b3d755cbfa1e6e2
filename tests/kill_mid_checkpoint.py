"""``python tests/kill_mid_checkpoint.py STEP ARGS...``: ``asrlab ARGS`` (a one-process run), SIGKILLed halfway
through writing the checkpoint of step STEP: a crash in the middle of a checkpoint write, injected from
outside the package."""

import os
import signal
import sys

from asrlab.cli import main
from asrlab.lab.state import checkpoint

STEP = int(sys.argv[1])
_save = checkpoint.save_checkpoint


def save_then_die(ckpt_dir, state, step, info, keep_last=0, on_write=None):
    if step != STEP:
        return _save(ckpt_dir, state, step, info, keep_last, on_write)
    chunks = [0]

    def tick():
        chunks[0] += 1
        if chunks[0] == 2:  # some bytes are in the temporary file, not all
            os.kill(os.getpid(), signal.SIGKILL)
        if on_write is not None:
            on_write()

    return _save(ckpt_dir, state, step, info, keep_last, tick)


checkpoint.save_checkpoint = save_then_die
sys.exit(main(sys.argv[2:]))
