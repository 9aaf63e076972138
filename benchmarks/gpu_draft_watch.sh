#!/bin/bash
# The drafter signals' evidence on ONE GPU (issues 33 and 42), in one lease, in the background (SGLang 0.5.16 and this
# checkout's wheel installed into python3: benchmarks/README.md, "GPU scripts from a clone"). For each pair of
# PAIRS (default: interleaved), made with make-test-models --preset e2e (hidden 2048, 8 layers):
#   mixed        the drafter's lm_head rows are the target's embedding rows (the map check at load can compare them)
#   tokenwise    accepted token by token; each token follows one token only
#   interleaved  the next token is f of the token before the last: each frequent token follows many different tokens
# and its broken copies (benchmarks/break_drafter.py): d2t permuted at 10% and 40% of the draft ids, layer ids + 1
# (not for mixed: every layer's output is the token embedding there), lm_head rows rotated by one (head-shifted).
# bench's default workload (128-token prompts from ids 10:30000, 256 greedy tokens, c=32, 8 streamed) with BATCH
# (default 3200, about a minute) batch requests: per pair a warm-up server (the first pair only), then the overlay
# with the healthy drafter twice (with BASELINE=1 also SGLANG_PCIE_DISABLE=1 twice, counterbalanced: the A/A of the
# default patches) and each broken drafter once (last repeat). The seconds from ready to each warning and the map
# check's line at load: benchmarks/draft_watch_times.py over the server logs. A shorter run: BREAKS (the broken copies,
# e.g. "d2t-permuted-10pct head-shifted"), REPEATS (1: each variant once), NOWARM=1 (no warm-up server).
# Start:   PAIRS="mixed tokenwise interleaved" bash benchmarks/gpu_draft_watch.sh start      (returns at once)
# Collect: bash benchmarks/gpu_draft_watch.sh collect    (WAIT s at most; call again WITHIN 30 s while RUNNING)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
REPO=$PWD
NAME=draftwatch
source "$REPO/benchmarks/gpu_detached.sh"  # W=/tmp/draftwatch, OUT, detached start|work|collect

source "$REPO/benchmarks/gpu_user_launch.sh"
launch() { user_launch "$1"; }  # the user's launch on the models in $1
variant() { echo "$1:args=--speculative-draft-model-path $2/draft-$3;tokens=must-match${4:+;repeats=$4}"; }

work() {
  cd /tmp  # python3 -m imports the installed wheel, as users have it
  T0=$(date +%s)
  stamp() { echo "=== $1 at $(( $(date +%s) - T0 )) s"; }
  python3 -m sglang_pcie verify-patches > $W/verify.txt 2>&1
  local pair m breaks warm="${NOWARM:+--no-warmup}" base=""
  [ "${BASELINE:-0}" = 1 ] && base="--variant baseline"
  for pair in ${PAIRS:-interleaved}; do
    m=/tmp/draftwatch-models-$pair
    stamp "models $pair"
    breaks=${BREAKS:-"d2t-permuted-10pct d2t-permuted-40pct head-shifted"}
    [ $pair = mixed ] || [ -n "${BREAKS:-}" ] || breaks="$breaks layer-ids-plus1"
    rm -rf $m
    ( time python3 -m sglang_pcie make-test-models $m --acceptance $pair --preset e2e \
        && python3 "$REPO/benchmarks/break_drafter.py" $m/draft --only $breaks ) > $W/make-models-$pair.txt 2>&1
    ls $m >> $W/make-models-$pair.txt
    local broken=() b
    for b in $breaks; do broken+=(--variant "$(variant $b $m $b 1)"); done
    stamp "bench $pair"
    ( time python3 -m sglang_pcie bench --out $W/$pair --repeats ${REPEATS:-2} --batch-requests ${BATCH:-3200} \
        --start-timeout 420 $warm $base --variant overlay "${broken[@]}" -- $(launch $m) ) \
        > $W/$pair.stdout 2> $W/$pair.stderr
    echo "bench exit $?" >> $W/$pair.stdout
    python3 "$REPO/benchmarks/draft_watch_times.py" $W/$pair > $W/$pair-times.txt 2>&1
    warm="--no-warmup"  # the machine is warm after the first pair's servers
  done
  stamp done
  touch $W/DONE
}

progress() {
  grep "^===" /tmp/$NAME.log | tail -n 3
  local f; for f in $W/*/progress.log; do [ -f "$f" ] && tail -n 2 "$f"; done
  grep -l "draft-token-watch\|accept-length-alarm" $W/*/runs/*/server.log 2>/dev/null
}

detached "${1:-collect}"
