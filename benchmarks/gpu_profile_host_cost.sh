#!/bin/bash
# The EAGLE profiler's cost where the host is the bottleneck, on ONE H200 (SGLang 0.5.16 and this checkout's wheel
# installed into python3: benchmarks/README.md, "GPU scripts from a clone"): the e2e test models (hidden 2048, GPU
# busy ~65-75% of a cycle), TP1, EAGLE-3 3 steps, batch 160 at concurrency 32 and 12 streamed requests at concurrency 1.
# First one warm-up server that is not measured (a fresh machine's first server JIT-builds kernels and, in round 3,
# served at half the speed of a later one), then bench baseline / profile in counterbalanced order.
#   MODE=ab (default): REPEATS (default 3) pairs, B P P B B P; the profiler as shipped.
# Then the synthetic host-bound loop (benchmarks/eagle3_profile_overhead.py) on the same GPU.
#   MODE=diag: B D B, where D is the profiler with benchmarks/eagle3_profile_server_breakdown.py loaded (a .pth in the
#              server's site-packages): where its host time goes, per method, GC and threads.  Not an A/B.
# Start:   [MODE=diag] bash benchmarks/gpu_profile_host_cost.sh start
# Collect: WAIT=500 bash benchmarks/gpu_profile_host_cost.sh collect   (again within 30 s while it says RUNNING)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
REPO=$PWD
NAME=hostcost
source "$REPO/benchmarks/gpu_detached.sh"  # W=/tmp/hostcost, OUT, detached start|work|collect
SERVER_ARGS="--model-path $W/small/target --speculative-algorithm EAGLE3 --speculative-draft-model-path $W/small/draft
  --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --tp-size 1
  --attention-backend triton --skip-tokenizer-init --mem-fraction-static 0.5 --max-running-requests 32
  --cuda-graph-bs-decode 1 32 --disable-prefill-cuda-graph"

warm_up() {  # one server, ready and one request served, then stopped: the JIT builds are done before bench
  local start=$(date +%s)
  SGLANG_PCIE_DISABLE=1 setsid python3 -m sglang.launch_server $SERVER_ARGS --host 127.0.0.1 --port 29000 \
    > $W/warmup-server.log 2>&1 &
  local pid=$!
  python3 - <<'PY'
import http.client, time
from sglang_pcie.tools.bench.client import generate, http_get  # bench's own client
deadline = time.time() + 400
while time.time() < deadline:
    try:
        if http_get("127.0.0.1", 29000, "/health")[0] == 200:
            break
    except (OSError, http.client.HTTPException):
        pass
    time.sleep(2)
print("warm-up request:", len(generate("127.0.0.1", 29000, list(range(10, 138)), 64, 120)["output_ids"]), "tokens")
PY
  kill -TERM -- -$pid 2>/dev/null; sleep 8; kill -KILL -- -$pid 2>/dev/null
  echo "warm-up server: $(( $(date +%s) - start )) s" >> $W/warmup.txt
}

work() {
  cd /tmp
  set -x
  python3 -m sglang_pcie make-test-models $W/small --preset e2e --acceptance mixed > $W/make-models.txt 2>&1
  warm_up >> $W/warmup.txt 2>&1
  if [ "${MODE:-ab}" = diag ]; then
    SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    cp "$REPO/benchmarks/eagle3_profile_server_breakdown.py" "$SITE/"
    echo "import eagle3_profile_server_breakdown" > "$SITE/zz_eagle3_breakdown.pth"
    VARIANT="diag:base=profile;env=EAGLE3_BREAKDOWN_OUT=$W/breakdown;repeats=1"; REPEATS=2
  else
    VARIANT="prof:base=profile"; REPEATS=${REPEATS:-3}
  fi
  python3 -m sglang_pcie bench --out $W/host-bound --repeats $REPEATS --variant "$VARIANT" \
    --concurrency 32 --batch-requests 160 --stream-requests 12 --input-len 128 --output-len 256 --start-timeout 300 \
    -- $SERVER_ARGS > $W/host-bound.stdout 2> $W/host-bound.stderr
  echo "bench exit $?" >> $W/host-bound.stdout
  for f in $W/host-bound/runs/*/eagle3-profile.jsonl; do
    [ -f "$f" ] && python3 -m sglang_pcie profile-report "$f" && python3 "$REPO/benchmarks/eagle3_profile_invariants.py" "$f"
  done > $W/profiles.txt 2>&1
  # the same profiler in a quiet process: the synthetic host-bound loop (off / profiled A/B, and the breakdown)
  ( cd "$REPO" && timeout 240 python3 -m benchmarks.eagle3_profile_overhead --regime host-bound --repeats 1 \
    --host-profile --out $W/synthetic.json ) > $W/synthetic.txt 2>&1
  nproc > $W/host.txt; uptime >> $W/host.txt
  touch $W/DONE
}

progress() {
  tail -n 4 $W/host-bound/progress.log 2>/dev/null
}

detached "${1:-collect}"
