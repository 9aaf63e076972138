#!/bin/bash
# The bench evidence run on a GPU machine (SGLang and this checkout's wheel installed into python3:
# benchmarks/README.md, "GPU scripts from a clone"): tiny test models, then `sglang-pcie bench` in counterbalanced
# repeats, in the background, with
#   baseline   SGLANG_PCIE_DISABLE=1 (always run; every ratio is to it)
#   overlay    the overlay as installed
#   aa         a second overlay (--variant aa:base=overlay): an A/A pair, identical to overlay, so the table shows
#              what "no effect" looks like on this machine (its verdict must be "within noise")
#   profile    EAGLE3_PROFILE=1
# and optionally the EAGLE step sweep and the explicit `pcie` NCCL profile. Each table row: the median ratio to
# baseline, its 95% interval over the pairs, the number of pairs, the smallest effect they could resolve, the verdict.
#   TP=1 REPEATS=3 WAIT=540 bash benchmarks/gpu_bench_evidence.sh                      (one GPU, 3 repeats: 12 servers)
#   TP=1 REPEATS=auto RESOLVE=2% BUDGET_MINUTES=20 WAIT=540 bash benchmarks/gpu_bench_evidence.sh
#        (repeats until every variant's batch output tok/s could resolve 2%, or "NOT RESOLVABLE ... in 20 minutes")
# Knobs: TP (default 2), REPEATS (N or auto), RESOLVE, RESOLVE_METRIC, BUDGET_MINUTES (auto only), AA=0 / PROFILE=0
# (leave that variant out), SWEEP=1, CONCURRENCY (32), BATCH / STREAM (requests per phase, 96 / 4), INPUT_LEN (128),
# OUTPUT_LEN (256), PRESET (make-test-models --preset, e2e), ACCEPTANCE (--acceptance, mixed), LAUNCH_EXTRA (more
# launch_server arguments, e.g. "--cuda-graph-max-bs 64").
# It waits up to WAIT seconds (under the 600 s per-call limit), then prints the report so far and packs the run into
# $OUT/bench-run.tgz. If the bench is still running, collect it with a follow-up call WITHIN 30 SECONDS (the lent
# machine is given back after 30 s idle, killing the background run - that lost one run on 2026-11-30):
#   COLLECT=1 WAIT=540 bash benchmarks/gpu_bench_evidence.sh
# Each server takes ~55 s to start (162 s the first time on a fresh machine: JIT builds) and ~17 s of workload.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
RUN=/tmp/bench-run
source benchmarks/gpu_env.sh
TP=${TP:-2}
if [ -z "${CUDA_VISIBLE_DEVICES:-}" ]; then export CUDA_VISIBLE_DEVICES=$(seq -s, 0 $(( TP - 1 ))); fi
cd /tmp   # python3 -m imports the installed wheel, as users have it, not the checkout
if [ "${COLLECT:-0}" != 1 ]; then
  gpu_env --in /tmp python3 sglang sglang_pcie || exit 1  # SGLANG_PCIE_WHEELS=DIR: installs that set first
  python3 -m sglang_pcie make-test-models /tmp/bench-models --preset "${PRESET:-e2e}" \
    --acceptance "${ACCEPTANCE:-mixed}" || exit 1
  VARIANTS=(--variant overlay)
  [ "${AA:-1}" = 1 ] && VARIANTS+=(--variant 'aa:base=overlay')
  [ "${PROFILE:-1}" = 1 ] && VARIANTS+=(--variant profile)
  if [ "${SWEEP:-0}" = 1 ]; then  # one server each (repeats=1): a fixed --repeats only
    VARIANTS+=(--variant 'steps2:args=--speculative-num-steps 2 --speculative-num-draft-tokens 3;repeats=1'
               --variant 'steps5:args=--speculative-num-steps 5 --speculative-num-draft-tokens 6;repeats=1'
               --variant 'nccl-pcie:env=SGLANG_PCIE_NCCL_PROFILE=pcie;repeats=1')
  fi
  REPEAT_ARGS=(--repeats "${REPEATS:-3}")
  if [ "${REPEATS:-3}" = auto ]; then
    REPEAT_ARGS+=(--resolve "${RESOLVE:-2%}" --resolve-metric "${RESOLVE_METRIC:-batch.output_tok_s}"
                  --budget-minutes "${BUDGET_MINUTES:-20}")
  fi
  # shellcheck disable=SC2206  # LAUNCH_EXTRA is split into words on purpose
  ARGS=(--out $RUN "${REPEAT_ARGS[@]}" "${VARIANTS[@]}" --env NCCL_DEBUG=INFO --env NCCL_DEBUG_SUBSYS=ENV
    --concurrency "${CONCURRENCY:-32}" --batch-requests "${BATCH:-96}" --stream-requests "${STREAM:-4}"
    --input-len "${INPUT_LEN:-128}" --output-len "${OUTPUT_LEN:-256}" --start-timeout 300
    -- --model-path /tmp/bench-models/target --speculative-algorithm EAGLE3
    --speculative-draft-model-path /tmp/bench-models/draft --speculative-num-steps 3 --speculative-eagle-topk 1
    --speculative-num-draft-tokens 4 --tp-size "$TP" --attention-backend triton --skip-tokenizer-init
    --mem-fraction-static 0.5 --max-running-requests "${CONCURRENCY:-32}" --cuda-graph-bs-decode 1 "${CONCURRENCY:-32}"
    --disable-prefill-cuda-graph ${LAUNCH_EXTRA:-})
  python3 -m sglang_pcie bench --dry-run "${ARGS[@]}" | head -4
  setsid nohup python3 -m sglang_pcie bench "${ARGS[@]}" > /tmp/bench-run.stdout 2> /tmp/bench-run.stderr < /dev/null &
fi
T0=$(date +%s)
while pgrep -f "sglang_pcie bench" > /dev/null && [ $(( $(date +%s) - T0 )) -lt "${WAIT:-540}" ]; do sleep 5; done
tail -n 30 $RUN/progress.log 2>/dev/null || tail -n 20 /tmp/bench-run.stderr
# a failure before any server (bad option, SGLang not importable): bench's one line is on its stderr
[ -f $RUN/results.json ] || tail -n 5 /tmp/bench-run.stderr
python3 -m sglang_pcie bench --report $RUN > /tmp/bench-report.txt 2>&1; echo "report exit $?"
grep -v "^NCCL read" /tmp/bench-report.txt | tail -n 60
tar czf "$OUT/bench-run.tgz" --exclude='*.safetensors' -C /tmp bench-run bench-run.stdout bench-run.stderr bench-report.txt
pgrep -f "sglang_pcie bench" > /dev/null && echo "STILL RUNNING: collect within 30 s (COLLECT=1)"
