"""Does page-locking a pageable source in place scale with threads? A probe, not part of the tables.

python3 bench/probes/register_probe.py [--rows 1024 --cols 655360]

The seed tensor (2.68 GB of float32, pageable, touched) is cut into page-aligned chunks; T
threads take chunks from a shared counter and, for each, `cuMemHostRegister`, (optionally) copy
it to the GPU on their own stream and wait, then `cuMemHostUnregister`. Prints GB/s and the
process's CPU time against torch's `i.pin_memory().cuda(non_blocking=True)` in the same run.
Driver API through ctypes (which releases the GIL during each call).
"""

import argparse
import ctypes
import threading
import time

import torch

PAGE = 4096

cuda = ctypes.CDLL("libcuda.so.1")
for name, res in [
    ("cuMemHostRegister_v2", ctypes.c_int),
    ("cuMemHostUnregister", ctypes.c_int),
    ("cuMemcpyHtoDAsync_v2", ctypes.c_int),
    ("cuStreamSynchronize", ctypes.c_int),
    ("cuCtxGetCurrent", ctypes.c_int),
    ("cuCtxSetCurrent", ctypes.c_int),
]:
    getattr(cuda, name).restype = res
cuda.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
cuda.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
cuda.cuMemcpyHtoDAsync_v2.argtypes = [
    ctypes.c_uint64,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_void_p,
]
cuda.cuStreamSynchronize.argtypes = [ctypes.c_void_p]


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} failed: CUresult {rc}")


def thp_state():
    try:
        return open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip()
    except OSError:
        return "unknown"


def anon_huge_kb():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return -1


def run(src, dst, threads, chunk, copy):
    base = src.data_ptr()
    start = (base + PAGE - 1) // PAGE * PAGE
    end = (base + src.numel() * src.element_size()) // PAGE * PAGE
    offsets = list(range(start, end, chunk))
    nxt = [0]
    lock = threading.Lock()
    torch.cuda.synchronize()
    ctx = ctypes.c_void_p()
    check(cuda.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    errors = []

    def work():
        try:
            check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
            stream = torch.cuda.Stream()
            s = ctypes.c_void_p(stream.cuda_stream)
            while True:
                with lock:
                    i = nxt[0]
                    nxt[0] += 1
                if i >= len(offsets):
                    return
                p = offsets[i]
                n = min(chunk, end - p)
                check(cuda.cuMemHostRegister_v2(p, n, 0), "cuMemHostRegister")
                if copy:
                    check(
                        cuda.cuMemcpyHtoDAsync_v2(dst.data_ptr() + (p - base), p, n, s),
                        "cuMemcpyHtoDAsync",
                    )
                    check(cuda.cuStreamSynchronize(s), "cuStreamSynchronize")
                check(cuda.cuMemHostUnregister(p), "cuMemHostUnregister")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    c0, t0 = time.process_time(), time.perf_counter()
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if errors:
        raise errors[0]
    return (end - start) / wall / 1e9, cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=655360)
    args = ap.parse_args()
    a = torch.rand(args.rows, args.cols)
    dst = torch.empty_like(a, device="cuda")
    print(f"THP: {thp_state()}; AnonHugePages of this process: {anon_huge_kb()} kB")
    torch.cuda.synchronize()
    c0, t0 = time.process_time(), time.perf_counter()
    for i in a:
        i.pin_memory().cuda(non_blocking=True)
    torch.cuda.synchronize()
    tw, tc = time.perf_counter() - t0, time.process_time() - c0
    total = a.numel() * 4
    print(
        f"torch i.pin_memory().cuda(non_blocking=True): {total / tw / 1e9:6.2f} GB/s, CPU {tc * 1e3:6.0f} ms"
    )
    for copy in [False, True]:
        for chunk_mib in [16, 64]:
            for threads in [1, 2, 4, 8, 16]:
                gbps, cpu = run(a, dst, threads, chunk_mib << 20, copy)
                what = "register+copy+unregister" if copy else "register+unregister"
                print(
                    f"{what:<26} chunk {chunk_mib:3d} MiB threads {threads:2d}: {gbps:6.2f} GB/s, CPU {cpu * 1e3:6.0f} ms ({cpu / tc:.2f}x torch)"
                )
    # Only whole pages were registered and copied: compare those.
    base = a.data_ptr()
    lo = ((base + PAGE - 1) // PAGE * PAGE - base) // 4
    hi = ((base + a.numel() * 4) // PAGE * PAGE - base) // 4
    assert torch.equal(dst.view(-1)[lo:hi].cpu(), a.view(-1)[lo:hi]), "bytes differ"
    print(f"the copied pages ({(hi - lo) * 4} bytes) equal the source")


if __name__ == "__main__":
    main()
