"""Does ``torch.compile`` make the tiny model's training step faster on this CPU?

Usage: .venv/bin/python benchmarks/compile_cpu.py [--limit SECONDS]

Each mode (eager, then ``torch.compile(dynamic=True)``) runs in its own process under a time limit:
5 warm-up steps (compilation happens here), then 30 timed steps, fp32 on 2 threads, on random batches
of the loader's shape (at most 2,500 frames of 80 mel bins, 120-320 frames per utterance, a new length
every step, as the loader's batches have). Prints seconds for the first 5 steps and seconds per step
after, or that the limit ended it. Output of the run quoted in docs/recognition.md: benchmarks/compile_cpu.txt.
"""

import argparse
import os
import random
import signal
import subprocess
import sys
import time


def child(mode: str) -> None:
    import torch

    from asrlab.config import load_config
    from asrlab.model import ConformerCTC, mean_ctc_loss

    torch.set_num_threads(2)
    torch.manual_seed(0)
    random.seed(0)
    model = ConformerCTC(load_config("tiny").model, 40)
    opt = torch.optim.AdamW(model.parameters(), 2e-3)
    forward = model if mode == "eager" else torch.compile(model, dynamic=True)

    def step():
        t = random.randint(120, 320)
        b = max(1, 2500 // t)
        x, lens = torch.randn(b, t, 80), torch.full((b,), t)
        lens[0] = t - 7
        y, ylens = torch.randint(1, 40, (b, t // 8)), torch.full((b,), t // 8)
        logp, out_lens = forward(x, lens)
        loss, _ = mean_ctc_loss(logp, out_lens, y, ylens)
        opt.zero_grad()
        loss.backward()
        opt.step()

    t0 = time.perf_counter()
    for _ in range(5):
        step()
    print(f"{mode}: first 5 steps {time.perf_counter() - t0:.1f} s", flush=True)
    t0 = time.perf_counter()
    for _ in range(30):
        step()
    print(f"{mode}: then {(time.perf_counter() - t0) / 30:.3f} s per step (30 steps)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=600, help="seconds each mode may take")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child)
    import torch

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads available, limit {a.limit:.0f} s per mode",
        flush=True,
    )
    for mode in ("eager", "compile"):
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, __file__, "--child", mode], start_new_session=True)
        try:
            proc.wait(timeout=a.limit)
        except subprocess.TimeoutExpired:  # the compiler's worker processes too: the whole session
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            print(f"{mode}: stopped by the limit after {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
