#!/bin/bash
# tune-spec's evidence on ONE GPU (issue 41), in one lease, in the background. SGLang (0.5.16 here: it has the
# adaptive table by batch size) and this checkout's wheel installed in python3:
#   0. `models`: the GPU-bound Llama-8B-shaped pair (--acceptance mixed, ~110 s) made in the background; while it
#      is made, `start` runs unmeasured warm-up servers of the same shapes on a small pair (WARM_MODELS, default
#      /tmp/tunespec-warm-models, made first by `models` with the e2e preset: head_dim 128, 8 KV heads, like the 8B
#      pair), so that the first measured server is not the machine's cold one (JIT builds) and no device time waits
#      for it
#   1. tune-spec's search (--prove 0: the table for this box is written, the sweep below measures it), levels c=1
#      and c=32, chains 1, 3, 5, 7, at most MAX_SERVERS (4: 29% of a sweep of all 14)
#   2. the reference in the same lease: tune-spec --sweep 2 over the candidates of 1 that led in the earlier H100
#      lease (chains 5 and 7, SGLang's adaptive table) plus the table 1 wrote (--table), A..Z Z..A: 8 servers, so
#      that the whole run fits what is left of one 30-minute lease. none, chain-1 and chain-3 are left out (their
#      single servers there ran 7-60% below the best at both levels; the search measures none and chain-3 once);
#      SWEEP_CANDIDATES=chain-3,chain-5,... names others, SWEEP_CANDIDATES= (empty) sweeps all 14. Its adaptive,
#      table and best fixed chain servers are the tuned table against SGLang's default table and the best fixed
#      chain, in counterbalanced pairs.
# The user's launch is EAGLE-3, 3 steps, top-k 1, 4 draft tokens, TP1, triton attention, CUDA graphs at 1 and 32.
# Where a lease has too little left for the sweep: PAIRS=0 PROVE=1 MAX_SERVERS=10 TUNE_MINUTES=16 runs the search
# with tune-spec's own proof instead (the tuned table, SGLang's table and the best fixed chain, A B C C B A).
# A second pair: PAIR=e2e-tokenwise on every call (below); its servers are shorter, its regime host-bound.
# Models:  bash benchmarks/gpu_tune_spec.sh models     (returns at once: setsid)
# Start:   bash benchmarks/gpu_tune_spec.sh start      (returns at once; waits for the models itself)
# Collect: bash benchmarks/gpu_tune_spec.sh collect    (WAIT s at most; call again WITHIN 30 s while RUNNING)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
REPO=$PWD
NAME=tunespec
M=${MODELS:-/tmp/tunespec-models-${PAIR:-8b}}
# PAIR=8b (default): the GPU-bound Llama-8B-shaped pair, --acceptance mixed. PAIR=e2e-tokenwise: a second pair of
# another shape and acceptance (the e2e preset, 2048 hidden, 8 layers: host-bound; accepted token by token)
case ${PAIR:-8b} in
  8b) PAIR_ARGS="--hidden 4096 --layers 32 --heads 32 --kv-heads 8 --intermediate 14336 --acceptance mixed";;
  e2e-tokenwise) PAIR_ARGS="--preset e2e --acceptance tokenwise";;
  *) echo "PAIR=$PAIR: 8b or e2e-tokenwise" >&2; exit 2;;
esac
WARM_MODELS=${WARM_MODELS:-/tmp/tunespec-warm-models}
SHAPE=(--tp-size 1 --attention-backend triton --skip-tokenizer-init --mem-fraction-static 0.6 --max-running-requests 32
       --cuda-graph-bs-decode 1 32 --disable-prefill-cuda-graph)
spec() {  # the user's speculative options for the pair in $1
  echo --speculative-algorithm EAGLE3 --speculative-draft-model-path "$1/draft" --speculative-num-steps 3 \
    --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
}
SWEEP_CANDIDATES=${SWEEP_CANDIDATES-chain-5,chain-7,adaptive,table}
LEVELS=(--concurrency 1,32 --batch-requests 128 --stream-requests 8 --input-len 128 --output-len 256 --start-timeout 420)

if [ "${1:-}" = models ]; then
  mkdir -p $M $WARM_MODELS
  # the checkout's code, uninstalled: the start-up hook's module is put on the path by hand. The small warm-up pair
  # first (seconds), then the 8B-shaped one
  setsid nohup bash -c "cd $REPO && PYTHONPATH=$REPO/sitecustomize python3 -m sglang_pcie make-test-models \
    $WARM_MODELS --preset e2e --acceptance mixed > $WARM_MODELS.log 2>&1; touch $WARM_MODELS.done; \
    ( time PYTHONPATH=$REPO/sitecustomize python3 -m sglang_pcie make-test-models $M $PAIR_ARGS ) > $M.log 2>&1; \
    touch $M.done" > /dev/null 2>&1 < /dev/null &
  echo "models started ($M.log)"; exit 0
fi
source "$REPO/benchmarks/gpu_detached.sh"  # W=/tmp/tunespec, OUT, detached start|work|collect

LAUNCH=(--model-path $M/target $(spec $M) "${SHAPE[@]}")

work() {
  cd /tmp  # python3 -m imports the installed wheel, as users have it
  T0=$(date +%s)
  stamp() { echo "=== $1 at $(( $(date +%s) - T0 )) s"; }
  stamp warm-up-while-the-models-are-made
  while [ ! -f $WARM_MODELS.done ]; do sleep 1; done
  # one chain-7 server on the small pair, driven at c=1 and c=32: not measured, only warming (one server: it ends
  # about when the 8B pair is made, so no device time waits for it)
  ( time python3 -m sglang_pcie tune-spec --out $W/warm --steps 7 --max-servers 1 --no-adaptive --prove 0 \
      --no-warmup "${LEVELS[@]}" --batch-requests 32 -- --model-path $WARM_MODELS/target $(spec $WARM_MODELS) \
      "${SHAPE[@]}" ) \
      > $W/warm.stdout 2> $W/warm.stderr
  stamp wait-models
  while [ ! -f $M.done ]; do sleep 2; done
  cp $M.log $W/make-models.txt
  python3 -m sglang_pcie verify-patches > $W/verify.txt 2>&1
  stamp tune-spec
  ( time python3 -m sglang_pcie tune-spec --out $W/tune --steps 1,3,5,7 --prove "${PROVE:-0}" --no-warmup \
      --max-servers "${MAX_SERVERS:-4}" --budget-minutes "${TUNE_MINUTES:-12}" "${LEVELS[@]}" -- "${LAUNCH[@]}" ) \
      > $W/tune.stdout 2> $W/tune.stderr
  echo "tune-spec exit $?" >> $W/tune.stdout
  [ "${PAIRS:-2}" = 0 ] && { stamp done; touch $W/DONE; return; }
  stamp sweep
  # the table only where the search wrote one (it writes none where one fixed chain leads every level)
  TABLE=(); [ -f $W/tune/adaptive-config.json ] && TABLE=(--table $W/tune/adaptive-config.json)
  CANDIDATES=$SWEEP_CANDIDATES; [ ${#TABLE[@]} = 0 ] && CANDIDATES=${CANDIDATES//,table/}
  ( time python3 -m sglang_pcie tune-spec --out $W/sweep --steps 1,3,5,7 --sweep "${PAIRS:-2}" --no-warmup \
      ${CANDIDATES:+--candidates "$CANDIDATES"} \
      "${TABLE[@]}" --budget-minutes 40 "${LEVELS[@]}" -- "${LAUNCH[@]}" ) \
      > $W/sweep.stdout 2> $W/sweep.stderr
  echo "sweep exit $?" >> $W/sweep.stdout
  stamp done
  touch $W/DONE
}

progress() {
  grep "^===" /tmp/$NAME.log | tail -n 3
  tail -n 2 $W/warm/progress.log $W/tune/progress.log $W/sweep/progress.log 2>/dev/null
}

detached "${1:-collect}"
