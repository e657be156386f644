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
# Test binaries that hold GPU tests (marked #[ignore = "needs a CUDA device"]).
for pkg in pinfeed-cuda pinfeed; do
    cargo test --release --locked -p "$pkg" --no-run --message-format=json 2>/dev/null \
      | python3 -c "
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get('reason') == 'compiler-artifact' and m.get('executable') and m['target']['kind'] == ['test'] and m['target']['name'] == 'integration':
        print(m['executable'])" \
      | while read -r exe; do cp "$exe" "$C/tests/$pkg-integration"; strip "$C/tests/$pkg-integration"; done
done
# The loader's unit tests, which hold GPU tests of its device cache.
cargo test --release --locked -p pinfeed --lib --no-run --message-format=json 2>/dev/null \
  | python3 -c "
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get('reason') == 'compiler-artifact' and m.get('executable') and m['target']['kind'] == ['lib']:
        print(m['executable'])" \
  | while read -r exe; do cp "$exe" "$C/tests/pinfeed-lib"; strip "$C/tests/pinfeed-lib"; done
# The soak test binary (its GPU soak runs for minutes, so not with the tests above).
cargo test --release --locked -p pinfeed --test soak --no-run --message-format=json 2>/dev/null \
  | python3 -c "
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get('reason') == 'compiler-artifact' and m.get('executable') and m['target']['name'] == 'soak':
        print(m['executable'])" \
  | while read -r exe; do cp "$exe" "$C/soak"; strip "$C/soak"; done
if [ -f bindings/python/pyproject.toml ]; then
    python3 -m maturin build --release -m bindings/python/Cargo.toml -o "$C" --quiet
fi
du -sh "$C"/* "$C"/tests/*
