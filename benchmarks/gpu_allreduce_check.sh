#!/bin/bash
# Outputs across all-reduce variants on the `--all-reduce-check` test models (SGLang and this checkout's wheel
# installed into python3: benchmarks/README.md, "GPU scripts from a clone"), from the checkout root. One
# `sglang-pcie bench` run, one server per variant (--repeats 1: the point is the tokens, not throughput), every
# variant must-match the baseline:
#   baseline      SGLANG_PCIE_DISABLE=1, SGLang's defaults (at TP>1 on NVLink: its custom all-reduce)
#   overlay       the overlay as installed
#   nccl          --disable-custom-all-reduce: every all-reduce through NCCL (pynccl)
#   nccl-ring     the same with NCCL_ALGO=Ring        nccl-tree   NCCL_ALGO=Tree
#   nccl-ll       NCCL_PROTO=LL                        nccl-simple NCCL_PROTO=Simple
#   fault-drop    AR_FAULT=0: TP rank 1's o_proj / down_proj partial sums dropped (benchmarks/allreduce_fault/)
#   fault-double  AR_FAULT=2: doubled
# Expected at TP>=2: every real variant "identical", both fault variants "DIFFERENT" (so bench exits 1), and
# check_test_model_outputs.py: every request of every real run as predicted from the files, accept length as
# predicted; the fault runs wrong. At TP=1 nothing is all-reduced (SGLang skips it for one rank, the fault hook does
# nothing): every variant, the faults included, must be identical and as predicted.
#   TP=2 WAIT=540 bash benchmarks/gpu_allreduce_check.sh          (2 GPUs; 9 servers, ~70 s each after the first)
#   COLLECT=1 WAIT=540 bash benchmarks/gpu_allreduce_check.sh     (within 30 s of the previous call, if still running)
# Knobs: TP (default 2), FAULTS=0 (no fault variants), EXTRA_VARIANTS (more --variant specs, one per line, e.g.
# 'ipc:base=baseline;env=SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1;tokens=must-match' on SGLang >= 0.5.21 with FlashInfer
# >= 0.7, or 'fusion:base=baseline;args=--flashinfer-allreduce-fusion-backend trtllm;tokens=must-match' on 0.5.16),
# PRESET (e2e), ACCEPTANCE (mixed), CONCURRENCY (32), BATCH (64), STREAM (4), OUTPUT_LEN (128), LAUNCH_EXTRA.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
RUN=/tmp/ar-run MODELS=/tmp/ar-models CHECKOUT=$PWD
source benchmarks/gpu_env.sh
TP=${TP:-2}
if [ -z "${CUDA_VISIBLE_DEVICES:-}" ]; then export CUDA_VISIBLE_DEVICES=$(seq -s, 0 $(( TP - 1 ))); fi
if [ "${COLLECT:-0}" != 1 ]; then
  gpu_env --in /tmp python3 sglang sglang_pcie || exit 1  # SGLANG_PCIE_WHEELS=DIR: installs that set first
  SITE=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  cp benchmarks/allreduce_fault/allreduce_fault.py benchmarks/allreduce_fault/allreduce_fault.pth "$SITE/" || exit 1
  cd /tmp   # python3 -m imports the installed wheel, as users have it, not the checkout
  python3 -m sglang_pcie make-test-models $MODELS --preset "${PRESET:-e2e}" --acceptance "${ACCEPTANCE:-mixed}" \
    --all-reduce-check || exit 1
  MM='tokens=must-match'
  VARIANTS=(--variant overlay
    --variant "nccl:base=baseline;args=--disable-custom-all-reduce;$MM"
    --variant "nccl-ring:base=baseline;env=NCCL_ALGO=Ring;args=--disable-custom-all-reduce;$MM"
    --variant "nccl-tree:base=baseline;env=NCCL_ALGO=Tree;args=--disable-custom-all-reduce;$MM"
    --variant "nccl-ll:base=baseline;env=NCCL_PROTO=LL;args=--disable-custom-all-reduce;$MM"
    --variant "nccl-simple:base=baseline;env=NCCL_PROTO=Simple;args=--disable-custom-all-reduce;$MM")
  if [ "${FAULTS:-1}" = 1 ]; then
    VARIANTS+=(--variant "fault-drop:base=baseline;env=AR_FAULT=0" --variant "fault-double:base=baseline;env=AR_FAULT=2")
  fi
  while IFS= read -r spec; do [ -n "$spec" ] && VARIANTS+=(--variant "$spec"); done <<< "${EXTRA_VARIANTS:-}"
  # shellcheck disable=SC2206  # LAUNCH_EXTRA is split into words on purpose
  ARGS=(--out $RUN --repeats 1 "${VARIANTS[@]}" --env NCCL_DEBUG=INFO --env NCCL_DEBUG_SUBSYS=ENV
    --concurrency "${CONCURRENCY:-32}" --batch-requests "${BATCH:-64}" --stream-requests "${STREAM:-4}"
    --input-len 128 --output-len "${OUTPUT_LEN:-128}" --start-timeout 300
    -- --model-path $MODELS/target --speculative-algorithm EAGLE3
    --speculative-draft-model-path $MODELS/draft --speculative-num-steps 3 --speculative-eagle-topk 1
    --speculative-num-draft-tokens 4 --tp-size "$TP" --attention-backend triton --skip-tokenizer-init
    --mem-fraction-static 0.5 --max-running-requests "${CONCURRENCY:-32}" --cuda-graph-bs-decode 1 "${CONCURRENCY:-32}"
    --disable-prefill-cuda-graph ${LAUNCH_EXTRA:-})
  python3 -m sglang_pcie bench --dry-run "${ARGS[@]}" | head -4
  setsid nohup python3 -m sglang_pcie bench "${ARGS[@]}" > /tmp/ar-run.stdout 2> /tmp/ar-run.stderr < /dev/null &
fi
cd /tmp
T0=$(date +%s)
while pgrep -f "sglang_pcie bench" > /dev/null && [ $(( $(date +%s) - T0 )) -lt "${WAIT:-540}" ]; do sleep 5; done
tail -n 20 $RUN/progress.log 2>/dev/null || tail -n 20 /tmp/ar-run.stderr
[ -f $RUN/results.json ] || tail -n 5 /tmp/ar-run.stderr
python3 -m sglang_pcie bench --report $RUN > /tmp/ar-report.txt 2>&1; echo "report exit $?"
sed -n '/^outputs/,/^$/p' /tmp/ar-report.txt
python3 "$CHECKOUT/benchmarks/check_test_model_outputs.py" $RUN $MODELS > /tmp/ar-check.txt 2>&1; echo "check exit $?"
cat /tmp/ar-check.txt
grep -h "allreduce_fault:" $RUN/runs/*/server.log 2>/dev/null | sort | uniq -c | head -4
tar czf "$OUT/ar-run.tgz" --exclude='*.safetensors' -C /tmp ar-run ar-run.stdout ar-run.stderr ar-report.txt ar-check.txt
pgrep -f "sglang_pcie bench" > /dev/null && echo "STILL RUNNING: collect within 30 s (COLLECT=1)"
