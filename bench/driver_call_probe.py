"""What one CUDA driver call costs on the calling thread, by stream: cuEventRecord,
cuStreamWaitEvent on a completed event and cuEventQuery, on the legacy default stream, the NULL
stream, a blocking and a non-blocking stream of our own, with the GPU idle and while copies run
on another stream. ctypes straight to libcuda; for reference, the cheapest call: a query of an
event already complete.
A probe, not part of the tables: python3 bench/driver_call_probe.py
"""

import ctypes
import time

import torch

torch.zeros(1, device="cuda")
torch.cuda.synchronize()
cu = ctypes.CDLL("libcuda.so.1")
DISABLE_TIMING_BLOCKING_SYNC = 3


def event():
    e = ctypes.c_void_p()
    assert cu.cuEventCreate(ctypes.byref(e), DISABLE_TIMING_BLOCKING_SYNC) == 0
    return e


def stream(flags):
    s = ctypes.c_void_p()
    assert cu.cuStreamCreate(ctypes.byref(s), flags) == 0
    return s


streams = {
    "legacy(1)": ctypes.c_void_p(1),
    "null(0)": ctypes.c_void_p(0),
    "blocking": stream(0),
    "non-blocking": stream(1),
}
busy = stream(1)
pin = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
dev = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
N = 20000
events = [event() for _ in range(64)]
done = event()
assert cu.cuEventRecord(done, streams["non-blocking"]) == 0
assert cu.cuEventSynchronize(done) == 0


CUDA_SUCCESS, CUDA_ERROR_NOT_READY = 0, 600


def per_call_us(fn, allowed=(CUDA_SUCCESS,)):
    """The best of three timings of N calls, after one untimed call that must succeed (a call
    that fails fast would otherwise time as a cheap one)."""
    code = fn(0)
    assert code in allowed, f"driver call failed with CUresult {code}"
    best = 1e9
    for _ in range(3):
        t0 = time.perf_counter_ns()
        for i in range(N):
            fn(i)
        best = min(best, (time.perf_counter_ns() - t0) / N / 1e3)
    return best


cheapest = per_call_us(lambda i: cu.cuEventQuery(done))
for gpu_busy in [False, True]:
    for name, s in streams.items():
        if gpu_busy:
            for _ in range(40):  # about 200 ms of copies on another non-blocking stream
                code = cu.cuMemcpyHtoDAsync_v2(
                    ctypes.c_uint64(dev.data_ptr()),
                    ctypes.c_void_p(pin.data_ptr()),
                    ctypes.c_size_t(256 << 20),
                    busy,
                )
                assert code == 0, f"the copies that keep the GPU busy failed with CUresult {code}"
        record = per_call_us(lambda i: cu.cuEventRecord(events[i & 63], s))
        wait = per_call_us(lambda i: cu.cuStreamWaitEvent(s, done, 0))
        query = per_call_us(
            lambda i: cu.cuEventQuery(events[i & 63]), (CUDA_SUCCESS, CUDA_ERROR_NOT_READY)
        )
        print(
            f"{'GPU busy' if gpu_busy else 'GPU idle'} {name:13s}: cuEventRecord {record:5.2f} us, "
            f"cuStreamWaitEvent(done) {wait:5.2f} us, cuEventQuery {query:5.2f} us (a completed event's query: {cheapest:4.2f} us)"
        )
        torch.cuda.synchronize()
        assert cu.cuCtxSynchronize() == 0
