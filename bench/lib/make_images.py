"""JPEG datasets from real photographs that packages ship, for pinfeed's image tests and benchmarks.

    python3 bench/images.py make OUT --count 20000 [--classes 100] [--seed 0] [--per-shard 1000]
    python3 bench/images.py make --fixtures crates/source/tests/fixtures/images

The photographs are scikit-learn's `load_sample_images` (two JPEGs in its wheel) and, where
scikit-image is installed, the colour photographs of `skimage.data`. Each output image is a random
crop of one of them, rescaled to an ImageNet-like size (about 500x375, either orientation),
re-encoded by Pillow at quality 75-95; about one in six is progressive, one in twenty grayscale
and one in fifty CMYK. Everything is a pure function of --seed and --count (the photographs are
fixed by the installed packages), so every benchmark reads the same bytes.

Writes OUT/train/<class>/<n>.JPEG (the ImageFolder layout, with ImageNet's upper-case
extension) and, unless --no-tar, OUT/shards/train-NNNNNN.tar (WebDataset: members KEY.jpg and
KEY.cls, the label as decimal text; tar headers with fixed times and owners).

--fixtures DIR writes the small files the CI tests read instead (a few KB each): baseline,
progressive, 4:4:4, grayscale and CMYK JPEGs, RGB / grayscale / palette / RGBA PNGs, a 1x1
JPEG, a truncated JPEG, a file that is not an image, and two image bombs whose headers claim
20000x20000 pixels (a JPEG with its frame header patched, a PNG with its IHDR patched and its
CRC fixed), plus NAME.rgb beside each decodable one: Pillow's `convert("RGB")` of it as raw
bytes after an 8-byte header (width, height: little-endian u32), height x width x 3, the
reference the Rust tests compare with.
"""

import argparse
import io
import os
import struct
import sys
import tarfile
import zlib

import numpy as np


def photographs():
    """The source photographs as a list of RGB PIL images, in a fixed order: scikit-learn's
    and scikit-image's, whichever are installed (at least one must be)."""
    from PIL import Image

    photos = []
    try:
        from sklearn.datasets import load_sample_images

        photos += [Image.fromarray(a) for a in load_sample_images().images]
    except ImportError:
        pass
    try:
        from skimage import data
    except ImportError:
        data = None
    names = ("astronaut", "chelsea", "coffee", "rocket", "motorcycle_left", "immunohistochemistry")
    for name in names if data is not None else ():
        fn = getattr(data, name, None)
        if fn is None:
            continue
        try:
            a = fn()
        except Exception as e:  # a data file missing from this install: use the others
            print(f"skimage.data.{name} skipped: {e}", file=sys.stderr)
            continue
        if a.ndim == 3 and a.shape[2] >= 3 and a.dtype == np.uint8:
            photos.append(Image.fromarray(np.ascontiguousarray(a[:, :, :3])))
    if not photos:
        sys.exit("images.py make needs scikit-learn or scikit-image for its photographs")
    return photos


def variant(photos, rng):
    """One re-encoded image: (JPEG bytes, its PIL mode)."""
    from PIL import Image

    photo = photos[int(rng.integers(len(photos)))]
    w, h = photo.size
    # A crop of 30-100% of the photo's side, then rescaled to ~500x375 or ~375x500.
    frac = rng.uniform(0.3, 1.0)
    cw, ch = max(8, int(w * frac)), max(8, int(h * frac * rng.uniform(0.8, 1.2)))
    cw, ch = min(cw, w), min(ch, h)
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    long_side = int(rng.integers(400, 641))
    short_side = int(long_side * rng.uniform(0.66, 0.8))
    size = (long_side, short_side) if rng.random() < 0.75 else (short_side, long_side)
    img = photo.crop((x, y, x + cw, y + ch)).resize(size, Image.BILINEAR)
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    kind = rng.random()
    if kind < 0.05:
        img = img.convert("L")
    elif kind < 0.07:
        img = img.convert("CMYK")
    buf = io.BytesIO()
    img.save(
        buf,
        "JPEG",
        quality=int(rng.integers(75, 96)),
        progressive=bool(rng.random() < 0.17),
    )
    return buf.getvalue(), img.mode


def tar_member(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def make_dataset(out, count, classes, seed, per_shard, tar):
    photos = photographs()
    rng = np.random.default_rng(seed)
    train = os.path.join(out, "train")
    names = [f"n{c:08d}" for c in range(classes)]
    for name in names:
        os.makedirs(os.path.join(train, name), exist_ok=True)
    shards = os.path.join(out, "shards")
    if tar:
        os.makedirs(shards, exist_ok=True)
    modes = {}
    total = 0
    shard = None
    for n in range(count):
        data, mode = variant(photos, rng)
        label = n % classes
        modes[mode] = modes.get(mode, 0) + 1
        total += len(data)
        with open(os.path.join(train, names[label], f"{n:08d}.JPEG"), "wb") as f:
            f.write(data)
        if tar:
            if n % per_shard == 0:
                if shard is not None:
                    shard.close()
                path = os.path.join(shards, f"train-{n // per_shard:06d}.tar")
                shard = tarfile.open(path, "w", format=tarfile.USTAR_FORMAT)
            key = f"{n:08d}"
            tar_member(shard, key + ".jpg", data)
            tar_member(shard, key + ".cls", str(label).encode())
    if shard is not None:
        shard.close()
    print(
        f"{count} JPEGs from {len(photos)} photographs, {total / max(count, 1) / 1024:.1f} KiB "
        f"each on average, modes {modes}, {classes} classes: {train}"
        + (f" and {shards}" if tar else "")
    )


def png_chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def jpeg_bomb(small):
    """`small` (a baseline JPEG) with its frame header claiming 20000x20000 pixels."""
    i = 2
    while i < len(small):
        marker, length = small[i + 1], struct.unpack(">H", small[i + 2 : i + 4])[0]
        if marker in (0xC0, 0xC1, 0xC2):
            # SOFn: length, precision, height, width
            return small[: i + 5] + struct.pack(">HH", 20000, 20000) + small[i + 9 :]
        i += 2 + length
    raise ValueError("no frame header")


def png_bomb(small):
    """`small` (a PNG) with its IHDR claiming 20000x20000 pixels (CRC fixed)."""
    assert small[12:16] == b"IHDR"
    body = struct.pack(">II", 20000, 20000) + small[24:29]
    return small[:8] + png_chunk(b"IHDR", body) + small[33:]


def make_fixtures(out, seed):
    from PIL import Image

    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    photo = photographs()[0]
    # Odd sizes, so partial MCUs and chroma edges are covered.
    base = photo.crop((100, 60, 100 + 231, 60 + 161)).resize((77, 53), Image.BILINEAR)
    files = {}

    def jpeg(img, **kw):
        buf = io.BytesIO()
        img.save(buf, "JPEG", **kw)
        return buf.getvalue()

    def png(img):
        buf = io.BytesIO()
        img.save(buf, "PNG")
        return buf.getvalue()

    files["baseline.jpg"] = jpeg(base, quality=90)
    files["progressive.jpg"] = jpeg(base, quality=85, progressive=True)
    files["444.jpg"] = jpeg(base, quality=95, subsampling=0)
    files["grayscale.jpg"] = jpeg(base.convert("L"), quality=90)
    files["cmyk.jpg"] = jpeg(base.convert("CMYK"), quality=90)
    files["one_by_one.jpg"] = jpeg(base.resize((1, 1)), quality=90)
    files["tall.jpg"] = jpeg(photo.crop((300, 0, 340, 400)).resize((24, 130)), quality=80)
    files["rgb.png"] = png(base)
    files["grayscale.png"] = png(base.convert("L"))
    files["palette.png"] = png(base.convert("P", palette=Image.ADAPTIVE, colors=32))
    rgba = base.convert("RGBA")
    alpha = Image.fromarray(rng.integers(0, 256, (53, 77), dtype=np.uint8))
    rgba.putalpha(alpha)
    files["rgba.png"] = png(rgba)
    references = dict(files)
    files["truncated.jpg"] = files["baseline.jpg"][: len(files["baseline.jpg"]) // 2]
    files["not_an_image.jpg"] = b"this is a text file, not a JPEG\n" * 4
    files["bomb.jpg"] = jpeg_bomb(files["baseline.jpg"])
    files["bomb.png"] = png_bomb(files["rgb.png"])
    for name, data in files.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    for name, data in references.items():
        rgb = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        stem = name.rsplit(".", 1)[0] + "_" + name.rsplit(".", 1)[1]
        with open(os.path.join(out, stem + ".rgb"), "wb") as f:
            f.write(struct.pack("<II", rgb.shape[1], rgb.shape[0]) + rgb.tobytes())
    print(f"{len(files)} fixtures and {len(references)} Pillow references in {out}")


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("out", nargs="?", help="output folder (train/ and shards/ are made inside)")
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-shard", type=int, default=1000, help="samples per tar shard")
    p.add_argument("--no-tar", action="store_true", help="the ImageFolder tree only")
    p.add_argument("--fixtures", metavar="DIR", help="write the CI fixtures into DIR instead")
    a = p.parse_args()
    if a.fixtures:
        make_fixtures(a.fixtures, a.seed)
    elif a.out:
        make_dataset(a.out, a.count, a.classes, a.seed, a.per_shard, not a.no_tar)
    else:
        p.error("name OUT or --fixtures DIR")


if __name__ == "__main__":
    main()
