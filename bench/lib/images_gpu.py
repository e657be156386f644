"""JPEG training input on the GPU machine: torchvision's ways against pinfeed's (issue 19).

    python3 bench/images.py loaders DATA/train [--batch-size 256] [--workers 16] [--train-steps 60]
                                  [--out bench/results/$(date +%F)-h200/images.json]

DATA/train is an ImageFolder tree of JPEGs from bench/images.py make (page-cached first). Each
column streams one epoch of it to the GPU, shuffled, as RandomResizedCrop(224) + flip, uint8:

  (a) DataLoader(ImageFolder, RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor,
      num_workers=--workers, pin_memory=True), batches moved with .cuda(non_blocking=True);
  (b) torchvision.io.decode_jpeg(device="cuda") on batches of file bytes (read in the main
      thread), then RandomResizedCrop + flip on the GPU, image by image (a JPEG nvJPEG refuses,
      such as CMYK, is decoded on the CPU and counted);
  (c) pinfeed.ImageLoader(decode="cpu"): Rust decode on the reader threads, into pinned slots;
  (d) pinfeed.ImageLoader(decode="gpu"): the reader threads read the JPEG bytes into pinned
      slots, nvJPEG decodes them on the GPU (hardware engines where present) and crops there;
      skipped, with the reason printed, where nvJPEG cannot load.

Images/s and CPU seconds per 1000 images (this process and its children: os.times(), which
counts DataLoader workers once they exit). Then a resnet50 training loop (channels_last,
bf16 autocast, SGD) fed by (a), (c) and (d), normalised on the GPU, against its bound: the same
steps on one batch already on the GPU. Prints a table; --out writes everything as JSON.
"""

import argparse
import json
import os
import time

import torch
import torchvision
from torchvision import transforms
from torchvision.io import ImageReadMode, decode_jpeg, read_file
from torchvision.transforms import v2 as transforms_v2

import pinfeed

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def cpu_seconds():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def measure(batches, limit=None):
    """(images, wall s, CPU s) of draining `batches` (a callable giving an iterable of
    (images, labels) on the GPU), the device synchronised at both ends."""
    torch.cuda.synchronize()
    c0, t0 = cpu_seconds(), time.perf_counter()
    n = 0
    for x, _ in batches():
        n += len(x)
        if limit is not None and n >= limit:
            break
    torch.cuda.synchronize()
    return n, time.perf_counter() - t0, cpu_seconds() - c0


def dataloader(root, batch, workers, size):
    tf = transforms.Compose(
        [
            transforms.RandomResizedCrop(size),
            transforms.RandomHorizontalFlip(),
            transforms.PILToTensor(),
        ]
    )
    ds = torchvision.datasets.ImageFolder(root, transform=tf)
    dl = torch.utils.data.DataLoader(
        ds, batch_size=batch, shuffle=True, num_workers=workers, pin_memory=True
    )

    def batches():
        for x, y in dl:
            yield x.cuda(non_blocking=True), y.cuda(non_blocking=True)

    return batches


def nvjpeg(root, batch, size, fallbacks):
    files = torchvision.datasets.ImageFolder(root).samples
    crop = transforms_v2.RandomResizedCrop(size, antialias=True)
    flip = transforms_v2.RandomHorizontalFlip()

    def decode(datas):
        try:
            return decode_jpeg(datas, mode=ImageReadMode.RGB, device="cuda")
        except RuntimeError:
            out = []
            for d in datas:
                try:
                    out.append(decode_jpeg(d, mode=ImageReadMode.RGB, device="cuda"))
                except RuntimeError:
                    fallbacks[0] += 1
                    out.append(decode_jpeg(d, mode=ImageReadMode.RGB).cuda())
            return out

    def batches():
        order = torch.randperm(len(files)).tolist()
        for k in range(0, len(order), batch):
            idx = order[k : k + batch]
            datas = [read_file(files[i][0]) for i in idx]
            images = decode(datas)
            x = torch.stack([flip(crop(im)) for im in images])
            y = torch.tensor([files[i][1] for i in idx]).cuda(non_blocking=True)
            yield x, y

    return batches


def pinfeed_loader(root, batch, size, decode, threads, **kw):
    loader = pinfeed.ImageLoader(
        root,
        batch_size=batch,
        size=size,
        decode=decode,
        shuffle=True,
        device="cuda",
        num_threads=threads,
        **kw,
    )
    return (lambda: iter(loader)), loader


def resnet_share(feeds, steps, batch, size):
    """Seconds a step for the bound and for each feed (name -> callable giving batches of
    normalised NCHW float images), and the share of the bound each reaches."""
    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x.contiguous(memory_format=torch.channels_last)), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    x0 = torch.randn(batch, 3, size, size, device="cuda")
    y0 = torch.randint(0, 1000, (batch,), device="cuda")
    warm = 10
    for _ in range(warm):
        step(x0, y0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step(x0, y0)
    torch.cuda.synchronize()
    bound = (time.perf_counter() - t0) / steps
    out = {"bound_s_per_step": bound}
    for name, make in feeds.items():
        it = make()
        for _ in range(warm):
            step(*next(it))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        done = 0
        for x, y in it:
            step(x, y)
            done += 1
            if done == steps:
                break
        torch.cuda.synchronize()
        per = (time.perf_counter() - t0) / max(done, 1)
        out[name] = {"s_per_step": per, "share_of_bound": bound / per, "steps": done}
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--threads", type=int, default=None, help="pinfeed reader threads")
    p.add_argument("--train-steps", type=int, default=60)
    p.add_argument("--out")
    a = p.parse_args()
    b, size = a.batch_size, a.size
    result = {"batch_size": b, "size": size, "workers": a.workers, "cores": os.cpu_count()}
    rows = {}
    fallbacks = [0]
    feeds = {
        "(a) DataLoader + PIL": dataloader(a.root, b, a.workers, size),
        "(b) decode_jpeg cuda": nvjpeg(a.root, b, size, fallbacks),
    }
    c_batches, c_loader = pinfeed_loader(a.root, b, size, "cpu", a.threads)
    feeds["(c) pinfeed cpu"] = c_batches
    skipped = {}
    try:
        d_batches, _ = pinfeed_loader(a.root, b, size, "gpu", a.threads)
        feeds["(d) pinfeed gpu"] = d_batches
    except pinfeed.PinfeedError as e:
        skipped["(d) pinfeed gpu"] = str(e)
    for name, batches in feeds.items():
        n, wall, cpu = measure(batches)
        rows[name] = {
            "images": n,
            "wall_s": wall,
            "cpu_s": cpu,
            "images_per_s": n / wall,
            "cpu_s_per_1000": 1000 * cpu / n,
        }
    rows["(b) decode_jpeg cuda"]["cpu_decoded_fallbacks"] = fallbacks[0]
    result["rows"], result["skipped"] = rows, skipped
    result["pinfeed_stats"] = {
        k: v for k, v in c_loader.stats().items() if isinstance(v, (int, float, str))
    }
    print(f"{'':24s} {'images/s':>9s} {'CPU s/1000':>10s}")
    for name, r in rows.items():
        print(f"{name:24s} {r['images_per_s']:9.0f} {r['cpu_s_per_1000']:10.2f}")
    for name, why in skipped.items():
        print(f"{name:24s} skipped: {why}")

    # resnet50 fed by (a), (c), (d): normalised float NCHW on the GPU.
    mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1)
    std = torch.tensor(STD, device="cuda").view(1, 3, 1, 1)

    def normalised(make):
        def batches():
            for x, y in make():
                yield (x.float() / 255 - mean) / std, y

        return batches

    train = {"(a) DataLoader + PIL": normalised(feeds["(a) DataLoader + PIL"])}

    def pinfeed_train(decode):
        batches, _ = pinfeed_loader(a.root, b, size, decode, a.threads, mean=MEAN, std=STD)
        return batches

    train["(c) pinfeed cpu"] = pinfeed_train("cpu")
    if "(d) pinfeed gpu" in feeds:
        train["(d) pinfeed gpu"] = pinfeed_train("gpu")
    result["resnet50"] = resnet_share(train, a.train_steps, b, size)
    r = result["resnet50"]
    print(
        f"resnet50 bf16 channels_last, batch {b}: bound {1000 * r['bound_s_per_step']:.1f} ms/step"
    )
    for name in train:
        print(
            f"  {name:24s} {1000 * r[name]['s_per_step']:7.1f} ms/step  {100 * r[name]['share_of_bound']:5.1f}% of bound"
        )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
