"""pinfeed.ImageLoader: pixels against Pillow, crop geometry against torchvision's formula,
labels, order, sharding, resume, and every bad input."""

import io
import math
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import pinfeed
from pinfeed import _pinfeed

FIXTURES = Path(__file__).resolve().parents[3] / "crates/source/tests/fixtures/images"
GOOD = ["baseline.jpg", "progressive.jpg", "444.jpg", "cmyk.jpg", "grayscale.jpg", "rgb.png"]
GOOD += ["palette.png", "rgba.png", "tall.jpg", "one_by_one.jpg"]


def torchvision_get_params(width, height, scale, ratio, draws):
    """torchvision's ``RandomResizedCrop.get_params`` (torchvision/transforms/transforms.py,
    v0.20), its torch draws replaced by ``draws`` (uniform in [0, 1)) with torch's float32
    arithmetic: ``torch.empty(1).uniform_(a, b)`` is a float32 ``u * (b - a) + a``,
    ``torch.log(torch.tensor(ratio))`` and ``torch.exp`` are float32, and
    ``torch.randint(0, n, (1,))`` takes ``floor(u * n)``."""
    draws = iter(draws)
    f32 = np.float32
    area = height * width
    log_ratio = (np.log(f32(ratio[0])), np.log(f32(ratio[1])))
    for _ in range(10):
        s = f32(next(draws)) * (f32(scale[1]) - f32(scale[0])) + f32(scale[0])
        target_area = area * float(s)
        r = f32(next(draws)) * (log_ratio[1] - log_ratio[0]) + log_ratio[0]
        aspect_ratio = float(np.exp(f32(r)))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = min(int(next(draws) * (height - h + 1)), height - h)
            j = min(int(next(draws) * (width - w + 1)), width - w)
            return i, j, h, w
    # Fallback to central crop
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:  # whole image
        w = width
        h = height
    i = (height - h) // 2
    j = (width - w) // 2
    return i, j, h, w


def test_crop_geometry_is_torchvisions():
    rng = np.random.default_rng(0)
    cases = [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.35, 1.0), (3 / 4, 4 / 3)), ((0.9, 1.0), (2.0, 3.0))]
    fallbacks = 0
    for k in range(3000):
        scale, ratio = cases[k % len(cases)]
        width, height = (int(v) for v in rng.integers(1, 900, 2))
        if k % 7 == 0:
            width = int(rng.integers(1, 20))  # narrow images reach the fallback
        draws = [float(d) for d in rng.random(40)]
        want = torchvision_get_params(width, height, scale, ratio, draws)
        got = _pinfeed.crop_params(width, height, scale, ratio, draws)
        assert got == want, (width, height, scale, ratio)
        fallbacks += (
            want[2] in (height, round(width / min(ratio))) and want[0] == (height - want[2]) // 2
        )
    assert fallbacks > 0


def folder(root: Path, names) -> Path:
    """An ImageFolder tree: one class per fixture (class names sorted as the list)."""
    for k, name in enumerate(names):
        d = root / "train" / f"c{k:02d}"
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / name, d / name)
    return root / "train"


def center_placement(width, height, resize, size):
    """Where torchvision's ``CenterCrop(size)`` puts a ``Resize(resize)`` of a ``width`` x
    ``height`` image: (top, left, height, width) in output pixels, zeros around it where the
    crop is larger than the image (it pads ``(crop - size) // 2`` before it)."""
    rw, rh = (
        (resize, int(resize * height / width))
        if width <= height
        else (
            int(resize * width / height),
            resize,
        )
    )
    ih, iw = min(rh, size[0]), min(rw, size[1])
    return (size[0] - ih) // 2, (size[1] - iw) // 2, ih, iw


def pillow_reference(path, box, flip, size, crop, place=None):
    """What torchvision does on a PIL image, given the crop box, then the flip. RandomResizedCrop
    (``F.resized_crop``) crops, then resizes the crop bilinear, so only the box's pixels weigh in;
    Resize then CenterCrop resizes the whole image, which is Pillow's resize of the (fractional)
    box in the whole image (``box=``), its neighbours outside the box weighing in, into
    ``place`` (:func:`center_placement`) of a zero image."""
    top, left, h, w = box
    img = Image.open(path).convert("RGB")
    if crop == "random":
        img = img.crop((int(left), int(top), int(left + w), int(top + h)))
        out = img.resize((size[1], size[0]), Image.BILINEAR)
    else:
        pt, pl, ph, pw = place or (0, 0, size[0], size[1])
        part = img.resize((pw, ph), Image.BILINEAR, box=(left, top, left + w, top + h))
        out = Image.new("RGB", (size[1], size[0]))
        out.paste(part, (pl, pt))
    if flip:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(out)


def assert_close(got, want, what):
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    for c in range(3):
        mean, top = diff[..., c].mean(), diff[..., c].max()
        assert mean < 1 and top < 8, f"{what} channel {c}: mean {mean:.3f} max {top}"


@pytest.mark.parametrize("crop", ["random", "center"])
def test_pixels_match_pillow(tmp_path, crop):
    root = folder(tmp_path, GOOD)
    size = (40, 48)
    loader = pinfeed.ImageLoader(
        root, batch_size=3, size=size, device="cpu", layout="NHWC", crop=crop, seed=5, flip=True
    )
    chw = pinfeed.ImageLoader(
        root, batch_size=3, size=size, device="cpu", layout="NCHW", crop=crop, seed=5, flip=True
    )
    images, labels = (np.concatenate(x) for x in zip(*loader))
    planes = np.concatenate([b for b, _ in chw])
    assert images.shape == (len(GOOD), 40, 48, 3) and images.dtype == np.uint8
    assert labels.dtype == np.int64 and list(labels) == list(range(len(GOOD)))
    np.testing.assert_array_equal(planes.transpose(0, 2, 3, 1), images)
    flips = 0
    for i, name in enumerate(GOOD):
        w, h = Image.open(FIXTURES / name).size
        top, left, bh, bw, flip = loader._dataset.crop_of(i, 0, w, h)
        flips += flip
        # The default resize is size / 0.875 of the shorter side: 45, narrower than 48 for the
        # tall image, which CenterCrop pads.
        place = center_placement(w, h, int(min(size) / 0.875), size)
        want = pillow_reference(FIXTURES / name, (top, left, bh, bw), flip, size, crop, place)
        assert_close(images[i], want, f"{name} ({crop})")
    assert crop == "center" or 0 < flips < len(GOOD)


def tar_shards(root: Path, count: int, per_shard: int = 7) -> Path:
    """WebDataset shards whose labels are the sample numbers, so labels name samples."""
    out = root / "shards"
    out.mkdir()
    for first in range(0, count, per_shard):
        with tarfile.open(out / f"s-{first // per_shard:04d}.tar", "w") as tar:
            for n in range(first, min(count, first + per_shard)):
                for name, data in (
                    (f"{n:05d}.jpg", (FIXTURES / GOOD[n % 5]).read_bytes()),
                    (f"{n:05d}.cls", str(n).encode()),
                ):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return out


def labels_of(loader, batches=None):
    out = []
    for k, (_, labels) in enumerate(loader):
        if batches is not None and k == batches:
            break
        out.append(labels.copy())
    return np.concatenate(out) if out else np.array([], dtype=np.int64)


def test_labels_order_sharding_and_epochs(tmp_path, no_launcher_env):
    shards = tar_shards(tmp_path, 30)
    args = dict(batch_size=4, size=16, device="cpu", shuffle=True, seed=3)
    loader = pinfeed.ImageLoader(shards, **args)
    assert loader.num_samples == 30 and loader.classes == []
    e0 = labels_of(loader)
    e1 = labels_of(loader)
    assert sorted(e0) == list(range(30)) and sorted(e1) == list(range(30))
    assert list(e0) != list(e1)
    loader.set_epoch(0)
    np.testing.assert_array_equal(labels_of(loader), e0)
    ranks = [pinfeed.ImageLoader(shards, rank=r, world_size=2, **args) for r in (0, 1)]
    halves = [labels_of(r) for r in ranks]
    assert not set(halves[0]) & set(halves[1])
    assert sorted(np.concatenate(halves)) == list(range(30))
    # The order is the Loader's: the same sample numbers as pinfeed.epoch_order gives.
    plain = pinfeed.ImageLoader(shards, batch_size=4, size=16, device="cpu")
    assert list(labels_of(plain)) == list(range(30))


def test_resume_gives_exactly_the_rest(tmp_path, no_launcher_env):
    shards = tar_shards(tmp_path, 30)
    args = dict(batch_size=4, size=16, device="cpu", shuffle=True, seed=9)
    whole = pinfeed.ImageLoader(shards, **args)
    whole.set_epoch(2)
    want = [(x.copy(), y.copy()) for x, y in whole]
    first = pinfeed.ImageLoader(shards, **args)
    first.set_epoch(2)
    for k, _ in enumerate(first):
        if k == 2:
            break
    state = first.state_dict()
    assert state["epoch"] == 2 and state["batches_done"] == 3
    resumed = pinfeed.ImageLoader(shards, **args)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(want) - 3
    for (x, y), (wx, wy) in zip(rest, want[3:]):
        np.testing.assert_array_equal(y, wy)
        np.testing.assert_array_equal(x, wx)  # the same crops: draws follow (epoch, sample)
    other = pinfeed.ImageLoader(shards, batch_size=4, size=32, device="cpu")
    with pytest.raises(pinfeed.PinfeedValueError, match="height"):
        other.load_state_dict(state)


def test_normalization_on_the_host_backend(tmp_path):
    root = folder(tmp_path, GOOD[:3])
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    plain = pinfeed.ImageLoader(root, batch_size=3, size=24, device="cpu", crop="center")
    normed = pinfeed.ImageLoader(
        root, batch_size=3, size=24, device="cpu", crop="center", mean=mean, std=std
    )
    (x, _), (n, _) = next(iter(plain)), next(iter(normed))
    assert n.dtype == np.float32 and n.shape == (3, 3, 24, 24)
    want = (x / 255.0 - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]
    np.testing.assert_allclose(n, want, rtol=1e-5, atol=1e-5)


def test_bad_images_raise_naming_the_file_or_are_skipped(tmp_path):
    bad = ["truncated.jpg", "not_an_image.jpg", "bomb.jpg", "bomb.png"]
    root = folder(tmp_path, ["baseline.jpg", *bad, "grayscale.jpg"])
    loader = pinfeed.ImageLoader(root, batch_size=2, size=16, device="cpu")
    with pytest.raises(
        pinfeed.PinfeedValueError, match=r"c01/truncated\.jpg: corrupt or truncated"
    ):
        list(loader)
    for name, why in [
        ("not_an_image.jpg", "not a JPEG or PNG"),
        ("bomb.jpg", "20000x20000 = 400000000 pixels, over the limit of 89478485"),
        ("bomb.png", "over the limit"),
    ]:
        one = folder(tmp_path / name, [name])
        with pytest.raises(pinfeed.PinfeedValueError, match=why) as e:
            list(pinfeed.ImageLoader(one, batch_size=1, size=16, device="cpu"))
        assert name in str(e.value) and "\n" not in str(e.value)
    skipping = pinfeed.ImageLoader(root, batch_size=2, size=16, device="cpu", on_error="skip")
    batches = list(skipping)
    assert [len(y) for _, y in batches] == [2, 2, 2]
    assert skipping.stats()["skipped"] == 4  # each bad sample once
    # Each bad sample's place holds the next good one (grayscale.jpg, class 5).
    assert list(np.concatenate([y for _, y in batches])) == [0, 5, 5, 5, 5, 5]
    with pytest.raises(pinfeed.PinfeedValueError, match="max_pixels|pixels"):
        list(pinfeed.ImageLoader(root, batch_size=2, size=16, device="cpu", max_pixels=100))


def test_empty_class_folder_and_unlabelled_tar_sample(tmp_path):
    root = folder(tmp_path, ["baseline.jpg"])
    (root / "c_empty").mkdir()
    with pytest.raises(pinfeed.PinfeedValueError, match="c_empty: empty class folder"):
        pinfeed.ImageLoader(root, batch_size=1, device="cpu")
    skipping = pinfeed.ImageLoader(root, batch_size=1, device="cpu", on_error="skip")
    assert skipping.classes == ["c00", "c_empty"] and skipping.stats()["skipped"] == 1
    shard = tmp_path / "bad.tar"
    with tarfile.open(shard, "w") as tar:
        for name, data in [
            ("a.jpg", (FIXTURES / "baseline.jpg").read_bytes()),
            ("a.cls", b"1"),
            ("b.jpg", (FIXTURES / "baseline.jpg").read_bytes()),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(pinfeed.PinfeedValueError, match=r"bad\.tar:b: the sample has no label"):
        pinfeed.ImageLoader(shard, batch_size=1, device="cpu")
    assert len(pinfeed.ImageLoader(shard, batch_size=1, device="cpu", on_error="skip")) == 1


def test_options_are_checked(tmp_path):
    root = folder(tmp_path, ["baseline.jpg"])
    for kwargs, why in [
        (dict(decode="gpu"), "decode='gpu' needs one CUDA device"),
        (dict(decode="fast"), "unknown decode"),
        (dict(layout="CHW"), "layout"),
        (dict(crop="middle"), "unknown crop"),
        (dict(mean=(0.5,)), "mean and std together"),
        (dict(scale=(0.5, 0.1)), "scale"),
        (dict(size=0), "size"),
        (dict(on_error="ignore"), "on_error"),
    ]:
        with pytest.raises(pinfeed.PinfeedValueError, match=why):
            pinfeed.ImageLoader(root, batch_size=1, device="cpu", **kwargs)
    with pytest.raises(pinfeed.PinfeedOSError, match="missing"):
        pinfeed.ImageLoader(tmp_path / "missing", batch_size=1, device="cpu")


def test_auto_decodes_on_the_cpu_for_the_host_backend(tmp_path):
    root = folder(tmp_path, GOOD[:2])
    auto = pinfeed.ImageLoader(root, batch_size=2, size=16, device="cpu", decode="auto", seed=3)
    assert (auto.decode, auto.decode_reason) == ("cpu", "cpu: batches go to the host backend")
    assert auto.stats()["decode_reason"] == auto.decode_reason
    cpu = pinfeed.ImageLoader(root, batch_size=2, size=16, device="cpu", seed=3)
    for (ax, ay), (cx, cy) in zip(auto, cpu):
        np.testing.assert_array_equal(ax, cx)
        np.testing.assert_array_equal(ay, cy)


@pytest.mark.gpu
def test_gpu_decode_matches_cpu_decode(tmp_path, torch):
    # Every fixture 3 times: JPEGs the GPU decodes, PNG and CMYK that the CPU path does.
    root = tmp_path / "train"
    for k in range(3):
        for j, name in enumerate(GOOD):
            d = root / f"c{(j + k) % 4}"
            d.mkdir(parents=True, exist_ok=True)
            shutil.copy(FIXTURES / name, d / f"{k}_{name}")
    for layout in ("NCHW", "NHWC"):
        args = dict(batch_size=7, size=64, layout=layout, seed=5, shuffle=True, device="cuda")
        gpu = pinfeed.ImageLoader(root, decode="gpu", **args)
        cpu = pinfeed.ImageLoader(root, decode="cpu", **args)
        assert gpu.decode == "gpu" and cpu.decode == "cpu"
        pairs = list(zip(gpu, cpu))
        assert len(pairs) == len(cpu) == math.ceil(3 * len(GOOD) / 7)
        for (gx, gy), (cx, cy) in pairs:
            assert gx.is_cuda and gx.shape == cx.shape and gx.dtype == torch.uint8
            np.testing.assert_array_equal(gy.cpu().numpy(), cy.cpu().numpy())
            diff = (gx.int() - cx.int()).abs()
            channel_dim = 1 if layout == "NCHW" else 3
            dims = [d for d in range(4) if d != channel_dim]
            assert float(diff.float().mean(dim=dims).max()) < 1.0, layout
            assert int(diff.amax()) < 8, layout
        # Resume: the batches after the second are those of a fresh run.
        gpu.set_epoch(1)
        it = iter(gpu)
        next(it), next(it)
        state = gpu.state_dict()
        rest = [y.cpu().numpy() for _, y in it]
        again = pinfeed.ImageLoader(root, decode="gpu", **args)
        again.load_state_dict(state)
        assert [y.cpu().numpy().tolist() for _, y in again] == [r.tolist() for r in rest]


@pytest.mark.gpu
def test_auto_times_both_decoders_on_the_dataset(tmp_path, torch):
    root = tmp_path / "train"
    for k in range(8):
        for j, name in enumerate(GOOD):
            d = root / f"c{(j + k) % 4}"
            d.mkdir(parents=True, exist_ok=True)
            shutil.copy(FIXTURES / name, d / f"{k}_{name}")
    auto = pinfeed.ImageLoader(root, batch_size=8, size=64, decode="auto", device="cuda")
    assert auto.decode in ("cpu", "gpu")
    why = auto.decode_reason
    assert why.startswith(auto.decode + ": nvJPEG on cuda:") and "images/s" in why, why
    assert auto.stats()["decode"] == auto.decode
    # The second loader on the dataset reads the kept rates: the same choice, the same words.
    again = pinfeed.ImageLoader(root, batch_size=8, size=64, decode="auto", device="cuda")
    assert (again.decode, again.decode_reason) == (auto.decode, why)
    images, labels = next(iter(again))
    assert images.is_cuda and images.shape == (8, 3, 64, 64) and labels.shape == (8,)


@pytest.mark.gpu
def test_cuda_batches_match_the_host_backend(tmp_path, torch):
    root = folder(tmp_path, GOOD)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    for layout in ("NCHW", "NHWC"):
        args = dict(batch_size=4, size=32, layout=layout, seed=1, shuffle=True)
        host = list(pinfeed.ImageLoader(root, device="cpu", **args))
        cuda = list(pinfeed.ImageLoader(root, device="cuda", **args))
        normed = list(pinfeed.ImageLoader(root, device="cuda", mean=mean, std=std, **args))
        for (hx, hy), (cx, cy), (nx, _) in zip(host, cuda, normed):
            assert cx.is_cuda and cx.is_contiguous() and cy.dtype == torch.int64
            np.testing.assert_array_equal(cx.cpu().numpy(), hx)
            np.testing.assert_array_equal(cy.cpu().numpy(), hy)
            shape = (1, 3, 1, 1) if layout == "NCHW" else (1, 1, 1, 3)
            want = (hx / 255.0 - np.reshape(mean, shape)) / np.reshape(std, shape)
            np.testing.assert_allclose(nx.cpu().numpy(), want, rtol=1e-5, atol=1e-5)


def torchvision_center_box(width, height, resize, out_h, out_w):
    """torchvision's ``Resize(resize)`` (``_compute_resized_output_size`` in
    torchvision/transforms/functional.py: the short side to ``resize``, the long one
    ``int(resize * long / short)``) then ``CenterCrop`` (``center_crop``: offsets
    ``int(round((size - crop) / 2.0))``), as (top, left, height, width) in source pixels."""
    short, long = min(width, height), max(width, height)
    new_short, new_long = resize, int(resize * long / short)
    rw, rh = (new_short, new_long) if width <= height else (new_long, new_short)
    top = int(round((rh - out_h) / 2.0))
    left = int(round((rw - out_w) / 2.0))
    sx, sy = width / rw, height / rh
    return top * sy, left * sx, out_h * sy, out_w * sx


def test_center_crop_geometry_and_pixels_are_torchvisions(tmp_path):
    root = folder(tmp_path, GOOD[:4])
    size = 32
    loader = pinfeed.ImageLoader(root, batch_size=4, size=size, device="cpu", crop="center")
    rng = np.random.default_rng(1)
    for _ in range(500):
        w, h = (int(v) for v in rng.integers(size, 2000, 2))
        got = loader._dataset.crop_of(0, 0, w, h)
        want = torchvision_center_box(w, h, int(size / 0.875), size, size)
        np.testing.assert_allclose(got[:4], want, rtol=1e-12, err_msg=f"{w}x{h}")
        assert got[4] is False
    # Pixels against Pillow doing what torchvision does: resize the whole image, then crop.
    images, _ = next(
        iter(pinfeed.ImageLoader(root, 4, size, device="cpu", crop="center", layout="NHWC"))
    )
    for i, name in enumerate(GOOD[:4]):
        img = Image.open(FIXTURES / name).convert("RGB")
        w, h = img.size
        resize = int(size / 0.875)
        rw, rh = (resize, int(resize * h / w)) if w <= h else (int(resize * w / h), resize)
        top, left = int(round((rh - size) / 2.0)), int(round((rw - size) / 2.0))
        want = np.asarray(img.resize((rw, rh), Image.BILINEAR))[
            top : top + size, left : left + size
        ]
        assert_close(images[i], want, f"{name} (resize then crop)")


def test_a_mean_or_std_that_is_not_finite_is_refused(tmp_path):
    # A NaN std was accepted and made every batch NaN; the rule is Rust's
    # (``_pinfeed.channel_triple``), as for every other option.
    root = folder(tmp_path, ["baseline.jpg"])
    for mean, std in [
        ((0.5,), (math.nan,)),
        ((math.nan,), (0.5,)),
        ((0.5,), (math.inf, 1.0, 1.0)),
        ((0.5,), (0.0,)),
        ((0.5, 0.5), (0.5,)),
    ]:
        with pytest.raises(pinfeed.PinfeedValueError, match="finite"):
            pinfeed.ImageLoader(root, batch_size=1, device="cpu", mean=mean, std=std)


def test_a_center_crop_larger_than_the_resized_image_is_padded_with_zeros(tmp_path):
    # torchvision's CenterCrop pads an image smaller than the crop with zeros, (crop - size)
    # // 2 before it, then crops (its documented rule); Resize is Pillow's bilinear resize of
    # the whole image. pinfeed stretched the image over the whole output instead.
    names = ["baseline.jpg", "tall.jpg", "rgb.png"]
    root = folder(tmp_path, names)
    size, resize = 8, 2
    loader = pinfeed.ImageLoader(
        root, 3, size, device="cpu", crop="center", resize=resize, layout="NHWC"
    )
    images, _ = next(iter(loader))
    for i, name in enumerate(names):
        img = Image.open(FIXTURES / name).convert("RGB")
        w, h = img.size
        rw, rh = (resize, int(resize * h / w)) if w <= h else (int(resize * w / h), resize)
        resized = np.asarray(img.resize((rw, rh), Image.BILINEAR))
        # Pad (or crop) each direction to the output as CenterCrop does.
        want = np.zeros((size, size, 3), np.uint8)
        ch, cw = min(rh, size), min(rw, size)
        top, left = max(size - rh, 0) // 2, max(size - rw, 0) // 2
        st, sl = int(round((rh - ch) / 2.0)), int(round((rw - cw) / 2.0))
        want[top : top + ch, left : left + cw] = resized[st : st + ch, sl : sl + cw]
        assert_close(images[i], want, f"{name} (resize {resize}, then a crop of {size})")
        assert not images[i][:top].any() and not images[i][:, :left].any()
