"""Resume seeks, it does not replay: time to the first batch after resuming at 10% and at 90% of an epoch,
against replaying the epoch up to the same position (``asrlab.measure.resume_time``).

    .venv/bin/python benchmarks/resume_time.py data/corpus/train/data.list [--at 0.1,0.9] [--repeat 3] [KEY=VALUE ...]
"""

import argparse
import logging
import tempfile

from asrlab.config import load_config
from asrlab.measure.resume_time import resume_times


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--at", default="0.1,0.9", help="positions in the epoch (fractions of its batches)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--config", default="tiny")
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. data.num_workers=1")
    a = p.parse_args()
    logging.disable(logging.INFO)
    cfg = load_config(a.config, a.overrides)

    def show(r):
        print(
            f"at {100 * r['fraction']:.0f}% of the epoch (after batch {r['batch']}): resume {r['resume_s']:.2f} s, "
            f"replay {r['replay_s']:.2f} s (best of {a.repeat}; the next batch is the same either way)",
            flush=True,
        )

    with tempfile.TemporaryDirectory() as tmp:
        out = resume_times(cfg, a.data, [float(x) for x in a.at.split(",")], tmp, a.repeat, progress=show)
    print(
        f"epoch 0: {out['batches']} batches; reading all of them (decode + fbank, {cfg.data.num_workers} "
        f"worker(s)) took {out['epoch_read_s']:.1f} s"
    )


if __name__ == "__main__":
    main()
