#!/bin/bash
# The accept-length alarm's evidence on ONE H200 (SGLang 0.5.16 and this checkout's wheel installed into python3:
# benchmarks/README.md, "GPU scripts from a clone"): a Llama-8B-shaped `--acceptance mixed` pair from
# make-test-models, two broken copies of its drafter (benchmarks/break_drafter.py: d2t shifted within the hot set,
# lm_head rows rotated), then `sglang-pcie bench` with one server each, TP1, EAGLE-3 3 steps, --attention-backend
# triton:
#   baseline      the good drafter, SGLANG_PCIE_DISABLE=1 (SGLang untouched; bench always runs it)
#   overlay       the good drafter, overlay installed, nothing opted in: the alarm must stay silent
#   d2t-shifted   the overlay; the alarm must fire, once, within the first minute; tokens must equal baseline's
#   head-shifted  the same
# From the checkout root:   WAIT=540 bash benchmarks/gpu_alarm_evidence.sh
# It waits up to WAIT seconds (under the 600 s per-call limit), prints the alarm table and packs $OUT/alarm-run.tgz.
# If bench is still running (it prints STILL RUNNING), collect WITHIN 30 SECONDS (the lent machine is given back
# after 30 s idle, killing the background run):   COLLECT=1 WAIT=540 bash benchmarks/gpu_alarm_evidence.sh
# Budget: the models ~2-3 min (15 GB written by the standard library), each server ~1.5 min to start (the first
# ~1 min more: JIT builds) and ~1 min of workload: ~12 min in all, two or three calls.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
REPO=$PWD
source benchmarks/gpu_env.sh
OUT=${OUT:-/tmp/alarm-out}; mkdir -p "$OUT"
RUN=/tmp/alarm-run
MODELS=${MODELS:-/tmp/alarm-models}
# The Llama-8B shape of the issue's measurement; MODEL_SHAPE="--preset e2e" (~1 GB, 20 s) checks the script quickly.
MODEL_SHAPE=${MODEL_SHAPE:---hidden 4096 --layers 32 --heads 32 --kv-heads 8 --intermediate 14336}
cd /tmp   # python3 -m imports the installed wheel, as users have it, not the checkout
if [ "${COLLECT:-0}" != 1 ]; then
  gpu_env --in /tmp python3 sglang sglang_pcie || exit 1  # SGLANG_PCIE_WHEELS=DIR: installs that set first
  python3 -m sglang_pcie verify-patches | grep -E "accept-length-alarm|^sglang" || exit 1
  if [ ! -s $MODELS/target/model.safetensors ]; then
    S=$(date +%s)
    python3 -m sglang_pcie make-test-models $MODELS $MODEL_SHAPE --acceptance mixed || exit 1
    echo "make-test-models: $(( $(date +%s) - S )) s"
  fi
  python3 "$REPO/benchmarks/break_drafter.py" $MODELS/draft || exit 1
  ARGS=(--out $RUN --repeats 1 --variant overlay
    --variant "d2t-shifted:args=--speculative-draft-model-path $MODELS/draft-d2t-shifted;tokens=must-match"
    --variant "head-shifted:args=--speculative-draft-model-path $MODELS/draft-head-shifted;tokens=must-match"
    --concurrency 32 --batch-requests "${BATCH:-96}" --stream-requests "${STREAM:-2}" --input-len 128 --output-len 256
    --start-timeout 420
    -- --model-path $MODELS/target --speculative-algorithm EAGLE3 --speculative-draft-model-path $MODELS/draft
    --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --tp-size 1
    --attention-backend triton --skip-tokenizer-init --mem-fraction-static 0.6 --max-running-requests 32
    --cuda-graph-bs-decode 1 32 --disable-prefill-cuda-graph)
  python3 -m sglang_pcie bench --dry-run "${ARGS[@]}" | head -6
  setsid nohup python3 -m sglang_pcie bench "${ARGS[@]}" > /tmp/alarm-run.stdout 2> /tmp/alarm-run.stderr < /dev/null &
fi
T0=$(date +%s)
while pgrep -f "sglang_pcie bench" > /dev/null && [ $(( $(date +%s) - T0 )) -lt "${WAIT:-540}" ]; do sleep 5; done
tail -n 12 $RUN/progress.log 2>/dev/null || tail -n 20 /tmp/alarm-run.stderr
python3 -m sglang_pcie bench --report $RUN > /tmp/alarm-report.txt 2>&1; echo "bench report exit $?"
tail -n 40 /tmp/alarm-report.txt
# The alarm, per server: its lines, the time from the server's first request to the warning, SGLang's own accept len.
python3 - $RUN > /tmp/alarm-table.txt <<'EOF'
import re, statistics, sys
from datetime import datetime
from pathlib import Path

STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
def when(line):
    match = STAMP.match(line)
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S") if match else None

print(f"{'server':22} {'alarm lines':>11} {'s from 1st request':>18} {'recovered':>9} {'SGLang accept len (median)':>27}")
for folder in sorted(Path(sys.argv[1], "runs").iterdir()):
    lines = (folder / "server.log").read_text(errors="replace").splitlines()
    first = next((when(l) for l in lines if "Prefill batch" in l and when(l)), None)
    alarms = [l for l in lines if "sglang-pcie accept-length-alarm:" in l and "looks broken" in l]
    recovered = sum("accept-length-alarm: recovered" in l for l in lines)
    accept = [float(m.group(1)) for l in lines for m in [re.search(r"accept len: ([\d.]+)", l)] if m]
    after = f"{(when(alarms[0]) - first).total_seconds():.0f}" if alarms and first and when(alarms[0]) else "-"
    median = f"{statistics.median(accept):.2f} ({len(accept)} lines)" if accept else "-"
    print(f"{folder.name:22} {len(alarms):>11} {after:>18} {recovered:>9} {median:>27}")
    for index, l in enumerate(lines):
        if l in alarms[:1]:
            print("    " + "\n    ".join(lines[index:index + 9]))
EOF
cat /tmp/alarm-table.txt
tar czf "$OUT/alarm-run.tgz" --exclude='*.safetensors' -C /tmp alarm-run alarm-run.stdout alarm-run.stderr \
  alarm-report.txt alarm-table.txt 2>/dev/null
pgrep -f "sglang_pcie bench" > /dev/null && echo "STILL RUNNING: collect within 30 s (COLLECT=1)"
exit 0
