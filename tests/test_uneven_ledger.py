"""A loop of the parts that is not asrlab's example, with uneven data (rank 1 holds 3x the utterances,
its batch's ids under ``key``): the ranks stop together, and the ledger and ``asrlab doctor`` say what
rank 1 never trained instead of calling the epoch complete."""

from __future__ import annotations

import gc
import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from asrlab import lab
from asrlab.doctor import diagnose, format_diagnosis


def collate(items):
    return {"key": [k for k, _ in items], "x": torch.stack([x for _, x in items])}


def _loop(rank: int, port: int, exp: str, mode: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(rank)
    items = [(f"r{rank}-u{i:02d}", torch.randn(4)) for i in range(8 if rank == 0 else 24)]
    loader = torch.utils.data.DataLoader(items, batch_size=2, collate_fn=collate)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    state = lab.RunState(exp, model, opt)
    guard = lab.UnevenGuard(loader, state=state, untrained=mode)
    for step, batch in enumerate(guard, 1):
        model(batch["x"]).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        state.record(step, 0, batch["key"])
    state.close()
    guard.close()
    Path(exp, f"left{rank}.json").write_text(json.dumps(guard.left))
    # DDP let go before the group: DDP's reducer, freed holding the GIL while it holds the group's last
    # reference, would destroy the group there and join a gloo thread that waits for the GIL (PyTorch's)
    del model, opt, state, guard
    gc.collect()
    dist.destroy_process_group()


@pytest.mark.parametrize("mode", ["count", "keys"])
def test_what_a_rank_left_untrained_is_counted_and_the_epoch_is_not_called_complete(tmp_path, mode):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exp = tmp_path / "exp"
    exp.mkdir()
    mp.spawn(_loop, args=(port, str(exp), mode), nprocs=2, join=True)
    assert json.loads((exp / "left0.json").read_text()) is None  # rank 0 ran out: it left nothing
    left = json.loads((exp / "left1.json").read_text())
    # both trained 4 batches; rank 1 had 12: 8 batches, 16 utterances left (counted exactly with "keys";
    # from the loader's length and the batch it held otherwise)
    assert left["batches"] == 8 and left["utterances"] == 16 and left["exact"] == (mode == "keys")
    want = [f"r1-u{i:02d}" for i in range(8, 24)]
    assert left["keys"] == (want if mode == "keys" else want[:2])

    d = diagnose(exp)
    (epoch,) = d["coverage"]["epochs"]
    assert epoch["keys"] == 16 and epoch["exactly_once"] is False and d["coverage"]["broken"] and not d["ok"]
    assert epoch["cut_short"]["1"]["utterances"] == 16 and "0" not in epoch["cut_short"]
    text = format_diagnosis(d)
    assert "each exactly once" not in text
    assert f"rank 1: left {'' if mode == 'keys' else 'about '}16 utterances (8 batches) untrained" in text
    assert "r1-u08" in text


def test_the_guard_resumes_without_a_loader_state():
    """``UnevenGuard.state_dict()`` with no ``state_of``: the batches handed out; a resumed guard skips them."""
    guard = lab.UnevenGuard(range(10))
    it = iter(guard)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    state = guard.state_dict()
    resumed = lab.UnevenGuard(range(10))
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert list(resumed) == list(range(3, 10)) and resumed.state_dict()["batches"] == 10
    with pytest.raises(ValueError, match="version"):
        resumed.load_state_dict({**state, "uneven_guard": 99})
    with pytest.raises(ValueError, match="not a state of UnevenGuard"):
        resumed.load_state_dict({"fetched": 3})
