#!/usr/bin/env bash
# PyTorch's view of the GPU it runs on: it must see one CUDA device, the
# vGPU, by its name, with the vGPU's quota as its memory (VGPU_EXPECT_MEM
# bytes, when set) in get_device_properties and mem_get_info. Prints
# PASS/FAIL lines as the CUDA programs do.
#
# usage: torch-check.sh   (TORCH_PYTHON: /opt/torch/.venv/bin/python3)
set -uo pipefail
py=${TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
[[ -x $py ]] || { echo "FAIL torch: no $py"; exit 1; }
exec "$py" - <<'PY'
import os
import sys
import time

t0 = time.monotonic()
import torch

print(f"  torch {torch.__version__} imported in {time.monotonic() - t0:.1f} s")
expect = int(os.environ.get("VGPU_EXPECT_MEM") or 0)
if not torch.cuda.is_available():
    print("FAIL torch-available: torch.cuda.is_available() is False")
    sys.exit(1)
n = torch.cuda.device_count()
name = torch.cuda.get_device_name(0)
p = torch.cuda.get_device_properties(0)
print(f"PASS torch-device {n} device(s): {name!r}, cc {p.major}.{p.minor}, "
      f"{p.multi_processor_count} SMs, {p.total_memory >> 20} MiB")
if not name.startswith("vgpud vGPU"):
    print(f"FAIL torch-name: {name!r} is not a vGPU")
if expect and p.total_memory != expect:
    print(f"FAIL torch-total_memory: {p.total_memory} bytes, the quota is {expect}")
free, total = torch.cuda.mem_get_info()
if expect and total != expect:
    print(f"FAIL torch-mem_get_info: {total} bytes total, the quota is {expect}")
    sys.exit(1)
if not 0 < free <= total:
    print(f"FAIL torch-mem_get_info: {free} bytes free of {total}")
    sys.exit(1)
print(f"PASS torch-mem_get_info {free >> 20} MiB free of {total >> 20} MiB")
PY
