#!/usr/bin/env bash
# What a GPU machine is, for comparing machine starts (the CPU copy side differs between hosts of
# one kind): CPU model and count, NUMA, transparent huge pages, memory (and how fast fresh memory
# is first written), the GPU's link, and the CPU's copy rate into pinned memory at several thread
# counts (copy_rates, carried by bench/prepare_device.sh). Prints text; `bench/gpu_run.sh machine`
# keeps it in $OUT/machine_probe.txt.
set -uo pipefail
C=${C:-.device-carry}
echo "== cpu"
lscpu 2>/dev/null | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node|L3|Hypervisor|Flags)" \
    | sed -E 's/^(Flags:\s+).*/\1(avx512f: '"$(grep -c -w avx512f /proc/cpuinfo 2>/dev/null | head -1)"' cpus)/'
grep -m1 "model name" /proc/cpuinfo
# Family, model and stepping tell the host's CPU generation where the name does not.
grep -m4 -E "^(cpu family|model|stepping|microcode)\s*:" /proc/cpuinfo | tr -s '\t ' ' ' | paste -sd ';'
echo "nproc $(nproc)  affinity $(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')"
echo "== memory"
grep -E "MemTotal|MemAvailable|Hugepagesize|AnonHugePages" /proc/meminfo
for f in enabled defrag; do
    echo "thp $f: $(cat /sys/kernel/mm/transparent_hugepage/$f 2>/dev/null || echo unknown)"
done
echo "numa nodes: $(cat /sys/devices/system/node/online 2>/dev/null || echo unknown)"
echo "kernel: $(uname -r)"
# A virtual machine whose host takes back the memory the guest frees (virtio-balloon's free page
# reporting, feature bit 5) backs it again only when it is next touched, at a fraction of the
# speed: the probe writes fresh memory after pauses (bench/probes/first_touch_probe.py).
balloons=0
for d in /sys/bus/virtio/drivers/virtio_balloon/virtio*; do
    [ -r "$d/features" ] || continue
    balloons=$((balloons + 1))
    echo "virtio-balloon $(basename "$d"): free page reporting $(cut -c6 "$d/features" | sed 's/1/on/;s/0/off/')"
done
[ $balloons -eq 0 ] && echo "virtio-balloon: none seen"
python3 "$(dirname "$0")/probes/first_touch_probe.py" --gib 4 --pauses 0,0,10,0
echo "== gpu"
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,pci.bus_id --format=csv,noheader
if [ -x "$C/copy_rates" ]; then
    echo "== copy_rates (GB/s into a pinned arena, bus idle and busy)"
    "$C/copy_rates" 1 2 4 8 12 16
fi
