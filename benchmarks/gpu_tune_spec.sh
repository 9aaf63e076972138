#!/bin/bash
# tune-spec's evidence on ONE H200 (issue 31), in one lease, in the background (SGLang 0.5.16 from
# ../shared/gpu-e2e; this checkout's wheel installed by its step2.sh):
#   0. the GPU-bound Llama-8B-shaped pair (--acceptance mixed), made by `models` (start it early: ~110 s)
#   1. tune-spec --workload both: its own warm-up server (unmeasured; the first server on a fresh machine is cold),
#      then at most 4 measured servers: chain-7 and chain-3 profiled (the model), none, and the predicted leader
#   2. the exhaustive reference: tune-spec --sweep 2 over none and chains 1, 2, 3, 5, 7 (12 servers, A..Z Z..A),
#      after the same warm-up (the machine is warm by then), same workload
# The user's launch is EAGLE-3, 3 steps, top-k 1, 4 draft tokens, TP1, triton attention.
# Models:  bash benchmarks/gpu_tune_spec.sh models     (returns at once: setsid; runs from the checkout, stdlib)
# Start:   bash benchmarks/gpu_tune_spec.sh start      (returns at once; waits for the models itself)
# Collect: bash benchmarks/gpu_tune_spec.sh collect    (WAIT s at most; call again WITHIN 30 s while RUNNING)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export CUDA_HOME=/usr/local/cuda PATH=/usr/local/cuda/bin:$PATH
REPO=$PWD
NAME=tunespec
M=/tmp/tunespec-models
if [ "${1:-}" = models ]; then
  mkdir -p $M
  setsid nohup bash -c "cd $REPO && ( time PYTHONPATH=$REPO/sitecustomize python3 -m sglang_pcie make-test-models $M --hidden 4096 --layers 32 \
    --heads 32 --kv-heads 8 --intermediate 14336 --acceptance mixed ) > $M.log 2>&1; touch $M.done" \
    > /dev/null 2>&1 < /dev/null &
  echo "models started ($M.log)"; exit 0
fi
source "$REPO/benchmarks/gpu_detached.sh"  # W=/tmp/tunespec, OUT, detached start|work|collect

LAUNCH=(--model-path $M/target --speculative-algorithm EAGLE3 --speculative-draft-model-path $M/draft
        --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --tp-size 1
        --attention-backend triton --skip-tokenizer-init --mem-fraction-static 0.6 --max-running-requests 32
        --cuda-graph-bs-decode 1 32 --disable-prefill-cuda-graph)
WORKLOAD=(--concurrency 32 --batch-requests 128 --stream-requests 8 --input-len 128 --output-len 256
          --start-timeout 420 --steps 1,2,3,5,7 --no-adaptive)

work() {
  cd /tmp  # python3 -m imports the installed wheel, as users have it
  T0=$(date +%s)
  stamp() { echo "=== $1 at $(( $(date +%s) - T0 )) s"; }
  stamp wait-models
  while [ ! -f $M.done ]; do sleep 2; done
  cp $M.log $W/make-models.txt
  python3 -m sglang_pcie verify-patches > $W/verify.txt 2>&1
  stamp tune-spec
  # --profile: as run on 2026-12-03 (the model servers profiled; tune-spec profiles none by default since)
  ( time python3 -m sglang_pcie tune-spec --out $W/tune --workload both --max-servers "${MAX_SERVERS:-4}" --profile \
      --budget-minutes 10 "${WORKLOAD[@]}" -- "${LAUNCH[@]}" ) > $W/tune.stdout 2> $W/tune.stderr
  echo "tune-spec exit $?" >> $W/tune.stdout
  stamp sweep
  ( time python3 -m sglang_pcie tune-spec --out $W/sweep --workload both --sweep "${PAIRS:-2}" --no-warmup \
      --budget-minutes 40 "${WORKLOAD[@]}" -- "${LAUNCH[@]}" ) > $W/sweep.stdout 2> $W/sweep.stderr
  echo "sweep exit $?" >> $W/sweep.stdout
  stamp done
  touch $W/DONE
}

progress() {
  grep "^===" /tmp/$NAME.log | tail -n 3
  tail -n 3 $W/tune/progress.log $W/sweep/progress.log 2>/dev/null
  for f in $W/tune/runs/*/eagle3-profile.jsonl; do
    [ -f "$f" ] && { echo "== $f"; python3 "$REPO/benchmarks/eagle3_profile_invariants.py" "$f"; echo "exit $?"; }
  done > $W/profiles.txt 2>&1
}

detached "${1:-collect}"
