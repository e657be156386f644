"""A GPU soak of the Python Loader on torch's default (legacy) stream, whose released batch memory
the copy thread seals in groups (the backend's DeviceBufferCache).

For SECONDS, loaders of alternating batch sizes (1 MiB and 800 KiB, so an epoch ends on a short
batch and the device cache holds buffers of three sizes) stream a 256 MiB host array to the GPU;
each batch is compared on the GPU with a resident copy of the source, some after a GPU sleep that
holds the default stream back, so memory reused too early would show. Mismatches are counted on
the GPU and read once per loader. Device memory in use and the process's resident memory are
printed per minute and must not grow.

PYTHONPATH=SITE python3 bench/records.py soak [SECONDS]
"""

import resource
import sys
import time

import numpy as np
import torch

import pinfeed

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60
records, record_bytes = 65536, 4096
src = np.random.default_rng(7).integers(0, 256, size=(records, record_bytes), dtype=np.uint8)
ref = torch.from_numpy(src).cuda()
assert torch.cuda.current_stream().cuda_stream == 0, "the soak runs on the legacy default stream"


def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def device_used_mib():
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**20


start = time.monotonic()
loaders = batches = 0
bytes_checked = 0
marks = []
next_mark = start
while time.monotonic() - start < seconds:
    batch_size = 256 if loaders % 2 == 0 else 200
    epochs = 2
    loader = pinfeed.Loader(src, batch_size, device="cuda", epochs=epochs)
    bad = torch.zeros((), dtype=torch.int64, device="cuda")
    at = i = 0
    # Not enumerate(): its reused result tuple would hold the previous batch into the next one.
    for x in loader:
        i += 1
        if i % 3 == 0:
            torch.cuda._sleep(20_000)  # about 10 us: the default stream falls behind the copies
        k = x.shape[0]
        bad += (x != ref[at : at + k]).any().to(torch.int64)
        at = (at + k) % records
        batches += 1
        bytes_checked += x.numel()
        del x
    assert at == 0, f"loader {loaders} delivered {at} records past its last whole epoch"
    wrong = int(bad.item())
    assert wrong == 0, (
        f"loader {loaders} (batches of {batch_size}): {wrong} batches differ from the source"
    )
    held = loader.stats()["device_bytes_held"]
    assert held == 0, (
        f"loader {loaders}: {held} device bytes still held after every batch was let go"
    )
    del loader
    loaders += 1
    now = time.monotonic()
    if now >= next_mark:
        marks.append((now - start, device_used_mib(), rss_mib()))
        print(
            f"{now - start:6.1f} s: {loaders} loaders, {batches} batches, {bytes_checked / 1e9:.1f} GB checked; "
            f"device memory in use {marks[-1][1]:.0f} MiB, peak resident {marks[-1][2]:.0f} MiB",
            flush=True,
        )
        next_mark = now + 60
torch.cuda.synchronize()
marks.append((time.monotonic() - start, device_used_mib(), rss_mib()))
print(
    f"done: {loaders} loaders, {batches} batches, {bytes_checked / 1e9:.1f} GB checked, every byte equal; "
    f"device memory in use {marks[0][1]:.0f} -> {marks[-1][1]:.0f} MiB, peak resident {marks[0][2]:.0f} -> {marks[-1][2]:.0f} MiB"
)
# Growth after the first minute (warm caches) would be a leak.
if len(marks) > 2:
    assert marks[-1][1] <= marks[1][1] + 64, "device memory in use kept growing"
    assert marks[-1][2] <= marks[1][2] + 64, "resident memory kept growing"
