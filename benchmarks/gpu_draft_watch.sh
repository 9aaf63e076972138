#!/bin/bash
# draft-token-watch's and accept-length-alarm's evidence on ONE H200 (issue 33), in one lease, in the background
# (SGLang 0.5.16 and this checkout's wheel installed into python3: benchmarks/README.md, "GPU scripts from a clone"):
#   0. the interleaved test pair (make-test-models --acceptance interleaved --preset e2e: hidden 2048, 8 layers; the
#      next token is f of the token before the last, so each frequent token follows many different tokens; its
#      healthy drafter accepted token by token; 3 in 4 random prompts walk its 128-token core) and its broken copies
#      (benchmarks/break_drafter.py): d2t permuted at 10% and 40% of the draft ids, layer ids + 1
#   1. bench's default workload (128-token prompts from ids 10:30000, 256 greedy tokens, c=32, 8 streamed) with
#      BATCH (3200) batch requests instead of 128, so that each server serves about a minute: warm-up server, then
#      baseline (SGLANG_PCIE_DISABLE=1) and overlay (healthy drafter) twice each, counterbalanced (the A/A of the
#      overlay's default patches, 4 servers of the healthy drafter), and the three broken drafters once each (last
#      repeat). The seconds to each warning: benchmarks/draft_watch_times.py over the server logs.
# Start:   bash benchmarks/gpu_draft_watch.sh start      (returns at once)
# Collect: bash benchmarks/gpu_draft_watch.sh collect    (WAIT s at most; call again WITHIN 30 s while RUNNING)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
REPO=$PWD
NAME=draftwatch
M=/tmp/draftwatch-models
source "$REPO/benchmarks/gpu_detached.sh"  # W=/tmp/draftwatch, OUT, detached start|work|collect

LAUNCH=(--model-path $M/target --speculative-algorithm EAGLE3 --speculative-draft-model-path $M/draft
        --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --tp-size 1
        --attention-backend triton --skip-tokenizer-init --mem-fraction-static 0.6 --max-running-requests 32
        --cuda-graph-bs-decode 1 32 --disable-prefill-cuda-graph)
variant() { echo "$1:args=--speculative-draft-model-path $M/draft-$2;tokens=must-match${3:+;repeats=$3}"; }

# the broken drafters served (LAYERS=0: the d2t ones only, a shorter run)
BROKEN=(--variant "$(variant d2t10 d2t-permuted-10pct 1)" --variant "$(variant d2t40 d2t-permuted-40pct 1)")
[ "${LAYERS:-1}" = 0 ] || BROKEN+=(--variant "$(variant layers1 layer-ids-plus1 1)")

work() {
  cd /tmp  # python3 -m imports the installed wheel, as users have it
  T0=$(date +%s)
  stamp() { echo "=== $1 at $(( $(date +%s) - T0 )) s"; }
  stamp models
  rm -rf $M
  ( time python3 -m sglang_pcie make-test-models $M --acceptance interleaved --preset e2e \
      && python3 "$REPO/benchmarks/break_drafter.py" $M/draft --only layer-ids-plus1 d2t-permuted-10pct \
           d2t-permuted-40pct ) > $W/make-models.txt 2>&1
  ls $M >> $W/make-models.txt
  python3 -m sglang_pcie verify-patches > $W/verify.txt 2>&1
  stamp bench
  ( time python3 -m sglang_pcie bench --out $W/served --repeats 2 --batch-requests ${BATCH:-3200} \
      --start-timeout 420 --variant baseline --variant overlay "${BROKEN[@]}" -- "${LAUNCH[@]}" ) \
      > $W/served.stdout 2> $W/served.stderr
  echo "bench exit $?" >> $W/served.stdout
  stamp done
  touch $W/DONE
}

progress() {
  grep "^===" /tmp/$NAME.log | tail -n 3
  tail -n 2 $W/served/progress.log 2>/dev/null
  grep -l "draft-token-watch\|accept-length-alarm" $W/*/runs/*/server.log 2>/dev/null
}

detached "${1:-collect}"
