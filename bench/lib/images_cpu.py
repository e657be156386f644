"""pinfeed's CPU image decode against Pillow on this machine (no GPU needed).

    python3 bench/images.py cpu DATA/train [--limit 500] [--threads 1,2] [--out FILE.json]

DATA/train is an ImageFolder tree from bench/images.py make. Both sides do torchvision's
training transform on each image: decode, RandomResizedCrop(224) (the same boxes: pinfeed's,
from ``crop_of``), bilinear resize, flip, uint8 HWC. Pillow runs in this process on one core
(as one DataLoader worker does); pinfeed on its reader threads (``--threads``), host backend.
Prints images/s and CPU seconds per 1000 images; --out writes the rows as JSON.
"""

import argparse
import json
import os
import time

import numpy as np
from PIL import Image

import pinfeed


def cpu_seconds():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def pillow(loader, limit, size):
    """torchvision's per-image work on PIL images, in one thread."""
    ds = loader._dataset
    names = [ds.sample_name(i) for i in range(limit)]
    c0, t0 = cpu_seconds(), time.perf_counter()
    for i, name in enumerate(names):
        img = Image.open(name).convert("RGB")
        w, h = img.size
        top, left, bh, bw, flip = ds.crop_of(i, 0, w, h)
        out = img.resize((size, size), Image.BILINEAR, box=(left, top, left + bw, top + bh))
        if flip:
            out = out.transpose(Image.FLIP_LEFT_RIGHT)
        np.asarray(out)
    return time.perf_counter() - t0, cpu_seconds() - c0


def pinfeed_run(root, limit, size, threads, batch):
    loader = pinfeed.ImageLoader(
        root, batch_size=batch, size=size, device="cpu", layout="NHWC", num_threads=threads
    )
    n = 0
    c0, t0 = cpu_seconds(), time.perf_counter()
    for images, _ in loader:
        n += len(images)
        if n >= limit:
            break
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    loader.close()
    return n, wall, cpu


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("--limit", type=int, default=500)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--out")
    a = p.parse_args()
    probe = pinfeed.ImageLoader(a.root, batch_size=1, size=a.size, device="cpu")
    limit = min(a.limit, probe.num_samples)
    rows = []
    wall, cpu = pillow(probe, limit, a.size)
    rows.append({"name": "Pillow, 1 thread", "images": limit, "wall_s": wall, "cpu_s": cpu})
    for threads in (int(t) for t in a.threads.split(",")):
        n, wall, cpu = pinfeed_run(a.root, limit, a.size, threads, a.batch_size)
        rows.append(
            {"name": f"pinfeed, {threads} thread(s)", "images": n, "wall_s": wall, "cpu_s": cpu}
        )
    print(f"{'':24s} {'images/s':>9s} {'CPU s/1000':>10s}")
    for r in rows:
        r["images_per_s"] = r["images"] / r["wall_s"]
        r["cpu_s_per_1000"] = 1000 * r["cpu_s"] / r["images"]
        print(f"{r['name']:24s} {r['images_per_s']:9.0f} {r['cpu_s_per_1000']:10.2f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(
                {"machine": os.uname().nodename, "cores": os.cpu_count(), "rows": rows}, f, indent=1
            )


if __name__ == "__main__":
    main()
