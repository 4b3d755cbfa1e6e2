"""The costs of a large multi-node run that the other benchmarks do not measure (for docs/scale.md).

    .venv/bin/python benchmarks/scale_costs.py [--work /tmp/asrlab_scale] [--repeats 5] [--rounds 200]

Each part measures one slope on this machine; the whole takes about a minute on 2 cores:

1. Checkpoint of the ``base`` config: asrlab's own ``Trainer`` (``load_config("base")``, ``ConformerCTC``,
   fused AdamW) trains one real step on CPU (a small batch: the checkpoint's size does not depend on
   it), then ``Trainer.save`` (``checkpoint.save_checkpoint``: temp file, fsync, rename, SHA-256 marker)
   is timed ``--repeats`` times, and ``checkpoint.load_latest`` (SHA-256 check + ``torch.load``, what each
   rank does on resume) 3 times; medians. The checkpoint holds one rank's RNG and loader states; what
   each further rank adds is measured apart (the pickled bytes of one rank's entries).
2. One rank's heartbeat record as ``write_heartbeat`` writes it (``Heartbeat.snapshot()`` plus the run
   id), taken from the trainer's own heartbeat after it has been in every phase; and the bundle the
   relay (``asrlab.lab.stall.relay``, when present) puts in the store for it.
3. A TCPStore served by another process on 127.0.0.1: one ``set`` of this rank's bundle plus one
   ``multi_get`` of 64 ranks' bundles, median of ``--rounds`` rounds, and the server's CPU time per
   round (over ten times as many rounds: the process clock ticks every 10 ms);
   then the relay's own cycle (``Relay.push`` + ``Relay.pull``, 63 other ranks), the same way: with every
   record newer than this node's copy (63 files written) and with nothing new (63 files read and compared).
4. The watchdog's once-a-second poll (write this rank's heartbeat and timeline, look for rank errors,
   read every rank's heartbeat, the progress clock) with 8 and with 64 ranks' files; median.
5. The index at scale: a synthetic ``LIST.index.json`` of 100,000 utterances (its sources empty
   files, so nothing but the index is read), read by ``use_index`` in a fresh process (3 times; medians):
   file bytes, seconds and resident memory per utterance (after reading, and its peak, ``VmHWM`` reset first), the
   pre-flight layout (``inspect_layout``, 64 ranks x 4 workers) per utterance, and what a forked child
   copies when it runs a full garbage collection (a loader worker's worst case; less what the same
   costs before the index is read); at short keys and transcripts (as ``startup.py``'s corpora) and at
   40-character keys with 180-character transcripts (12 s of English at 15 characters a second).
6. Building the index: ``index_source`` on one shard of 3,000 utterances of 0.3-1.0 s and one of 200
   utterances of 11-13 s (about the same bytes, both in the page cache), median of 5: the cost per
   utterance and per MB.

Nothing here needs a GPU; everything is written under ``--work``.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from startup import corpus  # (benchmarks/, this script's folder, is on sys.path)

ROOT = Path(__file__).resolve().parents[1]


def med(xs) -> float:
    return statistics.median(xs)


# --------------------------------------------------------------------------- corpora

# --------------------------------------------------------------------------- 1, 2: checkpoint, heartbeat


def checkpoint_and_heartbeat(work: Path, repeats: int) -> dict:
    import torch

    from asrlab.config import load_config
    from asrlab.model import count_parameters
    from asrlab.lab.state import checkpoint
    from asrlab.lab.dist import DistInfo
    from asrlab.lab.stall.heartbeat import PHASES, run_id, write_heartbeat
    from asrlab.lab.state.run_state import all_rng_state
    from asrlab.train.trainer import Trainer

    lst = corpus(200, work / "ckpt_corpus", 1.0, 3.0, 1, shard_size=200)
    exp = work / "ckpt_exp"
    cfg = load_config(
        "base",
        [
            "data.num_workers=0",
            "data.pin_memory=false",
            "data.max_frames_in_batch=1500",
            "train.progress=false",
            "train.stall_timeout_s=0",
            "train.keep_last=1",
        ],
    )
    tr = Trainer(cfg, str(lst), None, exp, DistInfo(0, 1, 0, torch.device("cpu"), None))
    t0 = time.perf_counter()
    tr.train_step([next(iter(tr.loader))])
    tr.settle()
    step_s = time.perf_counter() - t0
    params = count_parameters(tr.model)
    head = [m for m in tr.model.modules() if isinstance(m, torch.nn.Linear)][-1]
    out = {
        "params": params,
        "vocab": len(tr.tok),
        "d_model": cfg.model.d_model,
        "cpu_step_s": step_s,
        "head_params_per_unit": head.in_features + 1,
        "opt_state_keys": sorted(next(iter(tr.opt.state.values()))),
    }

    saves, hashes = [], []
    ckpt_dir = exp / "checkpoints"
    for _ in range(repeats):
        t0 = time.perf_counter()
        tr.save()
        saves.append(time.perf_counter() - t0)
        path = sorted(ckpt_dir.glob("step_*.pt"))[-1]
        t0 = time.perf_counter()
        checkpoint.sha256(path)
        hashes.append(time.perf_counter() - t0)
    loads = []
    for _ in range(3):
        t0 = time.perf_counter()
        state, _marker = checkpoint.load_latest(ckpt_dir)
        loads.append(time.perf_counter() - t0)
    out.update(
        ckpt_bytes=path.stat().st_size,
        save_s=saves,
        sha256_s=hashes,
        load_s=loads,
        model_bytes=sum(t.numel() * t.element_size() for t in state["model"].values()),
    )
    del state

    # what each further rank adds: its RNG states and its loader position, as the checkpoint holds them
    one = {"rng": [all_rng_state(tr.device)], "loader": [tr.loader.state_dict()]}
    many = {k: [copy.deepcopy(v[0]) for _ in range(64)] for k, v in one.items()}
    sizes = []
    for obj in (one, many):
        buf = io.BytesIO()
        torch.save(obj, buf)
        sizes.append(buf.tell())
    out["per_rank_bytes"] = (sizes[1] - sizes[0]) / 63

    # the heartbeat record: the trainer's own heartbeat, after a visit to every phase, now waiting for data
    hb = tr.hb
    for phase in PHASES:
        if phase != "done":
            hb.enter(phase)
    rid = run_id()
    records = {}
    for phase in ("forward", "data"):
        hb.enter(phase, step=123456)
        d = work / f"hb_{phase}"
        write_heartbeat(d, hb.snapshot(), rid)
        path = d / "heartbeat" / f"rank{hb.rank}.json"
        text = path.read_text()
        records[phase] = {
            "bytes": len(text.encode()),
            "text": text,
            "bundle_bytes": len(json.dumps({"heartbeat/rank{r}.json": text}).encode()),
        }
    out["heartbeat"] = records
    out["rid"] = rid
    tr.close()
    return out


# --------------------------------------------------------------------------- 3: the store, the relay

SERVER = """
import datetime, sys, time
import torch.distributed as d
s = d.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60))
print(s.port, flush=True)
sys.stdin.read()   # until the parent closes the pipe
"""


def store_costs(work: Path, record: str, rid: str, rounds: int, world: int = 64) -> dict:
    from datetime import timedelta

    import psutil
    import torch.distributed as tdist

    server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        sp = psutil.Process(server.pid)

        def client():
            return tdist.TCPStore(
                "127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=30)
            )

        me, other = client(), client()
        snap = json.loads(record)
        prefix = f"asrlab/{rid}/"

        def bundle(r: int, t: float) -> str:
            return json.dumps({"heartbeat/rank{r}.json": json.dumps({**snap, "rank": r, "time": t})})

        for r in range(world):
            other.set(f"{prefix}rank{r}", bundle(r, time.time()))
        keys = [f"{prefix}rank{r}" for r in range(world)]
        mine = bundle(0, time.time())
        for _ in range(20):  # warm
            me.set(keys[0], mine)
            me.multi_get(keys)
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            me.set(keys[0], mine)
            got = me.multi_get(keys)
            times.append(time.perf_counter() - t0)
        cpu0, n = sum(sp.cpu_times()[:2]), 10 * rounds  # the server's CPU: over more rounds (10-ms ticks)
        for _ in range(n):
            me.set(keys[0], mine)
            me.multi_get(keys)
        server_cpu = (sum(sp.cpu_times()[:2]) - cpu0) / n
        out = {
            "set_multiget_s": times,
            "server_cpu_s_per_round": server_cpu,
            "bytes_per_round_read": sum(len(v) for v in got),
            "bytes_per_set": len(mine.encode()),
        }

        try:
            from asrlab.lab.stall import relay as relay_mod
        except ImportError:
            out["relay"] = None
            return out
        exp = work / "relay_exp"
        rl = relay_mod.Relay(exp, 0, world, rid, me)
        own = exp / "heartbeat" / "rank0.json"
        own.parent.mkdir(parents=True, exist_ok=True)

        def touch_all():
            t = time.time()
            own.write_text(json.dumps({**snap, "rank": 0, "time": t, "run": rid}))
            for r in range(1, world):
                other.set(keys[r], bundle(r, t))

        touch_all()
        rl.push()
        rl.pull()  # sees every key once (its check), writes the files
        changed, same = [], []
        for _ in range(rounds):
            touch_all()  # every record newer: the pull writes all 63 files
            t0 = time.perf_counter()
            rl.push()
            rl.pull()
            changed.append(time.perf_counter() - t0)
        for _ in range(rounds):
            t0 = time.perf_counter()
            rl.push()
            rl.pull()
            same.append(time.perf_counter() - t0)
        out["relay"] = {
            "period_s": relay_mod.PERIOD_S,
            "changed_s": changed,
            "same_s": same,
            "files": len(list((exp / "heartbeat").glob("rank*.json"))),
        }
        return out
    finally:
        server.stdin.close()
        server.wait(timeout=10)


# --------------------------------------------------------------------------- 4: the watchdog's poll


def watchdog_poll(work: Path, record: str, rounds: int) -> dict:
    from asrlab.lab.stall.errors import rank_errors
    from asrlab.lab.stall.heartbeat import Heartbeat, read_heartbeats
    from asrlab.lab.stall.watchdog import ProgressClock, Watchdog

    snap = json.loads(record)
    out = {}
    for world in (8, 64):
        exp = work / f"watch{world}"
        hb = Heartbeat(0)
        for phase in ("data", "forward", "backward", "allreduce", "optimizer"):
            hb.enter(phase)
        wd = Watchdog(hb, exp, world, 30.0, 180.0, exit_on_stall=False, rid=snap["run"])
        hbdir = exp / "heartbeat"
        hbdir.mkdir(parents=True, exist_ok=True)
        for r in range(1, world):
            (hbdir / f"rank{r}.json").write_text(json.dumps({**snap, "rank": r, "time": time.time()}))
        clock = ProgressClock(world, 30.0, 180.0)

        def poll():  # Watchdog._watch's loop body, less the faulthandler re-arm
            wd.flush()
            [e for e in rank_errors(wd.exp, wd.t0, wd.rid) if e["rank"] != 0]
            clock.overdue(read_heartbeats(wd.exp, wd.rid))

        for _ in range(10):
            poll()
        times = []
        for _ in range(rounds):
            hb.enter("forward")
            t0 = time.perf_counter()
            poll()
            times.append(time.perf_counter() - t0)
        out[world] = times
        wd.stop()
    return out


# --------------------------------------------------------------------------- 5: reading the index at scale

INDEX_CHILD = r"""
import gc, json, os, sys, time
import psutil
from asrlab.config import load_config
from asrlab.data.index import use_index
from asrlab.data.preflight import inspect_layout
from asrlab.data.sources import Source
spec = json.loads(sys.argv[1])
sources = [Source(name=n, path=p) for n, p in spec["sources"]]
proc = psutil.Process()


def fork_gc_copied():
    # a loader worker's worst case: a full collection in a forked child touches every object it inherited
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        me = psutil.Process()
        before = me.memory_full_info().uss
        gc.collect()
        os.write(w, json.dumps(me.memory_full_info().uss - before).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    return json.loads(os.read(r, 1000))


def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024


gc.collect()
base_copied = fork_gc_copied()
rss0 = proc.memory_info().rss
with open("/proc/self/clear_refs", "w") as f:  # resets the peak (VmHWM) to the current resident size
    f.write("5")
t0 = time.perf_counter()
s = use_index(spec["list"], sources, progress=False, write=False)
read_s = time.perf_counter() - t0
peak = hwm()
assert s["indexed"] == 0 and s["utterances"] == spec["n"], s
gc.collect()
rss1 = proc.memory_info().rss
cfg = load_config("base")
t0 = time.perf_counter()
layout = inspect_layout(sources, cfg.data, 64, 4)
layout_s = time.perf_counter() - t0
assert layout["utts"] == spec["n"], layout["utts"]
copied = fork_gc_copied()
print(json.dumps({"read_s": read_s, "rss_steady": rss1 - rss0, "rss_peak": peak - rss0, "layout_s": layout_s,
                  "fork_gc_copied": copied - base_copied}))
"""


def index_at_scale(
    work: Path, n: int, key_len: int, text_len: int, seconds: float, per_source: int = 1000, repeats: int = 3
) -> dict:
    d = work / f"index_{key_len}_{text_len}"
    shards = d / "shards"
    shards.mkdir(parents=True, exist_ok=True)
    lst = d / "data.list"
    rng = np.random.default_rng(key_len * 1000 + text_len)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz     "))
    sources, entries = [], {}
    for i in range(n // per_source):
        path = shards / f"train_{i:09d}.tar"
        path.touch()
        st = os.stat(path)
        name = path.name
        sources.append([name, str(path)])
        utts = []
        for j in range(per_source):
            key = f"{i:06d}-{j:06d}-".ljust(key_len, "k")[:key_len]
            text = "".join(rng.choice(letters, size=text_len)).strip() or "a"
            samples = int(16000 * seconds * rng.uniform(0.8, 1.2))
            utts.append([key, samples, 16000, text, None])
        entries[json.dumps([name, str(path)])] = {"stamp": [[st.st_size, st.st_mtime_ns]], "utts": utts}
    lst.write_text("".join(f"{p}\n" for _, p in sources))
    index = lst.with_name(lst.name + ".index.json")
    index.write_text(json.dumps({"version": 1, "list": str(lst.resolve()), "sources": entries}), encoding="utf-8")
    spec = {"list": str(lst), "sources": sources, "n": n}
    runs = []
    for _ in range(repeats):  # each in a fresh process; the median of each number
        got = subprocess.run(
            [sys.executable, "-c", INDEX_CHILD, json.dumps(spec)], cwd=ROOT, check=True, capture_output=True, text=True
        )
        runs.append(json.loads(got.stdout.strip().splitlines()[-1]))
    res = {k: med([r[k] for r in runs]) for k in runs[0]}
    res.update(
        n=n,
        key_len=key_len,
        text_len=text_len,
        seconds=seconds,
        file_bytes=index.stat().st_size,
        read_runs=[r["read_s"] for r in runs],
    )
    return res


# --------------------------------------------------------------------------- 6: building the index


def index_build(work: Path) -> dict:
    from asrlab.data.index import index_source
    from asrlab.data.sources import load_sources

    out = {}
    for name, n, lo, hi in (("short", 3000, 0.3, 1.0), ("long", 200, 11.0, 13.0)):
        lst = corpus(n, work / f"build_{name}", lo, hi, 7, shard_size=n)
        (src,) = load_sources(lst)
        index_source(src)  # into the page cache
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            utts = index_source(src)
            times.append(time.perf_counter() - t0)
        out[name] = {
            "utts": len(utts),
            "bytes": os.path.getsize(src.path),
            "s": med(times),
            "audio_h": sum(u.seconds for u in utts) / 3600,
        }
    s, l_ = out["short"], out["long"]
    # t = a * utts + b * MB, solved from the two shards
    A = np.array([[s["utts"], s["bytes"] / 1e6], [l_["utts"], l_["bytes"] / 1e6]])
    a, b = np.linalg.solve(A, np.array([s["s"], l_["s"]]))
    out["per_utt_s"], out["per_mb_s"] = float(a), float(b)
    return out


# --------------------------------------------------------------------------- report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/asrlab_scale", help="scratch folder (corpora, checkpoints, indexes)")
    ap.add_argument("--repeats", type=int, default=5, help="checkpoint saves to time")
    ap.add_argument("--rounds", type=int, default=200, help="store rounds and watchdog polls to time")
    ap.add_argument("--index-utts", type=int, default=100_000, help="utterances in each synthetic index")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    import torch

    print(" ".join(["$ .venv/bin/python benchmarks/scale_costs.py", *map(shlex.quote, sys.argv[1:])]))
    print(
        f"# {os.cpu_count()} CPU cores, no GPU; torch {torch.__version__}, Python {sys.version.split()[0]}; "
        f"load average {os.getloadavg()[0]:.2f} at start"
    )
    print()

    c = checkpoint_and_heartbeat(work, a.repeats)
    MB = 1e6
    print(
        "1. checkpoint of the base config (Trainer.save -> checkpoint.save_checkpoint, fsync + rename + SHA-256 marker)"
    )
    print(
        f"   model: {c['params'] / 1e6:.2f}M parameters (d_model {c['d_model']}, vocabulary {c['vocab']} units; "
        f"each further unit adds {c['head_params_per_unit']} parameters); AdamW state after one step: "
        f"{', '.join(c['opt_state_keys'])}"
    )
    print(
        f"   file: {c['ckpt_bytes'] / MB:.1f} MB ({c['ckpt_bytes'] / c['params']:.2f} bytes per parameter; "
        f"model weights alone {c['model_bytes'] / MB:.1f} MB); keep_last copies of it on disk"
    )
    print(
        f"   each further rank adds {c['per_rank_bytes'] / 1e3:.1f} kB (its RNG states and loader position): "
        f"64 ranks +{63 * c['per_rank_bytes'] / MB:.2f} MB"
    )
    print(
        f"   save: median {med(c['save_s']):.2f} s over {a.repeats} ({', '.join(f'{x:.2f}' for x in c['save_s'])}); "
        f"of which the marker's SHA-256 of the file (timed apart, page cache) {med(c['sha256_s']):.2f} s"
    )
    print(
        f"   load on resume (load_latest: SHA-256 check + torch.load): median {med(c['load_s']):.2f} s over 3 "
        f"({', '.join(f'{x:.2f}' for x in c['load_s'])})"
    )
    print(
        f"   (one base step on this CPU, 1,500-frame batch, fp32: {c['cpu_step_s']:.1f} s; not a number to plan with)"
    )
    print()

    hb = c["heartbeat"]
    print("2. one rank's heartbeat record, as write_heartbeat writes it (EXP/heartbeat/rank{R}.json)")
    for phase in ("forward", "data"):
        r = hb[phase]
        print(
            f"   in phase {phase:<8}: {r['bytes']} bytes; as the relay's store value (JSON in JSON): {r['bundle_bytes']} bytes"
        )
    print(f"   the record waiting for data: {hb['data']['text']}")
    print()

    rec = hb["data"]["text"]
    s = store_costs(work, rec, c["rid"], a.rounds)
    t = np.array(s["set_multiget_s"]) * 1e3
    print(
        f"3. TCPStore on 127.0.0.1 (server in another process): one set ({s['bytes_per_set']} bytes) + one multi_get "
        f"of 64 records ({s['bytes_per_round_read'] / 1e3:.1f} kB)"
    )
    print(
        f"   median {np.median(t):.3f} ms per round (p10 {np.percentile(t, 10):.3f}, p90 {np.percentile(t, 90):.3f}) "
        f"over {a.rounds} rounds; the server's CPU {s['server_cpu_s_per_round'] * 1e3:.3f} ms per round "
        f"(over {10 * a.rounds} more)"
    )
    rl = s.get("relay")
    if rl:
        ch, sa = np.array(rl["changed_s"]) * 1e3, np.array(rl["same_s"]) * 1e3
        print(
            f"   the relay's cycle (Relay.push + Relay.pull, 63 other ranks; asrlab.lab.stall.relay.PERIOD_S = {rl['period_s']} s):"
        )
        print(
            f"     every record newer (63 files written): median {np.median(ch):.2f} ms (p90 {np.percentile(ch, 90):.2f}); "
            f"nothing new: median {np.median(sa):.2f} ms (p90 {np.percentile(sa, 90):.2f})"
        )
    else:
        print("   asrlab.lab.stall.relay is not in this tree: the relay's cycle not measured")
    print()

    w = watchdog_poll(work, rec, a.rounds)
    print(
        "4. the watchdog's poll, once a second per rank (write own heartbeat + timeline, rank errors, read every "
        "rank's heartbeat, the progress clock)"
    )
    for world, times in w.items():
        x = np.array(times) * 1e3
        print(
            f"   {world:>2} ranks' files: median {np.median(x):.2f} ms per poll (p90 {np.percentile(x, 90):.2f}) "
            f"= {np.median(x) / 10:.3f}% of one core"
        )
    slope = (np.median(w[64]) - np.median(w[8])) / 56 * 1e6
    print(f"   slope: {slope:.1f} us per further rank's file")
    print()

    print(
        f"5. reading the index at scale (use_index in a fresh process, 3 times, medians; {a.index_utts:,} utterances in "
        "sources of 1,000; nothing but the index read)"
    )
    for key_len, text_len, secs, what in (
        (10, 9, 0.65, "keys and transcripts as startup.py's (0.3-1.0 s tones)"),
        (40, 180, 12.0, "40-char keys, 180-char transcripts (12 s at 15 chars/s)"),
    ):
        r = index_at_scale(work, a.index_utts, key_len, text_len, secs)
        n = r["n"]
        print(f"   {what}:")
        print(
            f"     file {r['file_bytes'] / n:.0f} bytes per utterance; read {r['read_s'] / n * 1e6:.1f} us per utterance "
            f"({', '.join(f'{x:.2f}' for x in r['read_runs'])} s); resident memory {r['rss_steady'] / n:.0f} bytes per utterance after reading "
            f"(peak {r['rss_peak'] / n:.0f}: what was freed stays with the process)"
        )
        print(
            f"     pre-flight layout for 64 ranks x 4 workers: {r['layout_s'] / n * 1e6:.1f} us per utterance "
            f"({r['layout_s']:.2f} s); a forked child's full gc copies {r['fork_gc_copied'] / n:.0f} bytes per utterance"
        )
    print()

    b = index_build(work)
    print("6. building the index: index_source on one shard, single process, shard in the page cache (median of 5)")
    for name in ("short", "long"):
        r = b[name]
        print(
            f"   {r['utts']:>5} utterances, {r['bytes'] / 1e6:.1f} MB, {r['audio_h'] * 60:.1f} min of audio: {r['s'] * 1e3:.1f} ms "
            f"= {r['s'] / r['audio_h']:.2f} s per hour of audio"
        )
    print(
        f"   t = a x utterances + b x MB: a = {b['per_utt_s'] * 1e6:.1f} us per utterance, b = {b['per_mb_s'] * 1e3:.2f} ms per MB "
        f"({1 / b['per_mb_s']:.0f} MB/s from the page cache)"
    )
    print()
    print(f"wall clock {time.perf_counter() - t_all:.0f} s; load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
