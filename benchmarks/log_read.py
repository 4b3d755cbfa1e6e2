"""How fast ``asrlab doctor LOG`` reads a large log, against ``grep -c`` and a plain Python loop over the
same file's lines, and how much memory it takes, on two logs of SIZE_MB (default 1024) each:

- "step lines only": the log an 8-rank WeNet run writes (train_utils' step line per rank, an INFO line now
  and then, one non-finite step near the middle, a rank's traceback and torchrun's summary at the end);
- "mixed (failing run)": a failing run's worst case, built by repeating real excerpts (the fixtures under
  tests/fixtures/logs*/): WeNet's, icefall's and ESPnet's step lines of 8 ranks, a Python traceback every
  ~40 lines (WeNet's assertion, CUDA out of memory, a DataLoader worker killed), NCCL watchdog timeouts,
  NaN lines and non-finite step lines among the steps, torchrun's failure summary now and then; the
  timestamps, step counters, pids and sizes change from one copy to the next.

Each reader runs on one core (taskset); its wall and CPU time are the best of ROUNDS, its peak RSS is the
child's own (``wait4``'s ru_maxrss), beside the doctor's RSS on a 1 MiB log of the same kind (the baseline:
what the interpreter and the imports take). Run it with nothing else busy.

    .venv/bin/python benchmarks/log_read.py [--size-mb 1024] [--rounds 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TAIL = """[rank1]:Traceback (most recent call last):
[rank1]:  File "wenet/bin/train.py", line 290, in main
[rank1]:    executor.train(model, optimizer, scheduler, train_data_loader, cv_data_loader, writer, configs, scaler, group_join)
[rank1]:  File "wenet/dataset/processor.py", line 82, in parse_url
[rank1]:    assert 'src' in sample
[rank1]:AssertionError
E1125 10:00:05.000000 100 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 1 (pid: 1235) of binary: /usr/bin/python
Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_10:00:05
  host      : node0
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 1235)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def write_log(path: Path, size_mb: float) -> int:
    """The step-line-only log (an 8-rank WeNet run): its number of lines."""
    rng = random.Random(0)
    target, batch, lines = int(size_mb * (1 << 20)), 0, 0
    nan_at = target // 2
    with open(path, "w") as f:
        while f.tell() < target:
            batch += 1
            for rank in range(8):
                loss = rng.uniform(20, 90)
                ctc = "inf" if nan_at and f.tell() > nan_at and rank == 3 else f"{loss * 1.2:.6f}"
                if ctc == "inf":
                    nan_at = 0
                f.write(
                    f"2026-11-25 09:{batch // 60000 % 60:02d}:{batch // 1000 % 60:02d},{batch % 1000:03d} DEBUG "
                    f"TRAIN | steps/sec 1.734| Batch 3/{batch} loss {loss:.6f} loss_att {loss * 0.9:.6f} "
                    f"loss_ctc {ctc} th_accuracy {rng.random():.6f} lr 0.00100000 grad_norm {rng.uniform(1, 9):.6f} "
                    f"rank {rank}\n"
                )
                lines += 1
            if batch % 500 == 0:
                f.write(f"2026-11-25 09:00:00,000 INFO Checkpoint: save to checkpoint exp/{batch}.pt\n")
                lines += 1
        f.write(TAIL)
    return lines + TAIL.count("\n")


# --- the mixed log: real excerpts, each as its toolkit or PyTorch printed it (the fixture it comes from) ---

# wenet/healthy_executor_multi_rank.log, train_utils' form (wenet/cuda_oom_gpu1.log's run)
WENET_STEP = (
    "{ts} DEBUG TRAIN | steps/sec 1.734| Batch {epoch}/{batch} loss {loss:.6f} loss_att {att:.6f} loss_ctc {ctc} "
    "th_accuracy {acc:.6f} lr 0.00100000 grad_norm {gn:.6f} rank {rank}"
)
# icefall/healthy_conv_emformer_8gpu.log; icefall/nan_inf_losses_all_ranks_mpirun.log (the non-finite one)
ICEFALL_STEP = (
    "{ts} INFO [train.py:907] ({rank}/8) Epoch {epoch}, batch {batch}, loss[loss={loss}, simple_loss={att:.4g}, "
    "pruned_loss={ctc:.4g}, over {frames:.2f} frames. ], tot_loss[loss={acc:.4g}, simple_loss=0.2714, "
    "pruned_loss=0.08219, over 177822.05 frames. ], batch size: {bs}, lr: 3.41e-04"
)
# espnet/healthy_espnet2_two_gpu_interval_reports.log
ESPNET_STEP = (
    "[gpu01:{rank}/8] {ts} (trainer:464) INFO: {epoch}epoch:train:{first}-{batch}batch: iter_time=2.878e-04, "
    "forward_time=0.134, loss={loss}, loss_att={att:.3f}, loss_ctc={ctc:.3f}, acc={acc:.3f}, backward_time=0.111, "
    "optim_step_time=0.030, lr_0=3.460e-06, train_time=1.816"
)
# a Python traceback every ~40 lines, one rank's, through torchrun's [rankN]: prefix
TRACEBACKS = (
    # the benchmark's own WeNet run (TAIL above)
    """[rank{rank}]:Traceback (most recent call last):
[rank{rank}]:  File "wenet/bin/train.py", line 290, in main
[rank{rank}]:    executor.train(model, optimizer, scheduler, train_data_loader, cv_data_loader, writer, configs, scaler, group_join)
[rank{rank}]:  File "wenet/dataset/processor.py", line 82, in parse_url
[rank{rank}]:    assert 'src' in sample
[rank{rank}]:AssertionError
""",
    # plain/cuda_oom_new_wording_total_capacty.log
    """[rank{rank}]:Traceback (most recent call last):
[rank{rank}]:  File "wenet/bin/train.py", line 290, in main
[rank{rank}]:    executor.train(model, optimizer, scheduler, train_data_loader, cv_data_loader, writer, configs, scaler, group_join)
[rank{rank}]:  File "/opt/conda/lib/python3.10/site-packages/torch/nn/modules/linear.py", line 114, in forward
[rank{rank}]:    return F.linear(input, self.weight, self.bias)
[rank{rank}]:torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate {mib}.00 MiB. GPU {rank} has a total capacty of 14.75 GiB of which 235.06 MiB is free. Process {pid} has 14.52 GiB memory in use. Of the allocated memory 14.06 GiB is allocated by PyTorch, and 330.42 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting max_split_size_mb to avoid fragmentation
""",
    # plain/dataloader_worker_killed_chained.log
    """[rank{rank}]:Traceback (most recent call last):
[rank{rank}]:  File "/opt/conda/lib/python3.8/site-packages/torch/utils/data/dataloader.py", line 1133, in _try_get_data
[rank{rank}]:    data = self._data_queue.get(timeout=timeout)
[rank{rank}]:  File "/opt/conda/lib/python3.8/site-packages/torch/utils/data/_utils/signal_handling.py", line 66, in handler
[rank{rank}]:    _error_if_any_worker_fails()
[rank{rank}]:RuntimeError: DataLoader worker (pid {pid}) is killed by signal: Killed.
[rank{rank}]:
[rank{rank}]:The above exception was the direct cause of the following exception:
[rank{rank}]:
[rank{rank}]:Traceback (most recent call last):
[rank{rank}]:  File "wenet/bin/train.py", line 290, in main
[rank{rank}]:    executor.train(model, optimizer, scheduler, train_data_loader, cv_data_loader, writer, configs, scaler, group_join)
[rank{rank}]:  File "/opt/conda/lib/python3.8/site-packages/torch/utils/data/dataloader.py", line 1146, in _try_get_data
[rank{rank}]:    raise RuntimeError(f'DataLoader worker (pid(s) {{pids_str}}) exited unexpectedly') from e
[rank{rank}]:RuntimeError: DataLoader worker (pid(s) {pid}) exited unexpectedly
""",
)
# torchrun/nccl_watchdog_alltoall_rank_prefix.log
WATCHDOG = """[rank{rank}]:[E{md} {hms}.858931807 ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLTOALL, NumelIn=46684160, NumelOut=46684160, Timeout(ms)=600000) ran for 600013 milliseconds before timing out.
[rank{rank}]:[E{md} {hms}.861967180 ProcessGroupNCCL.cpp:1785] [PG ID 2 PG GUID 9 Rank {rank}] Exception (either an error or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {seq3}, last completed NCCL work: {seq1}.
"""
# wenet/old_executor_loss_inf_loss_ctc_inf.log; espnet/grad_norm_nan_skipping.log
NAN_LINES = """{ts} WARNING NaN or Inf found in input tensor.
[gpu01:{rank}/8] {ts} (trainer:581) WARNING: The grad norm is nan. Skipping updating the model.
"""
# torchrun/elastic_local_rank2_exitcode1.log, torchrun/root_cause_sigkill_rank7.log (the benchmark's own TAIL)
TORCHRUN = """W{md} {hms}.000000 100 torch/distributed/elastic/multiprocessing/api.py:897] Sending process {pid2} closing signal SIGTERM
E{md} {hms}.000000 100 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: {rank} (pid: {pid}) of binary: /usr/bin/python
Root Cause (first observed failure):
[0]:
  time      : {day}_{hms}
  host      : node0
  rank      : {rank} (local_rank: {rank})
  exitcode  : 1 (pid: {pid})
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


class _Clock:
    """The mixed log's time: 20 ms a line, written as each toolkit stamps it."""

    def __init__(self):
        self.ms = 0

    def tick(self) -> None:
        self.ms += 20

    def parts(self) -> tuple[str, str, str]:
        s = self.ms // 1000
        day = 1 + s // 86400 % 28
        hms = f"{s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}"
        return f"2026-11-{day:02d}", hms, f"11{day:02d}"

    def ts(self) -> str:
        date, hms, _ = self.parts()
        return f"{date} {hms},{self.ms % 1000:03d}"


def write_mixed(path: Path, size_mb: float, seed: int = 0, quiet_mb: float = 0) -> int:
    """The failing run's log of real excerpts (module docstring): its number of lines. Its first
    ``quiet_mb`` MiB hold step lines only (a run that fails late)."""
    rng = random.Random(seed)
    clock = _Clock()
    target, lines, episode, batch, pid = int(size_mb * (1 << 20)), 0, 0, 0, 4000
    with open(path, "w") as f:
        while f.tell() < target:
            episode += 1
            kit = ("wenet", "icefall", "espnet")[episode // 3 % 3]  # a few episodes of one toolkit, then the next
            out = []
            quiet = f.tell() < quiet_mb * (1 << 20)
            # ~32 step lines (4 batches of 8 ranks; one step counter, whatever the toolkit that prints it),
            # a non-finite one now and then; between them a rank's traceback, a timeout, NaN lines, torchrun
            nan_step = rng.randrange(32) if episode % 5 == 0 and not quiet else -1
            for i in range(32):
                rank = i % 8
                if rank == 0:
                    batch += 1
                clock.tick()
                loss = rng.uniform(20, 90)
                bad = i == nan_step
                v = dict(
                    ts=clock.ts(),
                    epoch=3,
                    batch=batch * 100,
                    first=batch * 100 - 99,
                    rank=rank,
                    att=loss * 0.9,
                    acc=rng.random(),
                    gn=rng.uniform(1, 9),
                    frames=rng.uniform(300, 700),
                    bs=rng.randrange(8, 60),
                )
                if kit == "wenet":
                    out.append(WENET_STEP.format(loss=loss, ctc="inf" if bad else f"{loss * 1.2:.6f}", **v))
                elif kit == "icefall":
                    out.append(ICEFALL_STEP.format(loss="nan" if bad else f"{loss / 100:.4g}", ctc=loss / 300, **v))
                else:
                    out.append(ESPNET_STEP.format(loss="nan" if bad else f"{loss:.3f}", ctc=loss * 1.2, **v))
                date, hms, md = clock.parts()
                if quiet:
                    continue
                if i == 12:  # a rank's traceback, every episode
                    pid += 1
                    r = rng.randrange(8)
                    out.append(
                        TRACEBACKS[episode % len(TRACEBACKS)]
                        .format(rank=r, pid=pid, mib=rng.choice((496, 1024, 2048, 160)))
                        .rstrip("\n")
                    )
                elif i == 18 and episode % 2 == 0:  # an NCCL timeout
                    seq = 4000 + episode
                    out.append(
                        WATCHDOG.format(
                            rank=rng.randrange(8), md=md, hms=hms, seq=seq, seq3=seq + 3, seq1=seq - 1
                        ).rstrip("\n")
                    )
                elif i == 23 and episode % 3 == 0:  # NaN warnings
                    out.append(NAN_LINES.format(ts=clock.ts(), rank=rng.randrange(8)).rstrip("\n"))
                elif i == 28 and episode % 7 == 0:  # torchrun's summary of a failed rank
                    out.append(TORCHRUN.format(md=md, hms=hms, day=date, rank=r, pid=pid, pid2=pid + 1).rstrip("\n"))
            text = "\n".join(out) + "\n"
            lines += text.count("\n")
            f.write(text)
    return lines


def measure(cmd: list[str]) -> tuple[float, float, float, str]:
    """(wall s, CPU s, peak RSS MB of this child alone, its output's last line)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = p.stdout.read().strip().splitlines()
    _, _, ru = os.wait4(p.pid, 0)
    p.returncode = 0  # reaped here, not by Popen
    wall = time.perf_counter() - t0
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, out[-1] if out else ""


DOCTOR = """
import sys, time
from asrlab.doctor import diagnose_logs
t0 = time.perf_counter()
d = diagnose_logs([sys.argv[1]])
ev = ", ".join(f"{k} {v}" for k, v in sorted(d["events"].items()))
print(f"{time.perf_counter() - t0:.2f} s reading; {d['verdict']}: {d['summary'][:150]} || culprit {d['culprit']}; events: {ev}")
"""
LOOP = """
import sys
n = 0
with open(sys.argv[1], "rb") as f:
    for line in f:
        if b"loss" in line:
            n += 1
print(n)
"""


def pinned(cmd: list[str]) -> list[str]:
    return ["taskset", "-c", "0", *cmd] if os.path.exists("/usr/bin/taskset") else cmd


def bench(tag: str, label: str, write, folder: Path, size_mb: int, rounds: int) -> None:
    path, base_path = folder / f"{tag}.log", folder / f"{tag}-1mib.log"
    t0 = time.perf_counter()
    lines = write(path, size_mb)
    size = path.stat().st_size
    write(base_path, 1)
    py = sys.executable
    base = min((measure(pinned([py, "-c", DOCTOR, str(base_path)])) for _ in range(rounds)), key=lambda r: r[2])
    print(
        f"== {label}: {size / 2**20:.0f} MiB, {lines} lines (written in {time.perf_counter() - t0:.0f} s); "
        f"the doctor's peak RSS on 1 MiB of the same: {base[2]:.0f} MB"
    )
    grep = None
    for name, cmd in (
        ("grep -c loss", ["grep", "-c", "loss", str(path)]),
        ("python loop over lines", [py, "-c", LOOP, str(path)]),
        ("asrlab doctor (read + verdict)", [py, "-c", DOCTOR, str(path)]),
    ):
        runs = [measure(pinned(cmd)) for _ in range(rounds)]
        best = min(runs, key=lambda r: r[0])
        grep = grep or best
        print(
            f"  {name:31s} wall {best[0]:6.2f} s (best of {rounds}), CPU {best[1]:6.2f} s, "
            f"{size / 2**20 / best[0]:5.0f} MiB/s, {best[0] / grep[0]:5.2f}x grep's wall "
            f"({best[1] / grep[1]:5.2f}x its CPU), peak RSS {best[2]:4.0f} MB"
            + (f" ({best[2] - base[2]:+.0f} MB over 1 MiB's)" if name.startswith("asrlab") else "")
        )
    print(f"  verdict: {best[3][:700]}")
    path.unlink()
    base_path.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--keep", help="write the logs in this folder (they are removed after each is timed)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=("steps", "mixed"), help="one of the two logs")
    a = ap.parse_args()
    folder = Path(a.keep) if a.keep else Path(tempfile.mkdtemp())
    folder.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start; each reader pinned to one")
    if a.only != "mixed":
        bench("steps", "step lines only (an 8-rank WeNet run)", write_log, folder, a.size_mb, a.rounds)
    if a.only != "steps":
        label = "mixed (failing run: WeNet, icefall, ESPnet steps, a traceback every ~40 lines, NaN, timeouts)"
        bench("mixed", label, write_mixed, folder, a.size_mb, a.rounds)


if __name__ == "__main__":
    main()
