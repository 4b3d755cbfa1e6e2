"""One rank of ``asrlab train --nproc N``, as the launcher's agent starts it: forked from a process that has
imported torch and the trainer (see ``launch.WARM``), it runs ``asrlab train`` with the arguments torchrun gives.

A rank that ends well hands torch elastic its result and then waits for the agent to have every rank's, which an
agent that is itself stopping (on a signal, on another rank's failure) never has: the rank leaves soon after, its
result already in the agent's pipe."""

import os
import sys
import threading
import time

from asrlab.cli import main


def _leave(after_s: float = 2.0) -> None:
    time.sleep(after_s)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


code = main()
if not code:
    threading.Thread(target=_leave, daemon=True).start()
sys.exit(code)
