#!/bin/bash
# Builds, on a machine with a package index, the FlashInfer 0.7.2 wheel set that benchmarks/ipc_allreduce.py and
# `sglang-pcie tune-nccl` need on a GPU machine without one (Python 3.12, manylinux x86_64, torch already there):
#   flashinfer-python 0.7.2, trimmed: data/csrc keeps only the PCIe-IPC sources and the shared headers, data/cutlass
#                     goes (the PCIe-IPC kernels include neither); the Python package is whole, so `import flashinfer`
#                     behaves as released.  65 MB -> ~33 MB.
#   apache-tvm-ffi    flashinfer's JIT ABI (imported at `import flashinfer`; was missing on the lent H200 image)
#   cuda-bindings 13.0 + cuda-pathfinder   flashinfer.comm imports cuda.bindings.driver at import time
#   nvidia-ml-py      pynvml, imported by flashinfer.utils
#   ninja             the JIT build of the kernels at first use
# Output: .gpu-fi/ in the checkout (listed in .git/info/exclude, not .gitignore), < 60 MiB.
#     bash benchmarks/gpu_fi_wheels.sh [CHECKOUT]
# On the GPU machine, carried along: SGLANG_PCIE_FI_WHEELS=.gpu-fi bash benchmarks/gpu_nccl_ipc.sh (or ipc_smoke.sh):
# they install it with pip install --no-index --no-deps --target /tmp/fi and put /tmp/fi first on PYTHONPATH.
set -euo pipefail
CHECKOUT=$(cd "${1:-.}" && pwd)
cd "$CHECKOUT"
grep -qx '/.gpu-fi/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.gpu-fi/' >> .git/info/exclude; }
RAW=$(mktemp -d)
trap 'rm -rf "$RAW"' EXIT
rm -rf .gpu-fi && mkdir -p .gpu-fi
PLAT=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
python3 -m pip download -q "${PLAT[@]}" -d "$RAW" flashinfer-python==0.7.2 "apache-tvm-ffi>=0.1.11,<0.2" \
    "cuda-bindings>=13.0,<13.1" "cuda-pathfinder~=1.1" nvidia-ml-py ninja
python3 - "$RAW"/flashinfer_python-0.7.2-*.whl .gpu-fi <<'PY'
import os, sys, zipfile
src, dest = sys.argv[1:]
CSRC = "flashinfer/data/csrc/"
def keep(name):
    if name.startswith("flashinfer/data/cutlass/"):
        return False
    if name.startswith(CSRC):
        rest = name[len(CSRC):]
        # top-level headers are shared by every JIT module; of the sources, only the PCIe-IPC ones
        # nv_internal/: the delay kernel (trtllm_utils) FlashInfer's autotuner launches before timing each
        # candidate; without it tune() measures nothing and saves no configuration.
        return rest.startswith("nv_internal/") or (
            "/" not in rest and (rest.endswith((".h", ".cuh")) or rest.startswith("pcie_ipc_")))
    return True
out = os.path.join(dest, os.path.basename(src))
kept = dropped = 0
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zout:
    for info in zin.infolist():
        if not keep(info.filename):
            dropped += 1
            continue
        data = zin.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            data = "".join(l for l in data.decode().splitlines(True) if keep(l.split(",", 1)[0])).encode()
        zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
        kept += 1
print(f"{out}: kept {kept} members, dropped {dropped}; {os.path.getsize(out) / 2**20:.1f} MiB")
PY
for w in "$RAW"/*.whl; do case $(basename "$w") in flashinfer_python-*) ;; *) cp "$w" .gpu-fi/ ;; esac; done
ls -la .gpu-fi && du -sh .gpu-fi
