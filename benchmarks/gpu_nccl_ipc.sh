#!/bin/bash
# One GPU-machine run for "NCCL measured or untouched" and "The PCIe-IPC all-reduce, measured" (any rank count:
# every visible GPU is used, so TP4/TP8 on a 4- or 8-GPU machine run the same way; TP=2 picks the first 2).
#   bash benchmarks/gpu_nccl_ipc.sh            (from the checkout root, torch installed in PYTHON, default python3)
# FlashInfer (0.7.2 in the published runs): the python's own (pip install flashinfer-python==0.7.2), or, where the
# machine has no package index, SGLANG_PCIE_FI_WHEELS=DIR: the wheel set benchmarks/gpu_fi_wheels.sh writes, installed
# into /tmp/fi (PYTHONPATH) so that the python's own packages stay as they are.
# Writes everything under $OUT (default /tmp/gpu-nccl-ipc): run.log, tune-p2p.{json,md}, tune-nop2p.{json,md},
# ipc-bench/results.json, ipc.md, flashinfer-autotune/*.json, env.txt. Steps, in order of importance, each bounded
# so that the whole run stays under BUDGET seconds (default 400; expected about 6 minutes on 2 x H200 with a cold
# JIT build); a step that no longer fits is skipped, saying so:
#   0. machine facts; FlashInfer (from SGLANG_PCIE_FI_WHEELS into /tmp/fi, or the python's own) imported once and
#      its PCIe-IPC kernels JIT-built once (nvcc), so the measuring processes load them from the cache;
#   1. sglang-pcie tune-nccl: decode 1,2,4,8 + prefill 512,2048,8192 tokens x 7168, 13 NCCL profiles, then the
#      PCIe-IPC path (FlashInfer tune() into its default cache path, two measured runs);
#   2. benchmarks/ipc_allreduce.py: IPC vs NCCL at 1-64 tokens x 4096 and 7168, CUDA graphs, sums checked;
#   3. tune-nccl again with NCCL_P2P_DISABLE=1 (6 profiles; --ipc off: that switch does not touch the IPC path,
#      which steps 1 and 2 measure), into its own file.
# If FlashInfer does not install, import or build, its reason is printed and the NCCL parts still run.
# PROFILES=a,b,...: only these NCCL profiles in step 1 (the defaults always run); NOP2P=0 skips step 3. Both shorten
# the run when device time is short (the full 13-profile and no-P2P tables of 2026-11-30 are in
# benchmarks/results/2026-11-30-h200x2/).
set -u
OUT=${OUT:-/tmp/gpu-nccl-ipc}
BUDGET=${BUDGET:-400}
LOG=run.log
source benchmarks/gpu_common.sh

step "0. machine"
{
  $PY -V; nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader; nvidia-smi topo -m
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
  command -v nvcc && nvcc --version | tail -1
} | tee "$OUT/env.txt"

FI=${SGLANG_PCIE_FI_WHEELS:-}
if [ -n "$FI" ]; then FROM="from $FI (SGLANG_PCIE_FI_WHEELS) into /tmp/fi"; else FROM="the python's own"; fi
step "0. FlashInfer, $FROM"
FI_OK=0
if [ -z "$FI" ] || { ls "$FI"/*.whl >/dev/null 2>&1 && rm -rf /tmp/fi &&
     $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/fi "$FI"/*.whl; }; then
  [ -z "$FI" ] || export PYTHONPATH=/tmp/fi${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/fi/bin:$PATH
  # Import once (writes the .pyc files, builds tvm-ffi's torch addon if it needs one), then build the PCIe-IPC
  # kernels once; the measuring processes then load both from the caches.
  if timeout 150 $PY - <<'PY'
import time
t = time.time()
import flashinfer
from flashinfer.comm import PcieIpcAllReduceWorkspace
from flashinfer.comm.pcie_ipc_tuning import default_cache_path
print(f"flashinfer {flashinfer.__version__} imported in {time.time() - t:.1f} s; tune cache for 2 ranks: {default_cache_path(2)}")
t = time.time()
from flashinfer.comm.pcie_ipc_ar import get_pcie_ipc_comm_module
get_pcie_ipc_comm_module()
print(f"PCIe-IPC kernels built/loaded in {time.time() - t:.1f} s")
PY
  then FI_OK=1; else echo "FlashInfer import/JIT build failed or timed out (above): the IPC path is reported as failed, NCCL runs on"; fi
else
  echo "FlashInfer wheels missing in $FI or did not install: the IPC path is not measured, NCCL runs on"
fi
$PY -m sglang_pcie env | tee -a "$OUT/env.txt"

step "1. tune-nccl (NCCL profiles at decode + prefill sizes, PCIe-IPC at decode sizes)"
T=$(( $(left) - 130 )); [ $T -gt 240 ] && T=240
if [ $T -gt 60 ]; then
  timeout $T $PY -m sglang_pcie tune-nccl --out "$OUT/tune-p2p.json" --ipc-timeout 120 \
    ${PROFILES:+--profiles "$PROFILES"} > "$OUT/tune-p2p.md"
  echo "exit $?"; cat "$OUT/tune-p2p.md"
else echo "skipped: $(left) s left"; fi

step "2. IPC vs NCCL, 1-64 tokens x 4096 / 7168"
T=$(( $(left) - 60 )); [ $T -gt 120 ] && T=120
if [ $T -gt 40 ] && [ $FI_OK = 1 ]; then
  # Each IPC run tunes max(tokens) x hidden first (7 row counts at 64 tokens, more than tune-nccl's 4): one run may
  # take most of the step; 7168 (Kimi-K2.5, tune-nccl's size) first.
  timeout $T $PY -m benchmarks.ipc_allreduce --out "$OUT/ipc-bench" --hidden 7168,4096 --timeout $(( T - 20 )) \
    > "$OUT/ipc.md"
  echo "exit $?"; cat "$OUT/ipc.md"
else echo "skipped: $(left) s left, FlashInfer usable: $FI_OK"; fi

step "3. tune-nccl with NCCL_P2P_DISABLE=1 (traffic through host memory, as on PCIe boxes without P2P)"
T=$(( $(left) - 5 ))
if [ "${NOP2P:-1}" = 0 ]; then echo "skipped: NOP2P=0"
elif [ $T -gt 45 ]; then
  NCCL_P2P_DISABLE=1 timeout $T $PY -m sglang_pcie tune-nccl --out "$OUT/tune-nop2p.json" --ipc off \
    --profiles pcie,proto-LL,ring-LL,channels-4,buffsize-128k > "$OUT/tune-nop2p.md"
  echo "exit $?"; cat "$OUT/tune-nop2p.md"
else echo "skipped: $(left) s left"; fi

mkdir -p "$OUT/flashinfer-autotune"
cp ~/.cache/flashinfer/*/*/autotune/pcie_ipc_all_reduce_ws*.json "$OUT/flashinfer-autotune/" 2>/dev/null  # <version>/<arch>/
SGLANG_PCIE_TUNED_FILE="$OUT/tune-p2p.json" $PY -m sglang_pcie env > "$OUT/env-after.txt" 2>&1
echo; echo "=== done in $(( $(date +%s) - START )) s"; cat "$OUT/env-after.txt"
