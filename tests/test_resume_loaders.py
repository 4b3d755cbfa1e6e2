"""Exact resume of a loop's own loader, with one added line: a plain ``DataLoader`` over a
``DistributedSampler`` (``loader = lab.Resumable(loader)``). Two gloo ranks under torchrun; rank 1 killed (SIGKILL) in step 13, after the checkpoint of step
10; the resumed run ends with the same weights, bit for bit, as a run never killed, and every utterance
of each epoch trained exactly once. The loop also takes torchdata's ``StatefulDataLoader`` (its ``stateful``
kind: ``kind`` below, for a run by hand); the suite's killed and resumed ``StatefulDataLoader`` is
tests/test_uneven_loops.py's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from asrlab import lab

LOOP = textwrap.dedent("""
    import hashlib, os, signal, sys
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, Dataset, DistributedSampler
    from asrlab import lab

    class Clips(Dataset):
        def __len__(self):
            return 96
        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return {"utt_id": f"clip{i:03d}", "x": torch.randn(6, generator=g), "y": torch.randn(1, generator=g)}

    def collate(items):
        return {"utt_id": [b["utt_id"] for b in items], "x": torch.stack([b["x"] for b in items]),
                "y": torch.stack([b["y"] for b in items])}

    exp, kind, die_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sampler = DistributedSampler(Clips(), shuffle=True, seed=3)
    if kind == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader
        loader = StatefulDataLoader(Clips(), batch_size=4, sampler=sampler, num_workers=1, collate_fn=collate,
                                    generator=torch.Generator().manual_seed(0))  # its seed draws off the global RNG
    else:
        loader = DataLoader(Clips(), batch_size=4, sampler=sampler, num_workers=1, collate_fn=collate)
        loader = lab.Resumable(loader)  # the one added line
    state = lab.RunState(exp, model, opt, loader=loader)
    r = state.load() or {"step": 0, "epoch": 0}
    step = r["step"]
    for epoch in range(r["epoch"], 2):
        sampler.set_epoch(epoch)
        for batch in loader:
            loss = (model(batch["x"]) - batch["y"]).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            step += 1
            if step == die_at and rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            state.record(step, epoch, batch["utt_id"])
            if step % 5 == 0:
                state.save(step, epoch)
    if rank == 0:
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
        print("digest", digest, "step", step, flush=True)
    dist.destroy_process_group()
""")


def _run(script, exp, kind, die_at=0):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(script),
        str(exp),
        kind,
        str(die_at),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("kind", ["plain"])
def test_a_killed_run_resumes_exactly(tmp_path, kind):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    whole = _run(script, tmp_path / "whole", kind)
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = _run(script, tmp_path / "broken", kind, die_at=13)
    assert killed.returncode != 0
    resumed = _run(script, tmp_path / "broken", kind)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    line = [ln for ln in whole.stdout.splitlines() if ln.startswith("digest")]
    assert line and line == [ln for ln in resumed.stdout.splitlines() if ln.startswith("digest")], (
        whole.stdout,
        resumed.stdout,
    )
    keys = {f"clip{i:03d}" for i in range(96)}
    for epoch in (0, 1):
        cov = lab.coverage_report(tmp_path / "broken", epoch, keys)
        assert cov["exactly_once"], cov
    assert lab.read_ledger(tmp_path / "broken", 0)[-1]["step"] == 24  # 96 clips, 2 ranks, batches of 4, 2 epochs


def test_a_foreign_position_is_refused():
    loader = lab.Resumable([1, 2, 3])
    with pytest.raises(ValueError, match="not a position saved by lab.Resumable"):
        loader.load_state_dict({"fetched": 3})
    loader.load_state_dict({"resumable": 1, "batches": 2})
    assert list(loader) == [3] and loader.state_dict() == {"resumable": 1, "batches": 3}
