"""torchvision's GPU JPEG decode on batches of file bytes, plus the same GPU crop + resize + flip
as nvjpeg_bench: issue 19's baseline (b), on the same files and with the same crop rule (a centre
square of the shorter side, resized to SIZE with antialias, every second image mirrored).

    python3 bench/images.py torchvision DIR [--batch 256] [--size 224] [--rounds 3] [--out F.json]

The files are read into memory first (as nvjpeg_bench reads them into pinned memory); files the
GPU decoder refuses (CMYK) are left out and counted. Prints images/s and the process's CPU
seconds per 1000 images, and writes them to --out as JSON.
"""

import argparse
import json
import os
import resource
import time

import torch
import torchvision
import torchvision.transforms.v2.functional as F
from torchvision.io import ImageReadMode, decode_jpeg


def cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def jpegs(root):
    found = []
    for d, _, names in os.walk(root):
        found += [os.path.join(d, n) for n in names if n.lower().endswith((".jpg", ".jpeg"))]
    return sorted(found)


def crop_resize(images, size):
    out = []
    for i, img in enumerate(images):
        h, w = img.shape[-2:]
        side = min(h, w)
        img = F.resized_crop(
            img, (h - side) // 2, (w - side) // 2, side, side, [size, size], antialias=True
        )
        out.append(F.horizontal_flip(img) if i % 2 == 1 else img)
    return torch.stack(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out")
    a = p.parse_args()
    files = jpegs(a.dir)
    data = [torchvision.io.read_file(f) for f in files]
    ok, refused = [], 0
    for d in data:
        try:
            decode_jpeg(d, device="cuda", mode=ImageReadMode.RGB)
            ok.append(d)
        except RuntimeError:
            refused += 1
    batches = [ok[i : i + a.batch] for i in range(0, len(ok), a.batch)]
    print(
        f"torch {torch.__version__}, torchvision {torchvision.__version__}, {torch.cuda.get_device_name()}"
    )
    print(f"{len(ok)} files decoded on the GPU, {refused} refused (left out)")
    for b in batches:  # warm-up round
        crop_resize(decode_jpeg(b, device="cuda", mode=ImageReadMode.RGB), a.size)
    torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), cpu_seconds()
    for _ in range(a.rounds):
        for b in batches:
            crop_resize(decode_jpeg(b, device="cuda", mode=ImageReadMode.RGB), a.size)
    torch.cuda.synchronize()
    seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    images = len(ok) * a.rounds
    row = {
        "what": "torchvision decode_jpeg(device=cuda) + resized_crop + flip",
        "batch": a.batch,
        "size": a.size,
        "images": images,
        "refused": refused,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "images_per_s": images / seconds,
        "cpu_s_per_1000": cpu / images * 1000,
    }
    print(
        f"{'torchvision':<12} {row['images_per_s']:10.0f} images/s {row['cpu_s_per_1000']:8.3f} cpu s/1000"
    )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(row, f)
            f.write("\n")
        print("wrote", a.out)


if __name__ == "__main__":
    main()
