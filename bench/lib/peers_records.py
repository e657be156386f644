"""The records workload's peers: shuffled batches of 3x31x31 uint8 records from the seed-shaped
.npy file (4 GiB on the GPU machine).

torch's DataLoader reads the memmapped file a batch at a time (`__getitems__`, its batched-fetch
hook); torchdata.nodes gathers batches in threads and pins them in its PinMemory node; LitData
and Mosaic read the records as numpy arrays their writers stored (`optimize` chunks of 64 MB, MDS
shards of 64 MiB); pinfeed's Loader reads the .npy. Every record of a checked batch is found in
the file by its first 16 bytes and compared byte for byte.
"""

import os
import sys

import numpy as np

from lib.peers_measure import Peer, Skip, converted, mark_converted

SHAPE = (3, 31, 31)


def make_records(path, records):
    """The seed-shaped file, as gpu_run.sh writes it without `pinfeed gen`."""
    if os.path.exists(path):
        return
    tmp = path + ".tmp.npy"
    a = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(records, *SHAPE))
    rng = np.random.default_rng(1)
    for i in range(0, records, 65536):
        a[i : i + 65536] = rng.integers(0, 256, size=a[i : i + 65536].shape, dtype=np.uint8)
    a.flush()
    del a
    os.replace(tmp, path)


def _keys(records):
    head = np.ascontiguousarray(records.reshape(len(records), -1)[:, :16]).view(np.uint64)
    return head[:, 0] ^ (head[:, 1] * np.uint64(0x9E3779B97F4A7C15))


def checker(path, data):
    """A check of a host batch of records: each one is a record of the file, byte for byte."""
    keys_path = os.path.join(data, "peers", "records-keys.npy")

    def check(batch):
        if isinstance(batch, (tuple, list)):
            batch = batch[0]
        src = np.load(path, mmap_mode="r")
        if batch.dtype != np.uint8 or batch.shape[1:] != src.shape[1:]:
            raise AssertionError(f"a batch of {batch.dtype} {batch.shape}")
        if not os.path.exists(keys_path):
            os.makedirs(os.path.dirname(keys_path), exist_ok=True)
            np.save(keys_path, _keys(src))
        keys = np.load(keys_path)
        order = np.argsort(keys, kind="stable")
        want = _keys(batch)
        at = np.searchsorted(keys, want, sorter=order)
        idx = order[np.minimum(at, len(order) - 1)]
        for k, i in enumerate(idx):
            if not np.array_equal(src[i], batch[k]):
                raise AssertionError(f"record {k} of the batch is not in the file")

    return check


class _Batched:
    """The file as a map-style dataset whose batched fetch is one fancy index."""

    def __init__(self, path):
        self.path, self.arr = path, None

    def __len__(self):
        return len(np.load(self.path, mmap_mode="r"))

    def __getitems__(self, indices):
        import torch

        if self.arr is None:  # opened in each worker
            self.arr = np.load(self.path, mmap_mode="r")
        return torch.from_numpy(self.arr[np.asarray(indices)])

    def __getitem__(self, i):
        return self.__getitems__([i])[0]


def _whole(batch):
    return batch


def dataloader(a):
    import torch

    ds = _Batched(a.records)

    def batches():
        while True:
            yield from torch.utils.data.DataLoader(
                ds,
                batch_size=a.batch,
                shuffle=True,
                num_workers=a.workers,
                pin_memory=True,
                prefetch_factor=4 if a.workers else None,
                collate_fn=_whole,
            )

    return Peer(
        batches,
        a.batch,
        checker(a.records, a.data),
        {
            "dataset": "np.load(mmap) with __getitems__",
            "num_workers": a.workers,
            "pin_memory": True,
            "prefetch_factor": 4,
        },
        f"torch {torch.__version__}",
    )


def torchdata_nodes(a):
    import torch
    import torchdata
    from torchdata import nodes

    ds = _Batched(a.records)

    def batches():
        node = nodes.SamplerWrapper(torch.utils.data.RandomSampler(range(len(ds))))
        node = nodes.Batcher(node, batch_size=a.batch)
        node = nodes.ParallelMapper(
            node, map_fn=ds.__getitems__, num_workers=a.workers, method="thread"
        )
        if a.device.startswith("cuda"):
            node = nodes.PinMemory(node)
        node = nodes.Prefetcher(node, prefetch_factor=4)
        while True:
            yield from nodes.Loader(node)

    return Peer(
        batches,
        a.batch,
        checker(a.records, a.data),
        {
            "graph": "SamplerWrapper > Batcher > ParallelMapper(thread) > PinMemory > Prefetcher",
            "num_workers": a.workers,
        },
        f"torchdata {torchdata.__version__}",
    )


def _litdata_records(item):
    path, start, end = item
    arr = np.load(path, mmap_mode="r")
    for i in range(start, end):
        yield np.asarray(arr[i])


def litdata_peer(a):
    import litdata
    from litdata import StreamingDataLoader, StreamingDataset

    out = os.path.join(a.data, "peers", "litdata-records")
    if not converted(out):
        n = len(np.load(a.records, mmap_mode="r"))
        step = max(1, n // 64)
        litdata.optimize(
            fn=_litdata_records,
            inputs=[(a.records, s, min(n, s + step)) for s in range(0, n, step)],
            output_dir=out,
            chunk_bytes="64MB",
            num_workers=a.workers,
            verbose=False,
        )
        mark_converted(out)

    def batches():
        ds = StreamingDataset(out, shuffle=True, drop_last=True)
        while True:
            yield from StreamingDataLoader(
                ds, batch_size=a.batch, num_workers=a.workers, pin_memory=True, drop_last=True
            )

    return Peer(
        batches,
        a.batch,
        checker(a.records, a.data),
        {
            "writer": "optimize(numpy records, chunk_bytes=64MB)",
            "reader": "StreamingDataset(shuffle) + StreamingDataLoader",
            "num_workers": a.workers,
            "pin_memory": True,
        },
        f"litdata {litdata.__version__}",
    )


def mosaic_peer(a):
    import streaming
    import torch
    from streaming import MDSWriter, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    out = os.path.join(a.data, "peers", "mosaic-records")
    if not converted(out):
        arr = np.load(a.records, mmap_mode="r")
        with MDSWriter(out=out, columns={"x": "ndarray:uint8:3,31,31"}) as w:
            for s in range(0, len(arr), 65536):
                for r in np.asarray(arr[s : s + 65536]):
                    w.write({"x": r})
        mark_converted(out)

    class Records(StreamingDataset):
        def __getitem__(self, i):
            return torch.from_numpy(super().__getitem__(i)["x"])

    def batches():
        ds = Records(local=out, batch_size=a.batch, shuffle=True, shuffle_seed=0)
        while True:
            yield from torch.utils.data.DataLoader(
                ds, batch_size=a.batch, num_workers=a.workers, pin_memory=True, drop_last=True
            )

    return Peer(
        batches,
        a.batch,
        checker(a.records, a.data),
        {
            "writer": "MDSWriter(ndarray:uint8:3,31,31), default 64 MiB shards",
            "reader": "StreamingDataset(shuffle py1e) + DataLoader",
            "num_workers": a.workers,
            "pin_memory": True,
        },
        f"mosaicml-streaming {streaming.__version__}",
    )


def pinfeed_peer(a):
    import pinfeed

    def batches():
        loader = pinfeed.Loader(a.records, a.batch, shuffle=True, seed=0, device=a.device)
        while True:
            yield from loader

    return Peer(
        batches,
        a.batch,
        checker(a.records, a.data),
        {"shuffle": True, "num_threads": "pinfeed's own", "prefetch": 4},
        pinfeed.__version__,
    )


PEERS = {
    "dataloader": dataloader,
    "torchdata": torchdata_nodes,
    "litdata": litdata_peer,
    "mosaic": mosaic_peer,
    "pinfeed": pinfeed_peer,
}

if __name__ == "__main__":
    sys.exit("run through bench/peers.py")

__all__ = ["PEERS", "Skip", "make_records"]
