"""What the numerics diagnostics cost: trainer steps/s with them off, idle, and recording.

Same model, initial weights and in-memory batches as ``trainer_overhead.py`` (tiny config,
2,500-frame batches, fp32 on CPU). Three variants, alternating within each round:

* ``off``: ``train.diagnostics_every=0``,
* ``idle``: diagnostics on but never due (between two samples there are no hooks: this should
  measure the same as ``off``),
* ``every step``: statistics recorded on every step (what one sampled step costs),

and, separately, end to end at the default sampling (``--every``, 50) against ``off`` over
``2 * every`` steps (which one runs first alternates between rounds). The time per step at sampling N is ``idle + (every step - idle) / N``.

    .venv/bin/python benchmarks/diagnostics_overhead.py data/corpus/train/data.list [--steps 20] [--rounds 5]
"""

import argparse
import itertools
import statistics
import tempfile

import torch

from asrlab.config import load_config, replace_section
from asrlab.train.dist import DistInfo
from asrlab.train.trainer import Trainer
from trainer_overhead import trainer_loop


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--every", type=int, default=50, help="the default sampling, measured end to end")
    p.add_argument("--end-to-end-rounds", type=int, default=3)
    a = p.parse_args()
    cfg = load_config("tiny", ["train.progress=false", "data.num_workers=0"])
    variants = {"off": 0, "idle": 10 ** 9, "every step": 1}
    with tempfile.TemporaryDirectory() as tmp:
        probe = Trainer(cfg, a.data, None, f"{tmp}/probe", DistInfo(0, 1, 0, torch.device("cpu"), None))
        batches = list(itertools.islice(iter(probe.loader), max(a.steps, 2 * a.every) + 1))
        state = {k: v.clone() for k, v in probe.model.state_dict().items()}
        probe.close()
        rates = {v: [] for v in variants}
        for r in range(a.rounds):
            for name, every in variants.items():
                c = replace_section(cfg, "train", diagnostics_every=every)
                rates[name].append(trainer_loop(c, a.data, batches[:a.steps + 1], state, f"{tmp}/{name}{r}"))
            print(f"round {r + 1}: " + ", ".join(f"{n} {rates[n][-1]:.3f}" for n in variants) + " steps/s", flush=True)
        med = {n: statistics.median(v) for n, v in rates.items()}
        print("median steps/s: " + ", ".join(f"{n} {v:.3f}" for n, v in med.items()))
        t = {n: 1 / v for n, v in med.items()}  # s per step
        at_n = (t["idle"] + (t["every step"] - t["idle"]) / a.every) / t["off"] - 1
        print(f"idle hooks: {100 * (t['idle'] / t['off'] - 1):+.2f}% time per step; a recorded step: "
              f"+{t['every step'] - t['off']:.3f} s ({100 * (t['every step'] / t['off'] - 1):+.0f}%); "
              f"so at every={a.every}: {100 * at_n:+.2f}% time per step")
        e2e = {"off": [], f"every={a.every}": []}
        for r in range(a.end_to_end_rounds):
            pair = [("off", 0), (f"every={a.every}", a.every)]
            for name, every in pair if r % 2 == 0 else pair[::-1]:  # alternate which runs first
                c = replace_section(cfg, "train", diagnostics_every=every)
                e2e[name].append(trainer_loop(c, a.data, batches[:2 * a.every + 1], state, f"{tmp}/e2e{name}{r}"))
            print(f"end to end, round {r + 1} ({2 * a.every} steps): " +
                  ", ".join(f"{n} {v[-1]:.3f}" for n, v in e2e.items()) + " steps/s", flush=True)
        slower = statistics.median(o / d - 1 for o, d in zip(*e2e.values()))
        print(f"end to end over {a.end_to_end_rounds} rounds: median per-round cost at every={a.every}: "
              f"{100 * slower:+.2f}% time per step")


if __name__ == "__main__":
    main()
