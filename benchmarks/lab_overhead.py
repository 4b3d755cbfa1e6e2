"""What asrlab.lab's parts cost a training loop, side by side with the bare loop, in one run.

Two gloo ranks (torch.multiprocessing on 127.0.0.1, one compute thread each: this machine's two
cores) train asrlab's tiny ConformerCTC (2.1M parameters, 133 modules, the model asrlab ships for
2 CPU cores) under DDP, fp32, on in-memory batches of ``--batch`` utterances x ``--frames`` fbank
frames per rank (default 3 x 128: a step of about 90 ms here, the range of asrlab's GPU steps,
28 ms for ``tiny`` to 76 ms for ``base`` on an H100, docs/gpu.md; the parts cost a fixed amount
per step, so a shorter step exaggerates them and the tiny config's own 0.26 s step would hide them).
Six variants of one loop, each with its own copy of the model (same initial weights), optimizer,
batch iterator and parts:

  bare      examples/bare_loop.py's step: forward, CTC, backward (DDP's all-reduce), scaler.step,
            scaler.update, zero_grad (the scaler disabled: fp32)
  bare2     the same again: an A/A control (what two copies of one loop differ by: the resolution)
  watch     + StallWatch(timeout_s=60): batches through ``watch.data(...)`` (two heartbeat phases per
            step); its watchdog thread (a file written and read once a second)
  uneven    + UnevenGuard: one 1-element all-reduce on the gloo group per batch, sent a batch ahead
            (waited for when the next batch is asked for)
  numerics  + NumericsGuard(every=50: asrlab train's ``train.diagnostics_every`` and lab.py's example;
            the class's own default, 0, never samples) around forward/backward, and
            ``guard.optimizer_step`` in place of the scaler's three calls (grad norm, step; one
            1-element all-reduce sent and read at the next step)
  all       as examples/lab_loop.py: ``watch.data(UnevenGuard(...))``, the numerics guard,
            ``RunState.record`` (one ledger line per step) and a StepTimer; checkpoints are not in
            the loop: ``RunState.save`` is timed on its own

The variants are interleaved step by step: a cycle is one step of each (every variant on the same
batch), in a new random order every cycle (seeded: the same on both ranks), so the machine's drift
and other processes' bursts hit every variant alike (this machine is shared: others' test runs take
a core for minutes; run it when ``top`` shows the cores idle). A step is timed from asking its
variant's iterator for the batch to the end of its optimizer step. ``--steps`` cycles make a round;
per round, each variant's mean step time over bare's is its cost; the median over rounds is
reported, with a bootstrap interval. The guard's step numbers put exactly ``steps / every`` sampled
steps in each round. Three quieter estimates go with it: the rounds' median steps (the sampled
step's excess added back for the numerics guard), the CPU time each rank's process used per step
(blind to waits and to other processes), and the per-call costs, timed afterwards in the same two
processes and added up per step. The verdict is the end-to-end one when its interval is wholly on
one side of the budget, else the median of the three. Both watches' threads run through all the
rounds, so their (tiny) cost is in every variant and only the per-call estimate shows it. The CPU
time other processes took during each round (from /proc) is reported too. Also reported: the time
spent in the loop fetching a batch through the wrappers and in the optimizer part, per variant.

    .venv/bin/python benchmarks/lab_overhead.py     # ~5 min on 2 cores; writes benchmarks/lab_overhead.txt
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import socket
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

VARIANTS = ("bare", "bare2", "watch", "uneven", "numerics", "all")  # bare2: a second bare loop, the A/A control
BUDGETS = {"watch": 0.5, "uneven": 1.0, "numerics": 2.0}  # % of step time
VOCAB, TARGET = 32, 20
QUIET = 0.1  # a round is quiet when other processes used less than this many cores during it


# --------------------------------------------------------------------------- the two ranks


def _cpu(pids: list[int]) -> tuple[float, float]:
    """(CPU seconds all processes used, CPU seconds ``pids`` used) so far (Linux /proc; zeros elsewhere)."""
    try:
        hz = os.sysconf("SC_CLK_TCK")
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        busy = sum(f) - f[3] - f[4]  # all but idle and iowait
        mine = 0
        for pid in pids:
            st = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            mine += int(st[11]) + int(st[12])  # utime + stime, every thread of the process
        return busy / hz, mine / hz
    except (OSError, ValueError):
        return 0.0, 0.0


def _batches(rank: int, n: int, batch: int, frames: int) -> list[dict]:
    g = torch.Generator().manual_seed(1000 + rank)
    return [
        {
            "keys": [f"r{rank}b{i}u{j}" for j in range(batch)],
            "feats": torch.randn(batch, frames, 80, generator=g),
            "feat_lens": torch.full((batch,), frames),
            "targets": torch.randint(1, VOCAB, (batch, TARGET), generator=g),
            "target_lens": torch.full((batch,), TARGET),
        }
        for i in range(n)
    ]


def _loss(model, b):
    from asrlab.model import mean_ctc_loss

    log_probs, out_lens = model(b["feats"], b["feat_lens"])
    return mean_ctc_loss(log_probs, out_lens, b["targets"], b["target_lens"])[0]


def _worker(rank: int, port: int, a: argparse.Namespace, tmp: str) -> None:
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from asrlab import lab
    from asrlab.config import load_config
    from asrlab.model import ConformerCTC
    from asrlab.lab.stall.heartbeat import Heartbeat, read_heartbeats

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    exp = Path(tmp)
    cfg = load_config("tiny").model
    data = _batches(rank, 16, a.batch, a.frames)
    log = (lambda *x: print(*x, flush=True)) if rank == 0 else (lambda *x: None)
    pids = [None, None]
    dist.all_gather_object(pids, os.getpid())

    def forever():
        i = 0
        while True:  # every variant sees the same batch in the same cycle
            yield data[i % len(data)]
            i += 1

    class Variant:
        def __init__(self, name: str):
            torch.manual_seed(0)
            self.name = name
            self.model = DDP(ConformerCTC(cfg, VOCAB))
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
            self.scaler = torch.amp.GradScaler("cpu", enabled=False)
            self.exp = exp / name
            self.guard = (
                lab.NumericsGuard(self.model.module, self.exp, every=a.every) if name in ("numerics", "all") else None
            )
            self.state = lab.RunState(self.exp, self.model, self.opt, self.scaler) if name == "all" else None
            self.timer = lab.StepTimer("cpu") if name == "all" else None
            self.watch = lab.StallWatch(self.exp, timeout_s=60).start() if name in ("watch", "all") else None
            it = forever()
            if name in ("uneven", "all"):
                it = lab.UnevenGuard(it)
            if self.watch is not None:
                it = self.watch.data(it)
            self.it = iter(it)
            self.cpu: list[float] = []  # CPU seconds of this process (all its threads) per step
            self.fetch: list[float] = []  # seconds to get the batch through the variant's wrappers
            self.opt_s: list[float] = []

        def step(self, step: int) -> float:
            """One step, its batch fetched through the variant's wrappers; its wall time (s)."""
            model, opt, scaler, guard, timer = self.model, self.opt, self.scaler, self.guard, self.timer
            c0, t0 = time.process_time(), time.perf_counter()
            if timer is not None:
                timer.start("data")
            b = next(self.it)
            t_fetch = time.perf_counter()
            if timer is not None:
                timer.mark("forward")
            if guard is None:
                loss = _loss(model, b)
                scaler.scale(loss).backward()
                t_opt = time.perf_counter()
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
            else:
                with guard.step(step, b):
                    loss = _loss(model, b)
                    if timer is not None:
                        timer.mark("backward")
                    scaler.scale(loss).backward()
                if timer is not None:
                    timer.mark("optimizer")
                t_opt = time.perf_counter()
                guard.optimizer_step(opt, loss, scaler, replay=lambda: _loss(model.module, b))
            if self.state is not None:
                self.state.record(step, 0, b["keys"])
            if timer is not None:
                timer.stop()
            t1 = time.perf_counter()
            self.cpu.append(time.process_time() - c0)
            self.fetch.append(t_fetch - t0)
            self.opt_s.append(t1 - t_opt)  # the optimizer part (and, in "all", the ledger line and timer)
            return t1 - t0

    variants = {v: Variant(v) for v in VARIANTS}
    for k in range(a.warmup):  # untimed; a step number the guard never samples
        for v in VARIANTS:
            variants[v].step(1 if a.every != 1 else 0)
    sampled = [s for s in range(1, a.steps + 1) if a.every and s % a.every == 0]
    rounds = []
    t_start = time.perf_counter()
    for r in range(a.rounds):
        go = torch.tensor([int(r == 0 or time.perf_counter() - t_start < a.budget_s)])
        dist.broadcast(go, 0)  # rank 0's clock decides for both
        if not go.item():
            break
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for v in variants.values():
            v.cpu, v.fetch, v.opt_s = [], [], []
        c0, w0 = _cpu(pids), time.perf_counter()
        for k in range(a.steps):
            c = r * a.steps + k
            order = list(VARIANTS)
            random.Random(c).shuffle(order)  # the same on both ranks; no variant always follows the same one
            for v in order:
                times[v].append(variants[v].step(c + 1))
        c1 = _cpu(pids)
        foreign = max(0.0, (c1[0] - c0[0]) - (c1[1] - c0[1])) / max(1e-9, time.perf_counter() - w0)
        cpu = [None, None]
        dist.all_gather_object(
            cpu, {v: {"cpu": variants[v].cpu, "fetch": variants[v].fetch, "opt": variants[v].opt_s} for v in VARIANTS}
        )
        rounds.append({"times": times, "foreign": foreign, "ranks": cpu})
        bare = statistics.mean(times["bare"])
        log(
            f"round {r + 1:2d} ({time.perf_counter() - t_start:4.0f} s): mean step, ms: "
            + ", ".join(f"{v} {1e3 * statistics.mean(times[v]):.1f}" for v in VARIANTS)
            + "   vs bare: "
            + ", ".join(f"{v} {100 * (statistics.mean(times[v]) / bare - 1):+.2f}%" for v in VARIANTS[1:])
            + f"   others' CPU {foreign:.2f} cores"
        )
    for v in reversed(VARIANTS):
        if variants[v].watch is not None:
            variants[v].watch.stop()

    # ---- per-call costs, in the same two processes -------------------------------------------
    micro: dict[str, float] = {}
    hb = Heartbeat(rank)
    n = 200_000
    micro["enter_ns"] = min(timeit.repeat(lambda: hb.enter("compute"), number=n, repeat=5)) / n * 1e9
    w = lab.StallWatch(exp / "micro_watch", timeout_s=60, exit_on_stall=False)  # not started: no thread
    items = list(range(n))
    t0 = time.perf_counter()
    for _ in w.data(items):
        pass
    micro["watch_data_ns"] = (time.perf_counter() - t0) / n * 1e9  # 2 enters + the generator, per item
    t0 = time.perf_counter()
    for _ in items:
        pass
    micro["watch_data_ns"] -= (time.perf_counter() - t0) / n * 1e9
    wd = lab.StallWatch(exp / "micro_poll", timeout_s=60, exit_on_stall=False).start()
    time.sleep(0.1)
    k = 50
    t0 = time.perf_counter()
    for _ in range(k):
        wd.watchdog.flush()
        read_heartbeats(wd.exp, wd.rid)
    micro["poll_ms"] = (time.perf_counter() - t0) / k * 1e3  # one watchdog poll's file work (2 ranks)
    wd.stop()

    group = lab.cpu_group()

    def allreduce():
        t = torch.tensor([1], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
        return int(t.item())

    for _ in range(200):
        allreduce()
    dist.barrier()
    k = 2000
    t0 = time.perf_counter()
    for _ in range(k):
        allreduce()
    micro["allreduce_us"] = (time.perf_counter() - t0) / k * 1e6
    ug = list(range(k))
    dist.barrier()
    t0 = time.perf_counter()
    for _ in lab.UnevenGuard(ug):
        pass
    micro["uneven_item_us"] = (time.perf_counter() - t0) / k * 1e6  # nothing to overlap: the all-reduce + generator

    from asrlab.lab.numerics.guard import rng_state

    nv = variants["numerics"]
    p = list(nv.model.parameters())
    micro["rng_state_us"] = min(timeit.repeat(lambda: rng_state(None), number=2000, repeat=3)) / 2000 * 1e6
    b0 = data[0]
    loss = _loss(nv.model.module, b0)  # gradients to measure the grad norm on (no DDP all-reduce)
    loss.backward()
    micro["grad_norm_ms"] = (
        min(timeit.repeat(lambda: torch.nn.utils.clip_grad_norm_(p, float("inf")), number=20, repeat=5)) / 20 * 1e3
    )
    from asrlab.lab.numerics.guard import _total_norm

    micro["norm_only_ms"] = min(timeit.repeat(lambda: _total_norm([q.grad for q in p]), number=20, repeat=5)) / 20 * 1e3

    class KeepGrads:  # an optimizer whose step does nothing and whose zero_grad keeps the gradients
        param_groups = [{"params": p}]

        def step(self):
            pass

        def zero_grad(self, set_to_none=True):
            pass

    with nv.guard.step(1, b0):  # an unsampled step: what optimizer_step costs on top of the optimizer's own step
        pass
    dist.barrier()
    k = 200
    t0 = time.perf_counter()
    for _ in range(k):
        nv.guard.optimizer_step(KeepGrads(), loss, None)
    micro["guard_opt_ms"] = (time.perf_counter() - t0) / k * 1e3
    nv.opt.zero_grad()
    st = lab.StepTimer("cpu")

    def timer_step():
        st.start("forward")
        st.mark("backward")
        st.mark("optimizer")
        st.stop()

    micro["step_timer_us"] = min(timeit.repeat(timer_step, number=20000, repeat=3)) / 20000 * 1e6
    keys = data[0]["keys"]
    rs = variants["all"].state
    micro["ledger_us"] = min(timeit.repeat(lambda: rs.record(0, 0, keys), number=20000, repeat=3)) / 20000 * 1e6

    # a sampled numerics step against an unsampled one, alternating, on the numerics variant (DDP, both ranks)
    def one(step: int) -> float:
        b = data[step % len(data)]
        dist.barrier()
        t0 = time.perf_counter()
        with nv.guard.step(step, b):
            loss = _loss(nv.model, b)
            loss.backward()
        nv.guard.optimizer_step(nv.opt, loss, None, replay=lambda: _loss(nv.model.module, b))
        return time.perf_counter() - t0

    one(1)
    plain, samp = [], []
    for j in range(a.pairs):
        plain.append(one(10_000 * a.every + 1 + j))
        samp.append(one(10_000 * a.every + a.every * (j + 1)))
    micro["unsampled_step_ms"] = statistics.median(plain) * 1e3
    micro["sampled_step_ms"] = statistics.median(samp) * 1e3
    nv.guard.diag.every = 1  # what the sampled step adds, by part: hooks on every module + statistics, and the trace
    with nv.guard.diag.recording():
        loss = _loss(nv.model.module, data[0])
        loss.backward()
    nv.opt.zero_grad()
    k = 20
    t0 = time.perf_counter()
    for _ in range(k):
        nv.guard.diag.summary()
    micro["summary_ms"] = (time.perf_counter() - t0) / k * 1e3
    summ = nv.guard.diag.summary()
    t0 = time.perf_counter()
    for _ in range(k):
        nv.guard.traces.write(0, 1.0, summ)
    micro["trace_write_ms"] = (time.perf_counter() - t0) / k * 1e3
    micro["hooked_records"] = len(nv.guard.diag.records)
    import asrlab.lab.numerics.stats as diagnostics

    x = torch.randn(a.batch, a.frames // 2, cfg.d_model)  # an activation of this model and batch
    sample = nv.guard.diag.sample
    micro["stats_us"] = min(timeit.repeat(lambda: diagnostics.raw_stats(x, sample), number=500, repeat=3)) / 500 * 1e6

    # the sampled step's forward + backward by part, on the bare module (no DDP: no collectives): no hooks,
    # the hooks with a statistics function that does nothing, the real statistics
    mod, real_stats = nv.model.module, diagnostics.raw_stats
    nothing = (torch.zeros(()),) * 5 + (1, 1)

    def fwd_bwd(mode: str) -> float:
        diagnostics.raw_stats = real_stats if mode == "stats" else (lambda t, sample=None: nothing)
        try:
            t0 = time.perf_counter()
            with nv.guard.diag.recording() if mode != "plain" else contextlib.nullcontext():
                _loss(mod, data[1]).backward()
            return time.perf_counter() - t0
        finally:
            diagnostics.raw_stats = real_stats
            mod.zero_grad()

    modes = {"plain": [], "hooks": [], "stats": []}
    for _ in range(4):
        for m_ in modes:
            modes[m_].append(fwd_bwd(m_))
    micro["fb_plain_ms"], micro["fb_hooks_ms"], micro["fb_stats_ms"] = (
        1e3 * statistics.median(modes[m_][1:]) for m_ in ("plain", "hooks", "stats")
    )

    def hooks():
        with nv.guard.diag.recording():
            pass

    micro["hooks_ms"] = min(timeit.repeat(hooks, number=20, repeat=3)) / 20 * 1e3  # 2 hooks on every module, on and off
    nv.guard.diag.every = a.every

    def guard_ctx():
        with nv.guard.step(1):  # an unsampled step: the RNG state kept, no hooks
            pass

    micro["guard_ctx_us"] = min(timeit.repeat(guard_ctx, number=2000, repeat=3)) / 2000 * 1e6
    micro["autocast_hook_us"] = (
        min(timeit.repeat(lambda: nv.guard._note_autocast(None, ()), number=20000, repeat=3)) / 20000 * 1e6
    )

    # checkpoints, counted apart: RunState.save of the "all" variant (a collective; rank 0 writes)
    saves = []
    for j in range(3):
        dist.barrier()
        t0 = time.perf_counter()
        rs.save(100_000 + j, 0)
        saves.append(time.perf_counter() - t0)
    micro["save_ms"] = statistics.median(saves) * 1e3
    micro["ckpt_mb"] = max(f.stat().st_size for f in (variants["all"].exp / "checkpoints").glob("*.pt")) / 1e6

    allm = [dict(m) for m in [micro]]
    gathered = [None, None]
    dist.all_gather_object(gathered, allm[0])
    if rank == 0:
        (exp / "result.json").write_text(
            json.dumps(
                {"rounds": rounds, "micro": gathered, "sampled": sampled, "elapsed_s": time.perf_counter() - t_start}
            )
        )
    for v in variants.values():
        if v.guard is not None:
            v.guard.close()
        if v.state is not None:
            v.state.close()
    dist.destroy_process_group()


# --------------------------------------------------------------------------- the report


def _bootstrap_ci(xs: list[float], n: int = 4000) -> tuple[float, float]:
    """A 90% interval of the median, resampling rounds."""
    rnd = random.Random(0)
    meds = sorted(statistics.median(rnd.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.05 * n)], meds[int(0.95 * n) - 1]


def report(res: dict, a: argparse.Namespace) -> list[str]:
    out = []
    rounds, m0, m1 = res["rounds"], res["micro"][0], res["micro"][1]
    mean = {v: [statistics.mean(r["times"][v]) for r in rounds] for v in VARIANTS}
    med = {v: [statistics.median(r["times"][v]) for r in rounds] for v in VARIANTS}
    ratio = {v: [100 * (x / b - 1) for x, b in zip(mean[v], mean["bare"])] for v in VARIANTS}
    mratio = {v: [100 * (x / b - 1) for x, b in zip(med[v], med["bare"])] for v in VARIANTS}
    cpu = {v: [statistics.mean(statistics.mean(c[v]["cpu"]) for c in r["ranks"]) for r in rounds] for v in VARIANTS}
    # in the loop: time to fetch a batch through the wrappers, and of the optimizer part, per rank (median, mean)
    inloop = {
        v: [
            [
                f(x for r in rounds for x in r["ranks"][k][v][part]) * 1e3
                for part in ("fetch", "opt")
                for f in (statistics.median, statistics.fmean)
            ]
            for k in (0, 1)
        ]
        for v in VARIANTS
    }
    cratio = {v: [100 * (x / b - 1) for x, b in zip(cpu[v], cpu["bare"])] for v in VARIANTS}
    # the sampled step's excess over the median step of its variant in its round (numerics and all)
    excess = []
    for r in rounds:
        for v in ("numerics", "all"):
            t = r["times"][v]
            m = statistics.median(t)
            excess += [t[s - 1] - m for s in res["sampled"]]
    exc = statistics.median(excess) if excess else 0.0
    bare_step = statistics.median(med["bare"])
    step_s = statistics.median(mean["bare"])
    every = a.every
    # what the per-call costs add up to, per step (rank 0's costs; the all-reduce waits for both)
    ar = m0["allreduce_us"] * 1e-6
    hb = 2 * m0["enter_ns"] * 1e-9 + m0["watch_data_ns"] * 1e-9
    poll = m0["poll_ms"] * 1e-3 * step_s  # once a second: share of a second, times the step
    guard = (
        m0["guard_opt_ms"] * 1e-3
        + (m0["guard_ctx_us"] + m0["autocast_hook_us"]) * 1e-6
        + (exc / every if every else 0.0)
    )
    parts = {
        "bare2": 0.0,
        "watch": hb + poll,
        "uneven": m0["uneven_item_us"] * 1e-6,
        "numerics": guard,
        "all": hb + poll + m0["uneven_item_us"] * 1e-6 + guard + (m0["ledger_us"] + m0["step_timer_us"]) * 1e-6,
    }
    nsteps = len(rounds) * a.steps
    out.append(
        f"2 gloo ranks x 1 thread, tiny ConformerCTC (2.1M parameters), fp32, {a.batch} x {a.frames} frames "
        f"per rank per step; {len(rounds)} rounds of {a.steps} cycles (one step of each variant, in a random order "
        f"each cycle) after {a.warmup} warm-up cycles; numerics guard every={every} "
        f"({len(res['sampled'])} sampled step per variant per round); {res['elapsed_s']:.0f} s of rounds"
    )
    out.append(
        f"bare step: mean {1e3 * step_s:.1f} ms, median {1e3 * bare_step:.1f} ms (medians over rounds); "
        f"{nsteps} timed steps per variant"
    )
    out.append("")
    hdr = (
        f"{'variant':9s} {'mean step':>9s} {'cost vs bare':>13s} {'90% CI':>17s} {'rounds > 0':>10s} "
        f"{'median-step':>11s} {'CPU time':>9s} {'from parts':>10s} {'budget':>7s}  verdict"
    )
    out.append(hdr)
    out.append("-" * len(hdr))
    for v in VARIANTS:
        if v == "bare":
            out.append(f"{v:9s} {1e3 * step_s:7.1f}ms")
            continue
        c = statistics.median(ratio[v])
        lo, hi = _bootstrap_ci(ratio[v])
        pos = sum(x > 0 for x in ratio[v])
        mc = statistics.median(mratio[v])
        if v in ("numerics", "all") and every:
            mc += 100 * exc / every / bare_step  # the sampled step, left out of the median, added back
        pc = 100 * parts[v] / step_s
        cc = statistics.median(cratio[v])
        budget = BUDGETS.get(v)
        if v == "bare2":
            verdict = "(A/A control: the same loop as bare; what instance and noise alone give)"
        elif budget is None:
            verdict = "(no budget)"
        elif hi <= budget:
            verdict = "PASS"
        elif lo > budget:
            verdict = f"FAIL, by {c - budget:.2f} points"
        else:  # the end-to-end interval straddles the budget: the median of the three quieter estimates decides
            q = statistics.median([mc, cc, pc])
            verdict = (
                f"PASS (e2e within noise; quieter estimates {q:+.2f}%)"
                if q <= budget
                else f"FAIL, by {q - budget:.2f} points (e2e within noise; quieter estimates {q:+.2f}%)"
            )
        out.append(
            f"{v:9s} {1e3 * statistics.median(mean[v]):7.1f}ms {c:+12.2f}% [{lo:+7.2f},{hi:+7.2f}]% "
            f"{pos:>4d}/{len(rounds):<5d} {mc:+10.2f}% {cc:+8.2f}% {pc:+9.2f}% "
            f"{(f'<= {budget:g}%' if budget else ''):>7s}  {verdict}"
        )
    fl = [rd["foreign"] for rd in rounds]
    quiet = [i for i, f in enumerate(fl) if f < QUIET]
    out.append(
        f"other processes on the machine used {min(fl):.2f}-{max(fl):.2f} cores (median {statistics.median(fl):.2f}) "
        f"during the rounds; "
    )
    if quiet and len(quiet) < len(rounds):
        out[-1] += f"the {len(quiet)} quiet rounds (< {QUIET} core) alone: " + ", ".join(
            f"{v} {statistics.median(ratio[v][i] for i in quiet):+.2f}%" for v in VARIANTS[1:]
        )
    elif not quiet:
        out[-1] += f"no round was quiet (< {QUIET} core)"
    else:
        out[-1] += f"every round was quiet (< {QUIET} core)"
    out.append("")
    out.append("cost vs bare: median over rounds of (variant's mean step / bare's mean step in the same round) - 1;")
    out.append("  90% CI: bootstrap over rounds; rounds > 0: rounds where the variant was slower than bare.")
    out.append("median-step: the same with each round's median step (per-step costs only, less interference),")
    out.append(f"  plus the sampled step's excess / {every} for the numerics guard.")
    out.append(
        "CPU time: the same with the CPU seconds each rank's process (all its threads) used per step, both ranks"
    )
    out.append("  averaged: the work the parts add, blind to waits (an all-reduce's latency) and to other processes.")
    out.append("from parts: the per-call costs below, added up per step (no interference at all; the watch's includes")
    out.append("  its watchdog thread, which the end-to-end numbers cannot show: both watches' threads run all along).")
    out.append("verdict: PASS/FAIL when the end-to-end 90% CI is wholly below/above the budget; otherwise by the")
    out.append("  median of the three quieter estimates (median-step, CPU time, from parts).")
    out.append("")
    out.append(
        "in the loop, per step, median / mean (ms), rank 0 [rank 1]: batch fetch through the wrappers | optimizer part"
    )
    for v in VARIANTS:
        (f0, f0m, o0, o0m), (f1, f1m, o1, o1m) = inloop[v]
        out.append(
            f"  {v:9s} {f0:6.3f} / {f0m:6.3f} [{f1:6.3f} / {f1m:6.3f}] | "
            f"{o0:6.2f} / {o0m:6.2f} [{o1:6.2f} / {o1m:6.2f}]"
        )
    out.append(
        "  (bare's optimizer part: scaler.step + update + zero_grad; the guard's: guard.optimizer_step, in 'all'"
    )
    out.append("  with the ledger line and the timer)")
    out.append("")
    out.append("per-call costs, timed alone (rank 0; rank 1 in brackets):")
    r = lambda k, f: f"{f.format(m0[k])} [{f.format(m1[k])}]"  # noqa: E731
    out.append(f"  heartbeat enter(phase)                          {r('enter_ns', '{:.0f}')} ns")
    out.append(f"  watch.data() per batch (2 enters + generator)   {r('watch_data_ns', '{:.0f}')} ns")
    out.append(
        f"  watchdog poll (write own file, read both)       {r('poll_ms', '{:.2f}')} ms, once a second "
        f"= {m0['poll_ms'] / 10:.3f}% of a core"
    )
    out.append(
        f"  gloo 1-element all-reduce (cpu_group)           {r('allreduce_us', '{:.0f}')} us "
        f"= {100 * ar / step_s:.2f}% of a {1e3 * step_s:.0f} ms step"
    )
    out.append(
        f"  UnevenGuard per batch, nothing between batches   {r('uneven_item_us', '{:.0f}')} us "
        "(each agreement waited for at once: in a loop it overlaps the step)"
    )
    out.append(
        f"  NumericsGuard, every step: guard.step() context  {r('guard_ctx_us', '{:.1f}')} us "
        f"(of which rng_state {m0['rng_state_us']:.1f} us); forward pre-hook {r('autocast_hook_us', '{:.1f}')} us"
    )
    out.append(
        f"    guard.optimizer_step without the optimizer's step (grad norm, checks, last step's agreement read, this one's sent) "
        f"{r('guard_opt_ms', '{:.2f}')} ms = {100 * m0['guard_opt_ms'] * 1e-3 / step_s:.2f}% of the step"
    )
    out.append(
        f"    of which the norm: clip_grad_norm_(params, inf) (norm + a x1 pass) {r('grad_norm_ms', '{:.2f}')} ms, "
        + f"the guard's (one _foreach_norm) {r('norm_only_ms', '{:.2f}')} ms"
    )
    out.append(
        f"  NumericsGuard, sampled step vs unsampled (alternating, median of {a.pairs} pairs): "
        f"{m0['sampled_step_ms']:.1f} vs {m0['unsampled_step_ms']:.1f} ms "
        f"(+{m0['sampled_step_ms'] - m0['unsampled_step_ms']:.1f} ms)"
    )
    out.append(
        f"    in the rounds: {1e3 * exc:+.1f} ms over its variant's median step "
        f"({100 * exc / bare_step:.0f}% of a step, once per {every} steps: {100 * exc / every / bare_step:.2f}% "
        f"per step; every=25: {100 * exc / 25 / bare_step:.2f}%, every=100: {100 * exc / 100 / bare_step:.2f}%)"
    )
    hooks = m0["fb_hooks_ms"] - m0["fb_plain_ms"]
    stats = m0["fb_stats_ms"] - m0["fb_hooks_ms"]
    out.append(
        f"    by part (forward + backward of the module alone, rank 0): no hooks {m0['fb_plain_ms']:.1f} ms, "
        f"hooks with no-op statistics {m0['fb_hooks_ms']:.1f} ms, with the statistics {m0['fb_stats_ms']:.1f} ms:"
    )
    out.append(
        f"    the hooks {hooks:+.1f} ms, the statistics {stats:+.1f} ms ({m0['hooked_records']} records, "
        f"{1e3 * stats / max(1, m0['hooked_records']):.0f} us each; {r('stats_us', '{:.0f}')} us on one "
        f"{a.batch}x{a.frames // 2}x144 activation), then summary() {r('summary_ms', '{:.2f}')} ms, "
        f"the trace line {r('trace_write_ms', '{:.2f}')} ms"
    )
    out.append(f"  RunState.record (a ledger line, {a.batch} keys)        {r('ledger_us', '{:.1f}')} us")
    out.append(f"  StepTimer start + 2 marks + stop                {r('step_timer_us', '{:.1f}')} us")
    out.append(
        f"  RunState.save (checkpoint, not in the loop)     {m0['save_ms']:.0f} ms, {m0['ckpt_mb']:.1f} MB "
        f"= {100 * m0['save_ms'] * 1e-3 / (1000 * step_s):.2f}% at one per 1,000 steps"
    )
    out.append("")
    out.append("per round, cost vs bare (%), mean-step based:")
    out.append("  round " + " ".join(f"{v:>9s}" for v in VARIANTS[1:]) + "   bare mean ms   others' CPU (cores)")
    for i, rd in enumerate(rounds):
        out.append(
            f"  {i + 1:5d} "
            + " ".join(f"{ratio[v][i]:+9.2f}" for v in VARIANTS[1:])
            + f"   {1e3 * mean['bare'][i]:12.1f}   {rd['foreign']:.2f}"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=50, help="timed steps per variant per round (a multiple of --every)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed cycles (a step of every variant) at the start")
    ap.add_argument("--budget-s", type=float, default=270, help="start no round after this many seconds of rounds")
    ap.add_argument("--every", type=int, default=50, help="NumericsGuard sampling (asrlab train's default: 50)")
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--frames", type=int, default=128)
    ap.add_argument("--pairs", type=int, default=5, help="sampled/unsampled step pairs for the per-call cost")
    ap.add_argument("--out", default=str(Path(__file__).with_suffix(".txt")), help="'' for no file")
    a = ap.parse_args()
    if a.every and a.steps % a.every:
        ap.error("--steps must be a multiple of --every (the same number of sampled steps in every round)")
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0, load0 = time.time(), os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(port, a, tmp), nprocs=2, join=True)
        res = json.loads((Path(tmp) / "result.json").read_text())
    lines = report(res, a)
    lines.append(
        f"\nwall clock of the whole run: {time.time() - t0:.0f} s; torch {torch.__version__}, {os.cpu_count()} CPUs; "
        f"1-min load average {load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print("\n".join(lines))
    if a.out:
        cmd = ".venv/bin/python " + shlex.join([os.path.relpath(sys.argv[0])] + sys.argv[1:])
        Path(a.out).write_text(f"$ {cmd}\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
