#!/bin/bash
# The EAGLE profiler's cost where the host is the bottleneck, on ONE H200 (SGLang 0.5.16 from ../shared/gpu-e2e,
# this checkout's wheel installed by its step2.sh): the e2e test models (hidden 2048, GPU busy ~75% of a cycle),
# TP1, EAGLE-3 3 steps; bench baseline / profile / baseline (B | P B: the profiled server between two baselines,
# whose own spread is the noise floor), batch 160 at concurrency 32 and 12 streamed requests at concurrency 1.
# Start:   bash benchmarks/gpu_profile_host_cost.sh start
# Collect: WAIT=500 bash benchmarks/gpu_profile_host_cost.sh collect   (again within 30 s while it says RUNNING)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export CUDA_HOME=/usr/local/cuda PATH=/usr/local/cuda/bin:$PATH
REPO=$PWD
W=/tmp/hostcost
OUT=${OUT:-/tmp/hostcost-out}
mkdir -p "$W" "$OUT"

work() {
  cd /tmp
  set -x
  python3 -m sglang_pcie make-test-models $W/small --preset e2e --acceptance mixed > $W/make-models.txt 2>&1
  python3 -m sglang_pcie bench --out $W/host-bound --repeats 2 --variant "prof:base=profile;repeats=1" \
    --concurrency 32 --batch-requests 160 --stream-requests 12 --input-len 128 --output-len 256 --start-timeout 300 \
    -- --model-path $W/small/target --speculative-algorithm EAGLE3 --speculative-draft-model-path $W/small/draft \
    --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --tp-size 1 \
    --attention-backend triton --skip-tokenizer-init --mem-fraction-static 0.5 --max-running-requests 32 \
    --cuda-graph-bs-decode 1 32 --disable-prefill-cuda-graph > $W/host-bound.stdout 2> $W/host-bound.stderr
  echo "bench exit $?" >> $W/host-bound.stdout
  for f in $W/host-bound/runs/*/eagle3-profile.jsonl; do
    [ -f "$f" ] && python3 -m sglang_pcie profile-report "$f"
  done > $W/profiles.txt 2>&1
  touch $W/DONE
}

case "${1:-collect}" in
  start)
    rm -rf "$W"; mkdir -p "$W"
    setsid nohup bash "$0" work > /tmp/hostcost.log 2>&1 < /dev/null &
    sleep 2; echo "started";;
  work) work;;
  collect)
    T=$(date +%s)
    while [ ! -f $W/DONE ] && [ $(( $(date +%s) - T )) -lt "${WAIT:-500}" ]; do sleep 5; done
    tail -n 4 $W/host-bound/progress.log 2>/dev/null
    tar czf "$OUT/hostcost.tgz" --exclude='*.safetensors' --exclude='outputs.json' -C /tmp hostcost hostcost.log 2>/dev/null
    [ -f $W/DONE ] && echo FINISHED || echo "RUNNING: collect again within 30 s";;
esac
