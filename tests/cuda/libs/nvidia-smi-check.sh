#!/usr/bin/env bash
# NVIDIA's own nvidia-smi, through the guest's libnvidia-ml.so.1 (first
# in LD_LIBRARY_PATH): it must list one GPU, the vGPU, by its name, with
# the vGPU's quota as its memory (VGPU_EXPECT_MEM bytes, when set).
# Prints PASS/FAIL lines as the CUDA programs do.
set -uo pipefail
smi=${NVIDIA_SMI:-nvidia-smi}
# nvidia-smi runs only beside its own release's NVML: the guest library
# names the release of the NVIDIA userland it finds (its libnvidia-ml).
if [[ -z ${VGPU_NVML_DRIVER_VERSION:-} ]]; then
    # Where the loader's cache has it (not always a standard folder), the
    # file its link names carries the release.
    lib=$(ldconfig -p | awk '$1 == "libnvidia-ml.so.1" { print $NF; exit }')
    lib=$(readlink -f "$lib" 2>/dev/null || true)
    release=${lib##*libnvidia-ml.so.}
    [[ -n $lib && $release != "$lib" && $release == *.* ]] && export VGPU_NVML_DRIVER_VERSION=$release
fi
out=$("$smi" --query-gpu=name,memory.total,memory.used --format=csv,noheader,nounits 2>&1)
rc=$?
if [[ $rc -ne 0 || $out == *Mismatch* ]]; then
    echo "FAIL nvidia-smi: $smi (release ${VGPU_NVML_DRIVER_VERSION:-?}) exited with $rc: ${out//$'\n'/ }"
    exit 1
fi
echo "  $out"
IFS=, read -r name total used <<<"$(head -n 1 <<<"$out")"
total=${total// /}
used=${used// /}
if [[ $name != "vgpud vGPU"* ]]; then
    echo "FAIL nvidia-smi-name: '$name' is not a vGPU"
    exit 1
fi
if [[ -n ${VGPU_EXPECT_MEM:-} && $total != "$((VGPU_EXPECT_MEM >> 20))" ]]; then
    echo "FAIL nvidia-smi-memory: $total MiB, the quota is $((VGPU_EXPECT_MEM >> 20)) MiB"
    exit 1
fi
echo "PASS nvidia-smi $name, $total MiB total, $used MiB used"
"$smi" 2>&1 | sed 's/^/  /'
