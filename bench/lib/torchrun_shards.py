"""torchrun --nproc_per_node=2 bench/records.py torchrun OUTDIR

Two processes share one GPU; each streams its shard of a numbered dataset with
pinfeed.Loader(shuffle=True) for two epochs. Rank 0 checks that, in each epoch, the shards are
disjoint apart from the documented padding and together hold every record; prints one line per
epoch and writes OUTDIR/torchrun_shards.json.
"""

import json
import os
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist

import pinfeed


def main():
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    n, batch = 100_003, 1000
    path = os.path.join(tempfile.gettempdir(), "pinfeed-numbered.npy")
    if rank == 0:
        np.save(path, np.arange(n, dtype=np.int64).reshape(n, 1).repeat(4, axis=1))
    dist.barrier()
    loader = pinfeed.Loader(path, batch, device="cuda", shuffle=True, seed=5)
    report = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        ids = []
        for x in loader:
            assert x.device.type == "cuda"
            assert torch.equal(x[:, 0], x[:, 3]), "record torn"
            ids.append(x[:, 0].cpu().numpy())
        mine = np.concatenate(ids)
        gathered = [None] * world
        dist.all_gather_object(gathered, (len(loader), mine))
        if rank == 0:
            counts = np.bincount(np.concatenate([g[1] for g in gathered]), minlength=n)
            padding = -n % world
            r = {
                "epoch": epoch,
                "world_size": world,
                "batches_per_rank": [g[0] for g in gathered],
                "records_per_rank": [len(g[1]) for g in gathered],
                "every_record_seen": bool((counts >= 1).all()),
                "seen_twice": int((counts == 2).sum()),
                "documented_padding": padding,
                "overlap_between_ranks": int((counts > 1).sum()),
                "ok": bool(
                    (counts >= 1).all()
                    and (counts <= 2).all()
                    and int((counts == 2).sum()) == padding
                ),
            }
            report.append(r)
            print(json.dumps(r))
    if rank == 0:
        with open(os.path.join(out, "torchrun_shards.json"), "w") as f:
            json.dump(report, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
