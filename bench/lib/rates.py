"""The machine's rates beside a benchmark's figures: hosts of one machine kind copy at different
rates (docs/BENCHMARKS.md, "Across hosts of one kind"), so every result file records the rates
its pinfeed loader measured at start-up (or read from the machine's cache) and the thread count
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


def host_cpu():
    """The CPU the guest is shown: model name, family/model/stepping and the last-level cache
    (MiB). Hosts of one machine kind differ in it (docs/BENCHMARKS.md, "Across hosts of one
    kind"), so result files record it beside the rates."""
    from pathlib import Path

    info = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "cpu family", "model", "stepping") and key not in info:
                info[key] = value.strip()
            if not line.strip() and info:
                break
    except OSError:
        pass
    l3 = Path("/sys/devices/system/cpu/cpu0/cache/index3/size")
    try:
        size = l3.read_text().strip()  # "107520K"
        info["l3_mib"] = int(size.rstrip("KMG")) / {"K": 1024, "M": 1, "G": 1 / 1024}[size[-1]]
    except (OSError, ValueError, KeyError, IndexError):
        info["l3_mib"] = None
    return info


def cpu_times():
    """The machine's CPU time so far, summed over its CPUs, in clock ticks by kind (the first
    line of /proc/stat: user, nice, system, idle, iowait, irq, softirq, steal), or None where
    it cannot be read."""
    from pathlib import Path

    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return [int(x) for x in fields[1:9]]
    except (OSError, IndexError, ValueError):
        return None


def steal_share(before, after):
    """Of the CPU time between two ``cpu_times()``, the share the hypervisor ran other work on
    this guest's CPUs (`steal`): a host busy with other guests shows here, where the guest's own
    figures cannot tell it from a slow one. None where either reading is missing."""
    if before is None or after is None or len(before) < 8 or len(after) < 8:
        return None
    total = sum(after) - sum(before)
    return (after[7] - before[7]) / total if total > 0 else 0.0
