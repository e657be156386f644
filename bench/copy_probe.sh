#!/usr/bin/env bash
# Probe, not part of the tables: plain `memcpy` against streaming stores into pinned memory, on
# the GPU machine, with two builds interleaved in one call (the older one before each newer one).
#
#   bash bench/copy_probe.sh OLD NEW
#
# OLD and NEW are folders under .device-carry/ each holding a wheel and a `pinfeed` binary
# (NEW may be `.`, the folder bench/prepare_device.sh fills); `copy_rates` (the example of
# pinfeed-source) beside them. Prints what it measures; writes nothing but $OUT/copy_probe.txt.
set -uo pipefail
C=.device-carry
OUT=${OUT:-/tmp/pinfeed-out}
mkdir -p "$OUT"
OLD=$C/$1 NEW=$C/$2
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/copy_probe.txt") 2>&1

echo "== machine"
lscpu | grep -E "^Model name|^Socket|^Core|^Thread|^L2|^L3|^NUMA node\(s\)"
ldd --version | head -1
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader

echo "== copy_rates: the CPU's copy rate into a 64 MiB arena, plain and streaming"
$C/copy_rates 1 4 8 12 16

for b in old new; do
    dir=$OLD; [ $b = new ] && dir=$NEW
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-$b "$dir"/*.whl
done

echo "== to_device's CPU time: threads_probe.py, builds interleaved"
for round in 1 2; do
    for b in old new; do
        PYTHONPATH=/tmp/site-$b:bench timeout 120 python3 bench/threads_probe.py 2>&1 | sed "s/^/$b: /"
    done
done

echo "== batch sizes: batch_probe.py, builds interleaved"
for round in 1 2; do
    for b in old new; do
        PYTHONPATH=/tmp/site-$b timeout 120 python3 bench/batch_probe.py $b --sizes 1,4,64
    done
done

echo "== page-cached 4 GiB .npy: pread against the mapping (sequential), old and new mapped gathers"
DATA=/tmp/pinfeed-4g.npy
[ -f $DATA ] || $NEW/pinfeed gen $DATA --records 1489700 --shape 3,31,31 --dtype u8 --seed 1 > /dev/null
cat $DATA > /dev/null
show() { python3 -c "
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    print(f\"  {sys.argv[1]:<26} {r['gbps']:6.2f} GB/s {r['cpu_seconds']:6.2f} s CPU  crc32 {r.get('crc32')}  [{r['reader']}] {r['explanation']}\")" "$1"; }
for round in 1 2; do
    for t in 8 16; do
        $NEW/pinfeed stream $DATA --batch-size 1024 --reader pread --threads $t --json | show "pread $t threads"
        $NEW/pinfeed stream $DATA --batch-size 1024 --reader mmap --threads $t --json | show "new mmap $t threads"
    done
    $OLD/pinfeed stream $DATA --batch-size 1024 --reader mmap --shuffle random --threads 16 --json | show "old mmap random 16"
    $NEW/pinfeed stream $DATA --batch-size 1024 --reader mmap --shuffle random --threads 16 --json | show "new mmap random 16"
done
$NEW/pinfeed stream $DATA --batch-size 1000 --reader mmap --verify --json | show "new mmap --verify" || echo "VERIFY FAILED (mmap)"
$NEW/pinfeed stream $DATA --batch-size 1000 --reader mmap --shuffle random --verify --json | show "new mmap random --verify" || echo "VERIFY FAILED (mmap random)"
python3 -c "import zlib, numpy as np; print('numpy crc32 of the file', zlib.crc32(np.load('$DATA', mmap_mode='r')))"

echo "== the GPU test never run: a pinfeed batch as torch's first CUDA work"
PYTHONPATH=/tmp/site-new timeout 120 python3 -m pytest -q -p no:cacheprovider bindings/python/tests/test_gpu.py --gpu -k torch_touched 2>&1 | tail -3
