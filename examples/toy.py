"""A tiny speech-like task for the example loops: keyed "utterances" (random fbank-like frames, a
label sequence), a small CTC model, and faults to inject through ``TOY_FAULT`` (``kind:rank:step``):

* ``hang_data:1:6``   rank 1's data-loader worker blocks forever fetching its batch of step 6
* ``raise:1:6``       rank 1 raises in its forward pass of step 6 (a bug in the model code, say) while
                      rank 0 goes on into the gradient all-reduce
* ``uneven:1:0``      rank 1 has a fifth fewer utterances than rank 0
* ``overflow:0:6``    rank 0's batch of step 6 holds an utterance whose frames are 3e4 times larger
* ``slow_data:1:0``   every read of rank 1's data-loader workers takes 50 ms more (a slow disk, say)
* ``barrier:0:6``     rank 0 alone calls a barrier in its forward pass of step 6 (code on one rank's branch),
                      while rank 1 goes on into the gradient all-reduce
* ``vanish:1:13``     rank 1 is killed (SIGKILL: the OOM killer, a lost node) in its forward pass of step 13
* ``spin:0:6``        rank 0 spins forever in its forward pass of step 6 (a loop that never ends), while
                      rank 1 goes on into the gradient all-reduce
"""

from __future__ import annotations

import os
import signal
import time

import torch
from torch import nn

FRAMES, MEL, VOCAB = 48, 40, 12


def fault() -> tuple[str, int, int]:
    kind, rank, step = (os.environ.get("TOY_FAULT") or "none:-1:-1").split(":")
    return kind, int(rank), int(step)


class Utterances(torch.utils.data.Dataset):
    """``n`` keyed utterances, each made from its index alone (the same on every run and rank)."""

    def __init__(self, n: int = 512, batch: int = 8):
        self.n, self.batch = n, batch

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        kind, rank, _ = fault()
        if kind == "slow_data" and rank == int(os.environ.get("RANK", "0")):
            time.sleep(0.05)
        if i < 0:  # index -1 - i: utterance i with the fault of TOY_FAULT
            return self._faulty(-1 - i)
        g = torch.Generator().manual_seed(i)
        labels = torch.randint(1, VOCAB, (6,), generator=g)
        feats = torch.randn(FRAMES, MEL, generator=g) + labels.repeat_interleave(FRAMES // 6)[:, None] * 0.3
        return {"key": f"utt{i:04d}", "feats": feats, "labels": labels}

    def _faulty(self, i: int) -> dict:
        kind = fault()[0]
        if kind == "hang_data":
            while True:
                time.sleep(1)
        x = self[i]
        if kind == "overflow":
            x["feats"] = x["feats"] * 3e4
        return x


class Batches(torch.utils.data.Sampler):
    """Each rank's batches of indices for an epoch (shuffled by seed and epoch alone, so that a resumed
    epoch's batches are the same again and the uneven guard can skip those already trained)."""

    def __init__(self, data: Utterances, rank: int, world: int, seed: int = 0):
        self.data, self.rank, self.world, self.seed = data, rank, world, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Shuffle for ``epoch``."""
        self.epoch = epoch

    def _mine(self) -> list[list[int]]:
        order = torch.randperm(len(self.data), generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        mine = order[self.rank :: self.world]
        kind, rank, _ = fault()
        if kind == "uneven" and rank == self.rank:
            mine = mine[: len(mine) * 4 // 5]
        return [mine[i : i + self.data.batch] for i in range(0, len(mine) - self.data.batch + 1, self.data.batch)]

    def __len__(self) -> int:
        return len(self._mine())

    def __iter__(self):
        kind, rank, step = fault()
        for b, idx in enumerate(self._mine(), 1):
            if rank == self.rank and b == step:
                idx = [-1 - idx[0]] + idx[1:]  # a marked utterance: the dataset applies the fault to it
            yield idx


def collate(items: list) -> dict:
    return {
        "keys": [x["key"] for x in items],
        "feats": torch.stack([x["feats"] for x in items]),
        "labels": torch.stack([x["labels"] for x in items]),
    }


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.proj = nn.Linear(MEL, 128)
        self.hidden = nn.Sequential(nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 128), nn.ReLU())
        self.out = nn.Linear(128, VOCAB)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        kind, rank, step = fault()
        if kind == "raise" and rank == int(os.environ.get("RANK", "0")) and self.calls == step:
            raise RuntimeError(f"shapes do not match in the joiner: {tuple(feats.shape)} vs (8, 50, 40)")
        if kind == "vanish" and rank == int(os.environ.get("RANK", "0")) and self.calls == step:
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "barrier" and rank == int(os.environ.get("RANK", "0")) and self.calls == step:
            torch.distributed.barrier()
        while kind == "spin" and rank == int(os.environ.get("RANK", "0")) and self.calls == step:
            pass
        return self.out(self.hidden(self.proj(feats))).log_softmax(-1)


def loss_fn(model: nn.Module, batch: dict) -> torch.Tensor:
    """CTC loss of a batch (frames are all valid; six labels each)."""
    log_probs = model(batch["feats"]).float().transpose(0, 1)
    n = batch["feats"].shape[0]
    return nn.functional.ctc_loss(log_probs, batch["labels"], torch.full((n,), FRAMES), torch.full((n,), 6))
