#!/bin/bash
# The issue-12 evidence run on a 2-GPU machine (SGLang 0.5.16 from ../shared/gpu-e2e, this checkout's wheel
# installed by its step2.sh): tiny test models, then `sglang-pcie bench` with baseline / overlay / profile in
# counterbalanced repeats, optionally the EAGLE step sweep and the explicit `pcie` NCCL profile, in the background.
#   REPEATS=3 SWEEP=1 WAIT=540 bash benchmarks/gpu_bench_evidence.sh   (BATCH, STREAM: requests per phase; ACCEPTANCE:
#   make-test-models --acceptance, default mixed)
# It waits up to WAIT seconds (under the 600 s per-call limit), then prints the report so far and packs the run into
# $OUT/bench-run.tgz. If the bench is still running, collect it with a follow-up call WITHIN 30 SECONDS (the lent
# machine is given back after 30 s idle, killing the background run - that lost one run on 2026-11-30):
#   COLLECT=1 WAIT=540 bash benchmarks/gpu_bench_evidence.sh
# Each server takes ~55 s to start (162 s the first time on a fresh machine: JIT builds) and ~17 s of workload.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export CUDA_HOME=/usr/local/cuda PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
RUN=/tmp/bench-run
cd /tmp   # python3 -m imports the installed wheel, as users have it, not the checkout
if [ "${COLLECT:-0}" != 1 ]; then
  python3 -m sglang_pcie make-test-models /tmp/bench-models --preset e2e --acceptance "${ACCEPTANCE:-mixed}" || exit 1
  VARIANTS=(--variant overlay --variant profile)
  if [ "${SWEEP:-0}" = 1 ]; then
    VARIANTS+=(--variant 'steps2:args=--speculative-num-steps 2 --speculative-num-draft-tokens 3;repeats=1'
               --variant 'steps5:args=--speculative-num-steps 5 --speculative-num-draft-tokens 6;repeats=1'
               --variant 'nccl-pcie:env=SGLANG_PCIE_NCCL_PROFILE=pcie;repeats=1')
  fi
  ARGS=(--out $RUN --repeats "${REPEATS:-3}" "${VARIANTS[@]}" --env NCCL_DEBUG=INFO --env NCCL_DEBUG_SUBSYS=ENV
    --concurrency 32 --batch-requests "${BATCH:-96}" --stream-requests "${STREAM:-4}" --input-len 128 --output-len 256
    --start-timeout 300
    -- --model-path /tmp/bench-models/target --speculative-algorithm EAGLE3
    --speculative-draft-model-path /tmp/bench-models/draft --speculative-num-steps 3 --speculative-eagle-topk 1
    --speculative-num-draft-tokens 4 --tp-size 2 --attention-backend triton --skip-tokenizer-init
    --mem-fraction-static 0.5 --max-running-requests 32 --cuda-graph-bs-decode 1 32 --disable-prefill-cuda-graph)
  python3 -m sglang_pcie bench --dry-run "${ARGS[@]}" | head -3
  setsid nohup python3 -m sglang_pcie bench "${ARGS[@]}" > /tmp/bench-run.stdout 2> /tmp/bench-run.stderr < /dev/null &
fi
T0=$(date +%s)
while pgrep -f "sglang_pcie bench" > /dev/null && [ $(( $(date +%s) - T0 )) -lt "${WAIT:-540}" ]; do sleep 5; done
tail -n 30 $RUN/progress.log 2>/dev/null || tail -n 20 /tmp/bench-run.stderr
python3 -m sglang_pcie bench --report $RUN > /tmp/bench-report.txt 2>&1; echo "report exit $?"
grep -v "^NCCL read" /tmp/bench-report.txt | tail -n 45
tar czf "$OUT/bench-run.tgz" --exclude='*.safetensors' -C /tmp bench-run bench-run.stdout bench-run.stderr bench-report.txt
pgrep -f "sglang_pcie bench" > /dev/null && echo "STILL RUNNING: collect within 30 s (COLLECT=1)"
