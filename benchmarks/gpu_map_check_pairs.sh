#!/bin/bash
# The map check at load (draft-token-watch, issue 42) in one real server per pair, in the foreground (a short lease):
# for each pair of PAIRS (default: tokenwise interleaved; make-test-models --preset e2e), start the user's launch
# (EAGLE-3 3 steps, TP1, triton), wait for ready, serve one greedy request, stop, and keep the server's log and its
# sglang-pcie lines in $OUT. SGLang and this checkout's wheel installed in python3 (SGLANG_PCIE_WHEELS=DIR: from that
# offline wheel set first; benchmarks/README.md, "GPU scripts from a clone").
# Usage: PAIRS="tokenwise interleaved" bash benchmarks/gpu_map_check_pairs.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
source benchmarks/gpu_env.sh
source benchmarks/gpu_user_launch.sh
gpu_env --in /tmp python3 sglang sglang_pcie || exit 1  # SGLANG_PCIE_WHEELS=DIR: installs that set first
OUT=${OUT:-/tmp/mapcheck}; mkdir -p "$OUT"
cd /tmp  # python3 -m imports the installed wheel, as users have it
for pair in ${PAIRS:-tokenwise interleaved}; do
  m=/tmp/mapcheck-models-$pair; log=$OUT/$pair-server.log
  python3 -m sglang_pcie make-test-models $m --preset e2e --acceptance $pair > $OUT/$pair-make.txt 2>&1
  t0=$(date +%s)
  setsid python3 -m sglang.launch_server $(user_launch $m) --host 127.0.0.1 --port 30000 > $log 2>&1 &
  pid=$!
  for _ in $(seq 400); do curl -sf 127.0.0.1:30000/health > /dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 1; done
  echo "$pair: ready after $(( $(date +%s) - t0 )) s" | tee -a $OUT/summary.txt
  curl -s 127.0.0.1:30000/generate -H 'Content-Type: application/json' \
    -d '{"input_ids": [11, 450, 4996, 17354, 1701], "sampling_params": {"max_new_tokens": 64, "temperature": 0}}' \
    | head -c 300 >> $OUT/summary.txt; echo >> $OUT/summary.txt
  kill -TERM -- -$pid 2>/dev/null; sleep 6; kill -KILL -- -$pid 2>/dev/null
  grep -a "sglang-pcie\|Traceback\|Error" $log | cut -c1-1200 | tee -a $OUT/summary.txt
done
