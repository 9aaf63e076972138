#!/bin/bash
# tune-spec's evidence on ONE GPU (issue 41), in one lease, in the background. SGLang (0.5.16 here: it has the
# adaptive table by batch size) and this checkout's wheel installed in python3. Two pairs:
#   8b             the GPU-bound Llama-8B-shaped pair, --acceptance mixed (a request accepts all drafts or none)
#   e2e-tokenwise  the e2e preset (2048 hidden, 8 layers: host-bound), accepted token by token
#   e2e-mixed-d2t10  the e2e preset, --acceptance mixed, its drafter's d2t permuted at 10% (break_drafter.py): for the
#                  unmeasured warm-up server only, so that it also shows the map check at load naming a wrong map
#                  in a real server (issue 42) at no device time of its own
# `models` makes both (or those of MODEL_PAIRS) in the background (the small one first, seconds; the 8B one ~110 s,
# 15 GB of host memory).
# `start` runs, in order, the steps of PLAN (default below), each in its own folder /tmp/tunespec/<pair>-<step>:
#   warm:PAIR                  one unmeasured chain-7 server (the machine's first is cold: JIT builds), while the
#                              8B pair is still being made, so that no device time waits for it; a measured step
#                              waits until no pair is being made
#   search:PAIR                tune-spec's search (--prove PROVE, default 0), levels c=1 and c=32, chains 1, 3, 5, 7,
#                              at most MAX_SERVERS (4: 14% of a two-per-candidate sweep of all 14 candidates) and
#                              TUNE_MINUTES (12)
#   sweep:PAIR:CANDIDATES:N    tune-spec --sweep N over CANDIDATES (A..Z Z..A ...), with the table the pair's search
#                              wrote as the candidate `table` where it wrote one (dropped from CANDIDATES where not):
#                              the reference for the search's answer, and the tuned table against SGLang's default
#                              table and the best fixed setting in counterbalanced repeats
#                              (the token `answers` in CANDIDATES: each level's best measured candidate in the pair's
#                              search, so that the sweep always holds what the search answered)
# LEVELS (default 1,32): the concurrencies each server measures (a batch level: 4 x c requests, 16 x c on the
# host-bound pairs), e.g. 1,2,32: with CUDA graphs at 1 and 32 a batch of 2 to 32 is padded to 32, so batch 2 is where
# a table's bucket 32 begins; SWEEP_LEVELS (default LEVELS): the sweep's own, so that the search measures 1,32 and the
# sweep also 2.
# The user's launch is EAGLE-3, 3 steps, top-k 1, 4 draft tokens, TP1, triton attention, CUDA graphs at 1 and 32.
# Models:  bash benchmarks/gpu_tune_spec.sh models     (returns at once: setsid)
# Start:   bash benchmarks/gpu_tune_spec.sh start      (returns at once; waits for the models itself)
# Collect: bash benchmarks/gpu_tune_spec.sh collect    (WAIT s at most; call again WITHIN 30 s while RUNNING)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
REPO=$PWD
NAME=tunespec
PLAN=${PLAN:-"warm:e2e-tokenwise search:8b search:e2e-tokenwise sweep:e2e-tokenwise:none,chain-7,adaptive,table:3"}
models_of() { echo /tmp/tunespec-models-$1; }
models_busy() {  # whether a pair started by `models` is still being made
  local log; for log in /tmp/tunespec-models-*.log; do [ -f "$log" ] && [ ! -f "${log%.log}.done" ] && return 0; done
  return 1
}
pair_args() {
  case $1 in
    8b) echo --hidden 4096 --layers 32 --heads 32 --kv-heads 8 --intermediate 14336 --acceptance mixed;;
    e2e-tokenwise) echo --preset e2e --acceptance tokenwise;;
    e2e-mixed-d2t10) echo --preset e2e --acceptance mixed;;
    *) echo "pair $1: 8b, e2e-tokenwise or e2e-mixed-d2t10" >&2; return 2;;
  esac
}
levels_of() {  # $1 pair, $2 step kind; the host-bound pair's servers measure longer windows (16 x c requests: 512
  # at c=32, as --batch-requests 512 did there until 2026-12-07, and 32 at c=2, not 512)
  local levels=${LEVELS:-1,32}; [ "${2:-}" = sweep ] && levels=${SWEEP_LEVELS:-$levels}
  case $1 in
    8b) echo --concurrency $levels --stream-requests 8 --input-len 128 --output-len 256 \
          --start-timeout 420;;
    *) echo --concurrency $levels --batch-waves 16 --stream-requests 16 --input-len 128 --output-len 256 \
          --start-timeout 420;;
  esac
}
answers_of() {  # each level's best measured candidate in a tune-spec result, comma-separated, once each
  # (a level with nothing measured gives none; an unreadable result, no answers at all)
  python3 -c 'import json, sys
rows = [max((r for r in level["rows"] if r["measured"]), key=lambda r: r["measured"], default=None)
        for level in json.load(open(sys.argv[1]))["analysis"]["levels"].values()]
print(",".join(dict.fromkeys(r["candidate"] for r in rows if r)))' "$1" 2>/dev/null || true
}
source "$REPO/benchmarks/gpu_user_launch.sh"
launch_of() { user_launch "$(models_of "$1")"; }  # the user's launch on the pair in $1

if [ "${1:-}" = models ]; then
  # the checkout's code, uninstalled: the start-up hook's module is put on the path by hand; the small pair first
  cmd="cd $REPO"
  for pair in ${MODEL_PAIRS:-e2e-tokenwise 8b}; do
    m=$(models_of $pair)
    broken=""  # the broken pair's drafter swapped for its copy with 10% of d2t permuted
    [ $pair = e2e-mixed-d2t10 ] && broken=" && PYTHONPATH=$REPO python3 $REPO/benchmarks/break_drafter.py $m/draft\
 --only d2t-permuted-10pct\
 && mv $m/draft $m/draft-healthy && mv $m/draft-d2t-permuted-10pct $m/draft"
    cmd="$cmd; ( time PYTHONPATH=$REPO/sitecustomize python3 -m sglang_pcie make-test-models $m $(pair_args $pair)$broken )\
 > $m.log 2>&1; touch $m.done"
  done
  setsid nohup bash -c "$cmd" > /dev/null 2>&1 < /dev/null &
  echo "models started (/tmp/tunespec-models-*.log)"; exit 0
fi
source "$REPO/benchmarks/gpu_detached.sh"  # W=/tmp/tunespec, OUT, detached start|work|collect

work() {
  cd /tmp  # python3 -m imports the installed wheel, as users have it
  T0=$(date +%s)
  python3 -m sglang_pcie verify-patches > $W/verify.txt 2>&1
  local step kind pair candidates repeats folder m table
  for step in $PLAN; do
    IFS=: read -r kind pair candidates repeats <<< "$step"
    folder=$W/$pair-$kind; m=$(models_of $pair)
    echo "=== $step at $(( $(date +%s) - T0 )) s"
    while [ ! -f $m.done ]; do sleep 2; done
    cp $m.log $W/make-models-$pair.txt
    # Nothing is measured while a pair is still being made: the host-bound pair's figures fell by up to a third
    # beside the 8B pair's weights being written (tune-spec-lease4/NOTE.txt). The warm-up may overlap it.
    [ "$kind" = warm ] || while models_busy; do sleep 2; done
    case $kind in
      warm) ( time python3 -m sglang_pcie tune-spec --out $folder --steps 7 --max-servers 1 --no-adaptive --prove 0 \
                --no-warmup $(levels_of $pair) --batch-requests 32 -- $(launch_of $pair) ) \
              > $folder.stdout 2> $folder.stderr;;
      search) ( time python3 -m sglang_pcie tune-spec --out $folder --steps 1,3,5,7 --prove "${PROVE:-0}" --no-warmup \
                  --max-servers "${MAX_SERVERS:-4}" --budget-minutes "${TUNE_MINUTES:-12}" $(levels_of $pair) \
                  -- $(launch_of $pair) ) \
                > $folder.stdout 2> $folder.stderr;;
      sweep)
        table=${TABLE:-$W/$pair-search/adaptive-config.json}  # TABLE=/abs/path: a table written before
        if [ -f $table ]; then table="--table $table"; else table=""; candidates=${candidates//,table/}; fi
        candidates=${candidates//answers/$(answers_of $W/$pair-search/result.json)}
        ( time python3 -m sglang_pcie tune-spec --out $folder --steps 1,3,5,7 --sweep "$repeats" --no-warmup \
            --candidates "$candidates" $table --budget-minutes 40 $(levels_of $pair sweep) -- $(launch_of $pair) ) \
          > $folder.stdout 2> $folder.stderr;;
      *) echo "PLAN step $step: warm, search or sweep" >&2; continue;;
    esac
    echo "$step exit $?" >> $folder.stdout
  done
  local log; for log in /tmp/tunespec-models-*.log; do [ -f "$log" ] && cp "$log" "$W/make-${log#/tmp/tunespec-}"; done
  echo "=== done at $(( $(date +%s) - T0 )) s"
  touch $W/DONE
}

progress() {
  grep "^===" /tmp/$NAME.log | tail -n 3
  local f; for f in $W/*/progress.log; do [ -f "$f" ] && tail -n 2 "$f"; done
}

detached "${1:-collect}"
