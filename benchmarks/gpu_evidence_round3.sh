#!/bin/bash
# The GPU evidence of the third round, on ONE H200 (SGLang 0.5.16 and this checkout's wheel installed into python3:
# benchmarks/README.md, "GPU scripts from a clone"), in the background, in one lease:
#   1. doctor: the report and each probe's time (one GPU: no pair to copy between)
#   2. the GPU-bound models (Llama-8B-shaped target, EAGLE-3 drafter, --acceptance mixed) and two broken copies of
#      the drafter (benchmarks/break_drafter.py); check-drafter on the good one and on both broken ones
#   3. bench, GPU-bound (verify ~11 ms of a ~12 ms cycle), TP1, EAGLE-3 3 steps: baseline / overlay in
#      counterbalanced repeats (overlay vs baseline is an A/A here: nothing is opted in and TP1 runs no all-reduce;
#      it is also the accept-length alarm's cost A/B), a profiled server, and each broken drafter once (the alarm
#      must fire, tokens must equal baseline's); sized to fit one 30-minute device session
#   4. bench, host-bound (the e2e preset, hidden 2048): baseline and profile once: the profiler's invariants there
# Start:   bash benchmarks/gpu_evidence_round3.sh start      (returns at once; the work runs under setsid)
# Collect: bash benchmarks/gpu_evidence_round3.sh collect    (waits up to WAIT s, packs $OUT/round3.tgz and prints
#          the summary; call it again WITHIN 30 SECONDS of each return while it says RUNNING)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
REPO=$PWD
NAME=round3
source "$REPO/benchmarks/gpu_detached.sh"  # W=/tmp/round3, OUT, detached start|work|collect

work() {
  cd /tmp  # python3 -m imports the installed wheel, as users have it
  set -x
  T0=$(date +%s)
  stamp() { echo "=== $1 at $(( $(date +%s) - T0 )) s"; }
  stamp doctor
  python3 -m sglang_pcie verify-patches > $W/verify.txt 2>&1; echo "exit $?" >> $W/verify.txt
  ( time python3 -m sglang_pcie doctor ) > $W/doctor.txt 2>&1; echo "exit $?" >> $W/doctor.txt
  python3 -m sglang_pcie doctor --json > $W/doctor.json 2>&1
  stamp models
  M=$W/models
  ( time python3 -m sglang_pcie make-test-models $M --hidden 4096 --layers 32 --heads 32 --kv-heads 8 \
      --intermediate 14336 --acceptance mixed ) > $W/make-models.txt 2>&1
  python3 "$REPO/benchmarks/break_drafter.py" $M/draft >> $W/make-models.txt 2>&1
  LAUNCH=(--model-path $M/target --speculative-algorithm EAGLE3 --speculative-draft-model-path $M/draft
          --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --tp-size 1
          --attention-backend triton --skip-tokenizer-init --mem-fraction-static 0.6 --max-running-requests 32
          --cuda-graph-bs-decode 1 32 --disable-prefill-cuda-graph)
  for d in draft draft-d2t-shifted draft-head-shifted; do
    ( time python3 -m sglang_pcie check-drafter --draft $M/$d --target $M/target -- "${LAUNCH[@]}" ) \
      > $W/check-$d.txt 2>&1
    echo "exit $?" >> $W/check-$d.txt
  done
  stamp bench-gpu-bound
  # baseline / overlay twice each (B O | O B: the A/A, and the alarm's cost), the broken drafters and one profiled
  # server in the second repeat only
  python3 -m sglang_pcie bench --out $W/gpu-bound --repeats "${REPEATS:-2}" --variant overlay \
    --variant "d2t-shifted:args=--speculative-draft-model-path $M/draft-d2t-shifted;tokens=must-match;repeats=1" \
    --variant "head-shifted:args=--speculative-draft-model-path $M/draft-head-shifted;tokens=must-match;repeats=1" \
    --variant "prof:base=profile;repeats=1" \
    --concurrency 32 --batch-requests "${BATCH:-160}" --stream-requests "${STREAM:-4}" --input-len 128 \
    --output-len 256 --start-timeout 420 -- "${LAUNCH[@]}" > $W/gpu-bound.stdout 2> $W/gpu-bound.stderr
  echo "bench exit $?" >> $W/gpu-bound.stdout
  grep -rn "sglang-pcie" $W/gpu-bound/runs --include='*.log' | grep -i "accept" > $W/alarm-lines.txt 2>&1
  stamp bench-host-bound
  python3 -m sglang_pcie make-test-models $W/small --preset e2e --acceptance mixed > /dev/null 2>&1
  python3 -m sglang_pcie bench --out $W/host-bound --repeats 1 --variant profile --concurrency 32 \
    --batch-requests 160 --stream-requests 4 --input-len 128 --output-len 256 --start-timeout 300 \
    -- --model-path $W/small/target --speculative-algorithm EAGLE3 --speculative-draft-model-path $W/small/draft \
    --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --tp-size 1 \
    --attention-backend triton --skip-tokenizer-init --mem-fraction-static 0.5 --max-running-requests 32 \
    --cuda-graph-bs-decode 1 32 --disable-prefill-cuda-graph > $W/host-bound.stdout 2> $W/host-bound.stderr
  echo "bench exit $?" >> $W/host-bound.stdout
  stamp done
  touch $W/DONE
}

profiles() {  # the profiled servers' files, checked record by record (also after a cut-short run)
  for f in $W/gpu-bound/runs/*/eagle3-profile.jsonl $W/host-bound/runs/*/eagle3-profile.jsonl; do
    [ -f "$f" ] && { echo "== $f"; python3 "$REPO/benchmarks/eagle3_profile_invariants.py" "$f"; echo "exit $?";
                     python3 -m sglang_pcie profile-report "$f"; }
  done > $W/profiles.txt 2>&1
}

progress() {
  grep "^===" /tmp/round3.log | tail -n 3
  tail -n 5 $W/gpu-bound/progress.log 2>/dev/null
  profiles
}

detached "${1:-collect}"
