"""What the numerics diagnostics cost: training with them at their default sampling against without.

Same model, initial weights and in-memory batches as ``bare_step.py`` (tiny config,
2,500-frame batches, fp32 on CPU). Each run is a fresh process (a long-lived process slows down
run after run on this machine, which hid the effect in earlier versions of this script), and the
two settings alternate: ``off`` (``train.diagnostics_every=0``) and ``every=N`` (the default,
50). Reported: the median over rounds of the per-round ratio of mean step time, and, within the
``every=N`` runs, what one recorded step costs over the median of the others, which gives the
same number without the between-process noise: ``excess / (N * median step)``.

    .venv/bin/python benchmarks/diagnostics_overhead.py data/corpus/train/data.list [--steps 100] [--rounds 3]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile


def one_run(data: str, every: int, steps: int) -> list[float]:
    """Train ``steps`` in-memory batches (after one untimed step); the step times (s) from the metrics."""
    import itertools

    import torch

    from asrlab.config import load_config
    from asrlab.lab.dist import DistInfo
    from asrlab.lab.metrics import read_metrics
    from asrlab.train.trainer import Trainer

    cfg = load_config("tiny", ["train.progress=false", "data.num_workers=0", f"train.diagnostics_every={every}"])
    with tempfile.TemporaryDirectory() as tmp:
        tr = Trainer(cfg, data, None, tmp, DistInfo(0, 1, 0, torch.device("cpu"), None))
        batches = list(itertools.islice(iter(tr.loader), steps + 1))
        tr.train_epoch(iter(batches))
        tr.close()
        return [r["step_s"] for r in read_metrics(tmp)][1:]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # internal: one run, JSON out
    a = p.parse_args()
    if a.one is not None:
        print(json.dumps(one_run(a.data, a.one, a.steps)))
        return

    def run(every):
        out = subprocess.run(
            [sys.executable, __file__, a.data, "--steps", str(a.steps), "--one", str(every)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return json.loads(out.strip().splitlines()[-1])

    means = {"off": [], "on": []}
    excess, typical = [], []
    for r in range(a.rounds):
        order = [("off", 0), ("on", a.every)] if r % 2 == 0 else [("on", a.every), ("off", 0)]
        for name, every in order:
            s = run(every)  # s[i] is step i + 2 (step 1 untimed)
            means[name].append(statistics.mean(s))
            if every:
                sampled = [x for i, x in enumerate(s) if (i + 2) % every == 0]
                rest = statistics.median(x for i, x in enumerate(s) if (i + 2) % every)
                excess += [x - rest for x in sampled]
                typical.append(rest)
        print(
            f"round {r + 1}: mean step off {means['off'][-1]:.4f} s, every={a.every} {means['on'][-1]:.4f} s",
            flush=True,
        )
    ratio = statistics.median(on / off - 1 for on, off in zip(means["on"], means["off"]))
    cost = statistics.median(excess)
    step = statistics.median(typical)
    print(
        f"between runs ({a.rounds} rounds of {a.steps} steps, alternating): median cost at every={a.every}: "
        f"{100 * ratio:+.2f}% time per step"
    )
    print(
        f"within the every={a.every} runs: a recorded step costs {cost:.3f} s more than the median step "
        f"({step:.3f} s), i.e. {100 * cost / step:.0f}% once; at every={a.every}: "
        f"{100 * cost / (a.every * step):+.2f}% time per step"
    )


if __name__ == "__main__":
    main()
