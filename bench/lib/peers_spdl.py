"""The images workload's SPDL peer (Meta's SPDL: `spdl.pipeline` from spdl_core, `spdl.io` from
spdl_io), built as SPDL documents it: stages of one pipeline run in a thread pool of the trainer's
process (no worker processes), fed by a source of shuffled indices (`repeat_source` over a
`DistributedRandomSampler`, reshuffled each epoch), batched by `aggregate`, the batch buffered in
its sink.

Two paths, and the row's `decode` setting says which ran:

- `spdl.io` nvJPEG (a CUDA device, and `spdl.io` decodes a probe JPEG): threads read the files'
  bytes, `load_image_batch_nvjpeg` decodes a batch on the GPU and resizes it with NPP to 256x256
  (the aspect ratio not kept; SPDL's ImageNet example resizes to 224x224), then
  RandomResizedCrop(224) and a flip are applied per image on the GPU (torchvision v2). The crop
  is taken from the 256x256 image, not from the JPEG's own size as the CPU peers take it.
- Pillow (any device, and wherever `spdl.io` cannot decode, its reason in the row): threads
  decode with Pillow and apply the CPU peers' `augment()`; a stage collates the batch (into
  pinned memory for a CUDA device), which the harness copies to the device.

`spdl.io` loads FFmpeg's shared libraries (libavutil ...) before its CUDA module, so without
them only the Pillow path runs.
"""

import importlib.metadata
import re

from lib.peers_images import SIZE, augment, checker, files
from lib.peers_measure import Peer

RESIZE = 256  # nvJPEG's NPP resize, before the crop
SINK = 16  # batches buffered in the sink: SPDL's ImageNet example's buffer_size


def _version():
    found = []
    for dist in ("spdl_core", "spdl_io"):
        try:
            found.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return ", ".join(found) or "spdl"


def _source(n):
    from spdl.source import DistributedRandomSampler
    from spdl.source.utils import repeat_source

    return repeat_source(DistributedRandomSampler(n, rank=0, world_size=1))


def _pipeline(a, n, load, collate, collate_threads=1):
    """source -> pipe(load, concurrency=workers) -> aggregate(batch) -> pipe(collate) -> sink; a
    failed item stops the pipeline (max_failures=0) rather than dropping the item."""
    from spdl.pipeline import PipelineBuilder

    threads = max(1, a.workers)
    return (
        PipelineBuilder()
        .add_source(_source(n))
        .pipe(load, concurrency=threads)
        .aggregate(a.batch, drop_last=True)
        .pipe(collate, concurrency=min(collate_threads, threads))
        .add_sink(SINK)
        .build(num_threads=threads, max_failures=0)
    )


def _batches(make):
    def batches():
        pipeline = make()
        with pipeline.auto_stop():
            yield from pipeline

    return batches


def _why(e):
    """A short reason spdl.io cannot decode: the shared libraries it could not open, or the
    error."""
    missing = sorted(set(re.findall(r"(lib[\w+-]+\.so[.\d]*): cannot open", str(e))))
    if missing:
        return f"{type(e).__name__}: {', '.join(missing)} not found"
    return f"{type(e).__name__}: {str(e)[:300]}"


def _nvjpeg(a):
    """The batch decode of the nvJPEG path (bytes and labels in, images on the GPU out)."""
    import spdl.io
    import torch
    from torchvision.transforms import v2

    index = int(a.device.split(":")[1]) if ":" in a.device else 0
    config = spdl.io.cuda_config(
        device_index=index,
        allocator=(torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete),
    )
    crop = v2.Compose([v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip()])

    def decode(samples):
        data = [s[0] for s in samples]
        buffer = spdl.io.load_image_batch_nvjpeg(
            data, device_config=config, width=RESIZE, height=RESIZE, pix_fmt="rgb"
        )
        images = spdl.io.to_torch(buffer)
        if images.shape[1] != 3:  # NHWC
            images = images.permute(0, 3, 1, 2)
        x = torch.stack([crop(im) for im in images])
        return x, torch.tensor([s[1] for s in samples], dtype=torch.int64)

    return decode


def _probe(decode, path):
    """Decodes one JPEG as the pipeline will; raises unless it comes out right, on the GPU."""
    import torch

    with open(path, "rb") as f:
        x, _ = decode([(f.read(), 0)])
    if x.dtype != torch.uint8 or tuple(x.shape) != (1, 3, SIZE, SIZE) or not x.is_cuda:
        raise RuntimeError(f"probe decoded {x.dtype} {tuple(x.shape)} on {x.device}")


def _gpu_path(a, items):
    """(load, collate, its settings) of the nvJPEG path."""

    def load(i):
        path, label = items[i]
        with open(path, "rb") as f:
            return f.read(), label

    settings = {
        "decode": f"spdl.io nvJPEG: load_image_batch_nvjpeg(width={RESIZE}, height={RESIZE}), "
        f"then RandomResizedCrop({SIZE}) + flip per image on the GPU (a crop of the "
        f"{RESIZE}x{RESIZE} resize, aspect ratio not kept)",
        "stages": "pipe(read bytes, concurrency=num_threads) -> aggregate(batch_size) -> "
        "pipe(nvJPEG decode + crop, concurrency=num_threads)",
        "pin_memory": False,
    }
    decode = _nvjpeg(a)
    _probe(decode, items[0][0])
    return load, decode, settings


def _cpu_path(a, items, why):
    """(load, collate, its settings) of the Pillow path."""
    import torch
    from PIL import Image

    aug = augment()
    pin = a.device.startswith("cuda")

    def load(i):
        path, label = items[i]
        with Image.open(path) as image:
            return aug(image), label

    def collate(samples):
        x = torch.empty((len(samples), 3, SIZE, SIZE), dtype=torch.uint8, pin_memory=pin)
        torch.stack([s[0] for s in samples], out=x)
        return x, torch.tensor([s[1] for s in samples], dtype=torch.int64)

    settings = {
        "decode": f"Pillow decode in SPDL pipeline threads; spdl.io: {why}",
        "stages": "pipe(Pillow decode + RandomResizedCrop + flip, concurrency=num_threads) -> "
        "aggregate(batch_size) -> pipe(collate into a pinned tensor where CUDA)",
        "pin_memory": pin,
    }
    return load, collate, settings


def spdl_peer(a):
    import spdl.pipeline  # noqa: F401  (not installed: the row is skipped, saying so)

    items, classes = files(a.images)
    why = "not tried: nvJPEG needs a CUDA device"
    path = None
    if a.device.startswith("cuda"):
        try:
            path = _gpu_path(a, items)
        except Exception as e:  # spdl_io absent, FFmpeg or CUDA libraries missing, a bad probe
            why = _why(e)
    load, collate, more = path or _cpu_path(a, items, why)
    settings = {
        "num_threads": max(1, a.workers),
        "batch_size": a.batch,
        **more,
        "pipeline": "PipelineBuilder: add_source(repeat_source(DistributedRandomSampler)), the "
        f"stages, add_sink({SINK}); build(num_threads, max_failures=0)",
        "workers": "threads in the trainer process (SPDL's model), no worker processes",
    }
    collate_threads = max(1, a.workers) if path else 1
    return Peer(
        _batches(lambda: _pipeline(a, len(items), load, collate, collate_threads)),
        a.batch,
        checker(classes),
        settings,
        _version(),
    )
