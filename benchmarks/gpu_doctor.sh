#!/bin/bash
# `sglang-pcie doctor` on a GPU machine, for docs/doctor.md and the fixtures (any GPU count; TP=N uses the first N).
#   bash benchmarks/gpu_doctor.sh            (from the checkout root; the python that holds torch: PYTHON=...)
# Writes under $OUT (default /tmp/gpu-doctor), six files:
#   run.log          everything below, with each step's wall time
#   doctor.txt       1. the table, as a user sees it (exit status after it), with each probe's time
#   doctor.json      2. the same run as --json: findings, probe times, the GPUs
#   doctor-nop2p.txt 3. again with NCCL_P2P_DISABLE=1: plan.nccl-p2p-disable says what that switch does here
#   doctor-replay.txt 4. `doctor --facts` over what step 1 recorded: the same findings from the recording
#   facts.tgz        the recording of step 1 (doctor --record): every file and command output doctor read, the
#                    copy check's own events (bytes compared per pair and path, GB/s, link under load) among them;
#                    unpacked under tests/support/data/host-facts/<name>/ it is a fixture as it stands
# Steps 1-2 run the copy check (a child process with torch: 64 MiB six times per ordered GPU pair and per path:
# copy engine, SM stores into the peer, SM loads from the peer; every byte compared); on one GPU it runs within
# the GPU, which tests the check itself. Expected: about 10-20 s per doctor run on 1-2 GPUs, torch's start included.
set -u
OUT=${OUT:-/tmp/gpu-doctor}
BUDGET=${BUDGET:-300}
LOG=run.log
source benchmarks/gpu_common.sh
rm -rf "$OUT/facts"

step "0. machine"
nvidia-smi -L
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
id -u; uname -r; command -v lspci || echo "lspci: not installed"

step "1. doctor (table), recording what it reads into $OUT/facts"
T0=$(date +%s%N)
$PY -m sglang_pcie doctor --record "$OUT/facts" > "$OUT/doctor.txt" 2>&1
echo "exit $? after $(( ($(date +%s%N) - T0) / 1000000 )) ms" | tee -a "$OUT/doctor.txt"
cat "$OUT/doctor.txt"

step "2. doctor --json: each probe's time"
$PY -m sglang_pcie doctor --json > "$OUT/doctor.json" 2>"$OUT/doctor-json.err"
echo "exit $?"; cat "$OUT/doctor-json.err"; rm -f "$OUT/doctor-json.err"
$PY - "$OUT/doctor.json" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))
for p in data["probes"]:
    print(f"probe {p['name']:<8} {p['seconds']:7.2f} s{'  TIMED OUT' if p['timed_out'] else ''}")
print("counts", data["counts"], "exit", data["exit"])
PY

step "3. the copy check's own events (from the recording): bytes compared per pair and path"
cat "$OUT"/facts/commands/*p2p-copy-check*.out 2>/dev/null || echo "no copy check recorded"
tail -5 "$OUT"/facts/commands/*p2p-copy-check*.err 2>/dev/null

step "4. doctor with NCCL_P2P_DISABLE=1"
NCCL_P2P_DISABLE=1 $PY -m sglang_pcie doctor > "$OUT/doctor-nop2p.txt" 2>&1
echo "exit $?" | tee -a "$OUT/doctor-nop2p.txt"
grep -E "plan\.|p2p\." "$OUT/doctor-nop2p.txt"

step "5. doctor --no-p2p-test (the cheap run)"
T0=$(date +%s%N)
$PY -m sglang_pcie doctor --no-p2p-test > /dev/null 2>&1
echo "exit $? after $(( ($(date +%s%N) - T0) / 1000000 )) ms"

step "6. replay: doctor --facts over the recording of step 1"
$PY -m sglang_pcie doctor --facts "$OUT/facts" > "$OUT/doctor-replay.txt" 2>&1
echo "exit $?" | tee -a "$OUT/doctor-replay.txt"
diff <(grep -oE "^(ok|info|not-visible|warning|failure) +[a-z0-9.-]+" "$OUT/doctor.txt") \
     <(grep -oE "^(ok|info|not-visible|warning|failure) +[a-z0-9.-]+" "$OUT/doctor-replay.txt") \
  && echo "replay: the same findings (severity and id) as the live run"

tar czf "$OUT/facts.tgz" -C "$OUT" facts && rm -rf "$OUT/facts"
echo; echo "=== done in $(( $(date +%s) - START )) s"; ls -la "$OUT"
