"""The images workload's peers: shuffled batches of JPEGs from one ImageFolder tree (made by
`bench/images.py make`), RandomResizedCrop(224) and a horizontal flip, as uint8 (B, 3, 224, 224)
and int64 labels.

The CPU peers decode with Pillow and crop with torchvision's v2 transforms in worker processes:
DataLoader(ImageFolder); WebDataset's WebLoader over tar shards its ShardWriter wrote; LitData
over chunks `optimize` wrote (the JPEG bytes; it decodes them with torchvision); Mosaic over MDS
shards (`jpeg` column, the files' bytes). torchvision's GPU decode reads the files' bytes in
DataLoader workers and decodes a batch with nvJPEG. SPDL's pipeline (peers_spdl.py) runs in
threads of this process and decodes with spdl.io's nvJPEG where it loads, else with Pillow.
pinfeed's ImageLoader decodes on the CPU (`pinfeed`) or with nvJPEG (`pinfeed-gpu`). A checked
batch must have the shape, dtype, value range and labels of the tree.
"""

import os
import sys

import numpy as np

from lib.peers_measure import Peer, Skip, converted, mark_converted, to_device

SIZE = 224


def files(root):
    """(path, label) of every JPEG, classes in sorted order as ImageFolder numbers them."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    return [
        (os.path.join(root, c, f), k)
        for k, c in enumerate(classes)
        for f in sorted(os.listdir(os.path.join(root, c)))
    ], len(classes)


def _rgb(img):
    """An RGB PIL image, or a 3-channel uint8 tensor (a grayscale one repeated)."""
    if hasattr(img, "convert"):
        return img.convert("RGB")
    return img.expand(3, -1, -1) if img.shape[0] == 1 else img[:3]


def augment():
    from torchvision.transforms import v2

    return v2.Compose(
        [
            v2.Lambda(_rgb),
            v2.RandomResizedCrop(SIZE, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.PILToTensor(),
        ]
    )


def checker(classes):
    def check(batch):
        x, y = batch[0], batch[1]
        if x.dtype != np.uint8 or x.shape[1:] != (3, SIZE, SIZE):
            raise AssertionError(f"images {x.dtype} {x.shape}")
        if len(y) != len(x) or y.min() < 0 or y.max() >= classes:
            raise AssertionError(f"labels {y} for {classes} classes")
        if x.max() == x.min():
            raise AssertionError("a batch of one value")

    return check


def _loop(make):
    def batches():
        while True:
            yield from make()

    return batches


def _settings(a, **more):
    return {"num_workers": a.workers, "pin_memory": True, "batch_size": a.batch, **more}


def dataloader(a):
    import torch
    import torchvision
    from torchvision.datasets import ImageFolder

    _, classes = files(a.images)
    return Peer(
        _loop(
            lambda: torch.utils.data.DataLoader(
                ImageFolder(a.images, transform=augment()),
                batch_size=a.batch,
                shuffle=True,
                num_workers=a.workers,
                pin_memory=True,
                drop_last=True,
                prefetch_factor=4 if a.workers else None,
            )
        ),
        a.batch,
        checker(classes),
        _settings(a, prefetch_factor=4, decode="Pillow"),
        f"torchvision {torchvision.__version__}",
    )


def webdataset_peer(a):
    import webdataset as wds

    items, classes = files(a.images)
    out = os.path.join(a.data, "peers", "webdataset-images")
    per_shard = max(1, min(1000, len(items) // (4 * max(1, a.workers))))
    if not converted(out):
        os.makedirs(out, exist_ok=True)
        with wds.ShardWriter(os.path.join(out, "train-%06d.tar"), maxcount=per_shard) as w:
            for i, (path, label) in enumerate(items):
                with open(path, "rb") as f:
                    w.write({"__key__": f"{i:08d}", "jpg": f.read(), "cls": label})
        mark_converted(out)
    urls = sorted(os.path.join(out, f) for f in os.listdir(out) if f.endswith(".tar"))

    def make():
        return (
            wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
            .shuffle(1000)
            .decode("pil")
            .to_tuple("jpg", "cls")
            .map_tuple(augment(), int)
            .batched(a.batch, partial=False)
        )

    return Peer(
        _loop(
            lambda: wds.WebLoader(make(), batch_size=None, num_workers=a.workers, pin_memory=True)
        ),
        a.batch,
        checker(classes),
        _settings(a, shards=len(urls), per_shard=per_shard, shuffle_buffer=1000, decode="Pillow"),
        f"webdataset {getattr(wds, '__version__', '1.0.2')}",
    )


def _litdata_image(item):
    from PIL import Image

    path, label = item
    return {"image": Image.open(path), "label": label}


_AUGMENT = []


def _litdata_augment(sample):
    # A module-level function: litdata's `optimize` leaves multiprocessing on spawn, which
    # pickles the dataset, and its transform, into each worker.
    if not _AUGMENT:
        _AUGMENT.append(augment())
    return _AUGMENT[0](sample["image"]), sample["label"]


def litdata_peer(a):
    import litdata
    from litdata import StreamingDataLoader, StreamingDataset

    items, classes = files(a.images)
    out = os.path.join(a.data, "peers", "litdata-images")
    if not converted(out):
        litdata.optimize(
            fn=_litdata_image,
            inputs=items,
            output_dir=out,
            chunk_bytes="64MB",
            num_workers=a.workers,
            verbose=False,
        )
        mark_converted(out)
    return Peer(
        _loop(
            lambda: StreamingDataLoader(
                StreamingDataset(out, shuffle=True, drop_last=True, transform=_litdata_augment),
                batch_size=a.batch,
                num_workers=a.workers,
                pin_memory=True,
                drop_last=True,
            )
        ),
        a.batch,
        checker(classes),
        _settings(a, writer="optimize(PIL JPEG, chunk_bytes=64MB)", decode="torchvision CPU"),
        f"litdata {litdata.__version__}",
    )


def mosaic_peer(a):
    import streaming
    import torch
    from PIL import Image
    from streaming import MDSWriter, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    items, classes = files(a.images)
    out = os.path.join(a.data, "peers", "mosaic-images")
    if not converted(out):
        with MDSWriter(out=out, columns={"image": "jpeg", "label": "int"}) as w:
            for path, label in items:
                w.write({"image": Image.open(path), "label": label})
        mark_converted(out)
    aug = augment()

    class Images(StreamingDataset):
        def __getitem__(self, i):
            s = super().__getitem__(i)
            return aug(s["image"]), s["label"]

    return Peer(
        _loop(
            lambda: torch.utils.data.DataLoader(
                Images(local=out, batch_size=a.batch, shuffle=True, shuffle_seed=0),
                batch_size=a.batch,
                num_workers=a.workers,
                pin_memory=True,
                drop_last=True,
            )
        ),
        a.batch,
        checker(classes),
        _settings(a, writer="MDSWriter(jpeg, int), 64 MiB shards", decode="Pillow"),
        f"mosaicml-streaming {streaming.__version__}",
    )


class _Bytes:
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        from torchvision.io import read_file

        return read_file(self.items[i][0]), self.items[i][1]


def _as_list(samples):
    import torch

    return [s[0] for s in samples], torch.tensor([s[1] for s in samples])


def torchvision_gpu(a):
    if not a.device.startswith("cuda"):
        raise Skip("decode_jpeg(device='cuda') needs a CUDA device")
    import torch
    import torchvision
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms import v2

    items, classes = files(a.images)
    crop = v2.Compose([v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip()])

    def deliver(batch, dev=a.device):
        data, labels = batch
        images = decode_jpeg(data, device=dev, mode=ImageReadMode.RGB)
        return torch.stack([crop(im) for im in images]), labels.to(dev, non_blocking=True)

    return Peer(
        _loop(
            lambda: torch.utils.data.DataLoader(
                _Bytes(items),
                batch_size=a.batch,
                shuffle=True,
                num_workers=a.workers,
                collate_fn=_as_list,
                drop_last=True,
            )
        ),
        a.batch,
        checker(classes),
        _settings(a, pin_memory=False, decode="decode_jpeg(list, device=cuda), crop per image"),
        f"torchvision {torchvision.__version__}",
        deliver,
    )


def spdl_peer(a):
    from lib.peers_spdl import spdl_peer as make

    return make(a)


def dali_peer(a):
    try:
        import nvidia.dali  # noqa: F401
    except Exception:
        raise Skip(
            "DALI not carried: its wheel (nvidia-dali-cuda120) is 199 MB, over the 64 MiB one "
            "device call carries"
        ) from None
    raise Skip("DALI imports here, but this harness has no DALI pipeline yet")


def _pinfeed(decode):
    def make(a):
        import pinfeed

        if decode == "gpu" and not a.device.startswith("cuda"):
            raise Skip("decode='gpu' (nvJPEG) needs a CUDA device")
        _, classes = files(a.images)

        def batches():
            loader = pinfeed.ImageLoader(
                a.images, a.batch, SIZE, decode=decode, shuffle=True, seed=0, device=a.device
            )
            while True:
                yield from loader

        return Peer(
            batches,
            a.batch,
            checker(classes),
            {"decode": decode, "num_threads": "pinfeed's own", "prefetch": 4},
            pinfeed.__version__,
            to_device,
        )

    return make


PEERS = {
    "dataloader": dataloader,
    "webdataset": webdataset_peer,
    "litdata": litdata_peer,
    "mosaic": mosaic_peer,
    "torchvision-gpu": torchvision_gpu,
    "spdl": spdl_peer,
    "dali": dali_peer,
    "pinfeed": _pinfeed("cpu"),
    "pinfeed-gpu": _pinfeed("gpu"),
}

if __name__ == "__main__":
    sys.exit("run through bench/peers.py")
