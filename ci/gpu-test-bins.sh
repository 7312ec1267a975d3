#!/usr/bin/env bash
# Build the test programs that need a GPU (the CUDA backend's and the
# partition host's, in release) and copy them, stripped, under stable
# names into one folder for the GPU machine, with vgpu-partition-host.
#
# usage: ci/gpu-test-bins.sh [DIR]     (default .devbin/conf)
#
# There, from a checkout:
#   export VGPU_REQUIRE_GPU=1 VGPU_PARTITION_HOST=$PWD/DIR/vgpu-partition-host
#   for t in DIR/*-test; do $t --test-threads=1; done
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$VGPUD_ROOT"

out=${1:-.devbin/conf}
mkdir -p "$out"
rm -f "$out"/*-test
crates=(vgpu-backend-cuda vgpu-partition-host)
args=()
for c in "${crates[@]}"; do
    args+=(-p "$c")
done
# Each test artifact, as "crate target path": the library's own tests and
# every tests/*.rs program.
cargo test --release --no-run --message-format=json "${args[@]}" |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["profile"]["test"] and m.get("executable"):
        crate = m["manifest_path"].split("/")[-2]
        print(crate, m["target"]["name"].replace("_", "-"), m["executable"])
' | while read -r crate target path; do
    name="${crate}-${target}"
    [[ $target == "${crate}" ]] && name="${crate}-unit"
    strip --strip-debug -o "$out/${name}-test" "$path"
done
cargo build --release -p vgpu-partition-host
strip --strip-debug -o "$out/vgpu-partition-host" "${CARGO_TARGET_DIR:-target}/release/vgpu-partition-host"
(cd "$out" && sha256sum -- * >SHA256SUMS)
log "wrote $(find "$out" -name '*-test' | wc -l) test programs and vgpu-partition-host to $out ($(du -sh "$out" | cut -f1))"
