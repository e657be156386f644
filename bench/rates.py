"""The machine's rates beside a benchmark's figures: hosts of one machine kind copy at different
rates (docs/BENCHMARKS.md, "Machines of one kind"), so every result file records the rates its
pinfeed loader measured at start-up (or read from the machine's cache) and the thread count
they gave."""

KEYS = ("threads", "threads_reason", "copy_gbps", "bus_gbps")


def machine_rates(stats):
    """From a loader's ``stats()``: reader threads and why, one thread's copy rate into pinned
    memory (GB/s, among four copying) and the bus's (None where the count was given or there is
    no GPU)."""
    return {k: stats.get(k) for k in KEYS}


def gpu_name():
    """The first GPU's name as nvidia-smi gives it ("NVIDIA H100 80GB HBM3"), or None without
    one: the one-GPU machine comes as more than one card."""
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None
