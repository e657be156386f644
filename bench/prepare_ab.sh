#!/usr/bin/env bash
# Builds the Python wheel of another revision into .device-carry/NAME/ for an A/B run on the GPU
# machine (run bench/prepare_device.sh first: it empties .device-carry/). The revision is built
# in a worktree of its own with a cargo target of its own: a target shared with another checkout
# can hand maturin a library built from another revision.
#
#   bench/prepare_ab.sh REV [NAME]      (NAME defaults to "old")
#   then on the GPU machine: pip install --target /tmp/site-NAME .device-carry/NAME/*.whl and
#   run each probe once per build, interleaved (e.g. bench/probes/batch_probe.py NAME --sizes 1,4).
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:?usage: bench/prepare_ab.sh REV [NAME]}
NAME=${2:-old}
C=.device-carry
ls $C/*.whl >/dev/null 2>&1 || { echo "prepare_ab: no current wheel in $C/; run bench/prepare_device.sh first" >&2; exit 2; }
SHA=$(git rev-parse --verify "$REV^{commit}")
WT=$(mktemp -d /tmp/pinfeed-ab-XXXXXX)
trap 'git worktree remove --force "$WT" >/dev/null 2>&1 || true' EXIT
git worktree add --detach "$WT" "$SHA" >/dev/null
(cd "$WT" && CARGO_TARGET_DIR="$WT/target" python3 -m maturin build --release --strip -m bindings/python/Cargo.toml -o "$WT/wheel" --quiet)
rm -rf "${C:?}/$NAME" && mkdir -p "$C/$NAME"
cp "$WT"/wheel/*.whl "$C/$NAME/"
# Which revision the wheel is, for the run's log (gpu_run.sh prints it).
git log -1 --format='%h %s' "$SHA" > "$C/$NAME/revision.txt"
echo "$C/$NAME/: the wheel of $(cat "$C/$NAME/revision.txt")"
