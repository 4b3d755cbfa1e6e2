"""A stranger's loop with asrlab's parts added as the README shows them (a stall watch, the uneven guard):
a small frame classifier on synthetic feature "files", a DataLoader with two workers, 2 gloo ranks under
torchrun. ``HANG=R:I``: on rank R, reading utterance I never returns (a dead network mount), so rank R waits
for data and the others wait for it. ``python parts_loop.py EXP``."""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from asrlab import lab


class FeatureFiles(Dataset):
    def __init__(self, n, hang):
        self.n, self.hang = n, hang

    def __len__(self):
        return self.n

    def read_utterance(self, i):
        if i == self.hang:
            while True:  # a read from a mount that went away: never returns
                time.sleep(1)
        g = torch.Generator().manual_seed(i)
        return torch.randn(30, 16, generator=g), i % 4

    def __getitem__(self, i):
        feats, label = self.read_utterance(i)
        return {"feats": feats, "label": label, "key": f"utt{i:04d}"}


def main(exp):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    hang_rank, hang_item = (int(x) for x in (os.environ.get("HANG") or "-1:-1").split(":"))
    data = FeatureFiles(64, hang_item if rank == hang_rank else -1)
    sampler = DistributedSampler(data, shuffle=False)
    loader = DataLoader(data, batch_size=4, sampler=sampler, num_workers=2)
    net = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    watch = lab.StallWatch(exp, timeout_s=float(os.environ.get("TIMEOUT_S", "5")), first_step_s=60).start()
    for batch in watch.data(lab.UnevenGuard(loader)):
        logits = net(batch["feats"]).mean(dim=1)
        loss = torch.nn.functional.cross_entropy(logits, batch["label"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.05)
    watch.stop()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
