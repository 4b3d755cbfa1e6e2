"""A DataLoader with two forked workers and nothing of asrlab, for the watched-run tests: each worker prints
the files of the watch's stack-dump folder (``ASRLAB_WATCH_DIR``) it holds open, as ``worker PID holds
[NAMES]``; then the loop prints the sum of its batches."""

import os

from torch.utils.data import DataLoader


def held(_):
    folder = os.environ.get("ASRLAB_WATCH_DIR", "")
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if folder and target.startswith(folder):
            names.append(os.path.basename(target))
    print(f"worker {os.getpid()} holds {sorted(names)}", flush=True)


if __name__ == "__main__":
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=2, worker_init_fn=held)
    print("sum", sum(int(b.sum()) for b in loader), flush=True)
