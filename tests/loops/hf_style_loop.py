"""A stranger's loop in the Hugging Face style for the watched-run tests: a tiny causal LM on random token ids,
dict batches unpacked into ``model(**batch)`` that returns ``{"loss", "logits"}``, a sampler of its own that
shards batches by rank, a DataLoader with two workers, ``dist.barrier()`` after the loop (everyone waits
before the main process saves), nothing of asrlab.

``EXTRA`` batches more for rank 1 than for rank 0 (default 0: even data); ``BATCHES`` for rank 0 (default 10);
``READ_S`` seconds a worker takes per batch (default 0.15); ``SLOW=R:F``: rank R's reads take F times as long;
``RAISE=R:S``: rank R raises in step S (a batch the model refuses); ``EPOCHS`` (default 1); ``SYNC=1``: each
epoch begins with the ranks agreeing on a seed (a broadcast as the loader's iteration starts, as Accelerate's
prepared loaders do)."""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, Sampler

VOCAB, LENGTH, BATCH = 50, 12, 4


class RandomTokens(Dataset):
    def __init__(self, read_s):
        self.read_s = read_s

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        time.sleep(self.read_s / BATCH)  # a read from slow storage
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, VOCAB, (LENGTH,), generator=g)
        return {"input_ids": ids, "attention_mask": torch.ones(LENGTH, dtype=torch.long), "labels": ids.clone()}


class RankShards(Sampler):
    """Batches of indices for one rank; ``extra`` more than the others have (an uneven shard)."""

    def __init__(self, rank, batches, extra):
        self.rank, self.n = rank, batches + (extra if rank == 1 else 0)

    def __iter__(self):
        for b in range(self.n):
            yield [(self.rank * 1000 + b * BATCH + k) for k in range(BATCH)]

    def __len__(self):
        return self.n


class SeedSynced:
    """A loader whose iteration starts with a broadcast of rank 0's seed (Accelerate's RNG synchronisation)."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        seed = torch.tensor([torch.initial_seed() % 2**31])
        dist.broadcast(seed, 0)
        yield from self.loader


def collate(items):
    return {k: torch.stack([x[k] for x in items]) for k in items[0]}


class TinyCausalLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.head = torch.nn.Linear(32, VOCAB)

    def forward(self, input_ids, attention_mask, labels=None):
        logits = self.head(self.embed(input_ids) * attention_mask.unsqueeze(-1))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1)
            )
        return out


def main(output_dir):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(TinyCausalLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sampler = RankShards(rank, int(os.environ.get("BATCHES", "10")), int(os.environ.get("EXTRA", "0")))
    slow, factor = (os.environ.get("SLOW") or "-1:1").split(":")
    read_s = float(os.environ.get("READ_S", "0.15")) * (float(factor) if rank == int(slow) else 1.0)
    fail = [int(x) for x in (os.environ.get("RAISE") or "-1:-1").split(":")]
    train_dataloader = DataLoader(RandomTokens(read_s), batch_sampler=sampler, num_workers=2, collate_fn=collate)
    if os.environ.get("SYNC") == "1":
        train_dataloader = SeedSynced(train_dataloader)
    completed_steps = 0
    model.train()
    for epoch in range(int(os.environ.get("EPOCHS", "1"))):
        for step, batch in enumerate(train_dataloader):
            if [rank, step] == fail:
                raise ValueError(f"input_ids of shape {tuple(batch['input_ids'].shape)}: expected a longer context")
            outputs = model(**batch)
            loss = outputs["loss"]
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            completed_steps += 1
            if step % 4 == 0:
                print(f"rank {rank} epoch {epoch} step {step}: loss {loss.item():.4f}", flush=True)
    dist.barrier()  # wait for everyone before saving
    if rank == 0:
        os.makedirs(output_dir, exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(output_dir, "model.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
