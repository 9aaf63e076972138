#!/bin/bash
# A short GPU diagnosis of FlashInfer's PCIe-IPC all-reduce through tune-nccl's worker (the path that failed in the
# first 2 x H200 run: "rank 0 exited without a report", and a 90 s timeout in ipc_allreduce.py).
#   bash benchmarks/ipc_smoke.sh      (from the checkout root, torch and FlashInfer 0.7.2 installed in PYTHON, default
#                                      python3; without a package index SGLANG_PCIE_FI_WHEELS=DIR, the wheel set
#                                      benchmarks/gpu_fi_wheels.sh writes, goes into /tmp/fi instead)
# Bounded by BUDGET seconds (default 240); a step that no longer fits is skipped, saying so. Everything also goes to
# $OUT/smoke.log (default OUT=/tmp/ipc-smoke). Steps:
#   0. FlashInfer (SGLANG_PCIE_FI_WHEELS into /tmp/fi on PYTHONPATH, else the python's own), imported and the JIT
#      modules the IPC path needs built once, in one process (so the ranks load them, not race to build them):
#      pcie_ipc_comm (the kernels) and trtllm_utils (the delay kernel FlashInfer's autotuner launches before timing
#      each candidate: if it cannot be built, tune() counts every candidate as failed and saves nothing - a trimmed
#      wheel without data/csrc/nv_internal does that);
#   1. the IPC path at TOKENS (default 1,8) x HIDDEN (default 7168) bf16, 122 all-reduces per CUDA graph, sums
#      checked, FlashInfer's seed launch configurations (--no-tune): workspace, prepare, capture, replay, destroy;
#   2. the same with FlashInfer's tune() first (rows 1,2,4,8 for 8 tokens, as SGLang's adapter asks for an 8-row
#      workspace), into a scratch cache;
#   3. tune-nccl, the default NCCL profile only, then its PCIe-IPC runs at TOKENS (needs step 2's time + about 45 s;
#      skipped, saying so, when less is left: a run cut short by its time bound is not a hang).
# HIDDEN=4096 TOKENS=1,8,64 repeats the sizes at which ipc_allreduce.py timed out in the first run.
# Every step prints each rank's stderr tail: the workers' timed progress lines ("phase: ..."), and on a failure its
# traceback, or on a hang every thread's Python stack (dumped just before the ranks are killed).
set -u
OUT=${OUT:-/tmp/ipc-smoke}
BUDGET=${BUDGET:-240}
HIDDEN=${HIDDEN:-7168}
TOKENS=${TOKENS:-1,8}
LOG=smoke.log
source benchmarks/gpu_common.sh

FI=${SGLANG_PCIE_FI_WHEELS:-}
if [ -n "$FI" ]; then
  step "0. FlashInfer from $FI (SGLANG_PCIE_FI_WHEELS) into /tmp/fi"
  if ! ls "$FI"/*.whl >/dev/null 2>&1; then echo "no $FI/*.whl (SGLANG_PCIE_FI_WHEELS): nothing to test"; exit 1; fi
  if [ ! -d /tmp/fi/flashinfer ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/fi "$FI"/*.whl \
      || { echo "pip install failed"; exit 1; }
  fi
  export PYTHONPATH=/tmp/fi:$PYTHONPATH PATH=/tmp/fi/bin:$PATH
else
  step "0. FlashInfer, the python's own (no SGLANG_PCIE_FI_WHEELS)"
  if ! $PY -c "import flashinfer" 2>/dev/null; then
    echo "$PY cannot import flashinfer: pip install flashinfer-python==0.7.2, or without a package index" \
         "SGLANG_PCIE_FI_WHEELS=DIR (bash benchmarks/gpu_fi_wheels.sh writes one): nothing to test"; exit 1
  fi
fi
T=$(( $(left) - 30 )); [ $T -gt 150 ] && T=150
STEP0=$(date +%s)
timeout $T $PY - <<'PY'
import os, sys, time
t = time.time()
import torch, flashinfer
from flashinfer.comm.pcie_ipc_ar import get_pcie_ipc_comm_module
from flashinfer.jit.tllm_utils import gen_trtllm_utils_module
from flashinfer.tllm_utils import get_trtllm_utils_module
print(f"torch {torch.__version__}, {torch.cuda.device_count()} GPUs; flashinfer {flashinfer.__version__} imported in {time.time() - t:.1f} s", flush=True)
t = time.time()
get_pcie_ipc_comm_module()
print(f"PCIe-IPC kernels (pcie_ipc_comm) built/loaded in {time.time() - t:.1f} s", flush=True)
missing = [str(s) for s in gen_trtllm_utils_module().sources if not os.path.exists(s)]
if missing:
    print(f"trtllm_utils (the autotuner's delay kernel) cannot be built: {len(missing)} source(s) missing, e.g. {missing[0]}"
          " - tune() will count every candidate as failed and save nothing (a wheel set must keep data/csrc/nv_internal)", flush=True)
    sys.exit(3)
t = time.time()
get_trtllm_utils_module()
print(f"trtllm_utils (the autotuner's delay kernel) built/loaded in {time.time() - t:.1f} s", flush=True)
PY
RC=$?
case $RC in
  0) echo "exit 0 after $(( $(date +%s) - STEP0 )) s";;
  124) echo "exit 124: timed out after $T s";;
  *) echo "exit $RC after $(( $(date +%s) - STEP0 )) s";;
esac

run_ipc() {  # $1: at most this many seconds, $2: label, rest: ipc_allreduce.py options
  local cap=$1 label=$2; shift 2
  local T=$(( $(left) - 3 )); [ $T -gt $cap ] && T=$cap
  step "$label"
  if [ $T -lt 20 ]; then echo "skipped: $(left) s left (BUDGET=$BUDGET)"; return; fi
  local began=$(date +%s)
  timeout $(( T + 2 )) $PY -m benchmarks.ipc_allreduce --paths pcie-ipc --hidden "$HIDDEN" --tokens "$TOKENS" \
    --timeout $(( T - 2 )) --show-stderr "$@"
  local rc=$?
  LAST_S=$(( $(date +%s) - began ))
  echo "exit $rc after $LAST_S s"
}
LAST_S=60
run_ipc 40 "1. PCIe-IPC at $TOKENS x $HIDDEN, seed configurations (no tune())" --no-tune --out "$OUT/seed"
LAST_S=60
run_ipc 150 "2. PCIe-IPC at $TOKENS x $HIDDEN after FlashInfer's tune() (rows: powers of 2 up to the largest)" --out "$OUT/tuned"

step "3. tune-nccl: default NCCL profile, then the PCIe-IPC runs at $TOKENS x $HIDDEN"
# The IPC part repeats step 2's run (JIT load + tune(): its bound gets step 2's time + 50%), then a second IPC run
# from the cache; before it, two NCCL runs of the default profile (about 6 s each).
IPC_T=$(( LAST_S * 3 / 2 + 10 ))
NEED=$(( IPC_T + 45 ))
T=$(( $(left) - 3 ))
if [ $T -ge $NEED ]; then
  timeout $T $PY -m sglang_pcie tune-nccl --profiles default --tokens "$TOKENS" --prefill-tokens none --hidden "$HIDDEN" \
    --ipc on --timeout 40 --ipc-timeout $IPC_T --out "$OUT/tune.json"
  echo "exit $?"
else echo "skipped: $(left) s left, about $NEED s needed (step 2 took $LAST_S s; BUDGET=$BUDGET)"; fi
echo; echo "=== done in $(( $(date +%s) - START )) s; log: $OUT/smoke.log"
