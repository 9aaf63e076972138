#!/bin/bash
# tune-nccl across nodes with the real NCCL backend, on one GPU machine: two "nodes" (two tune-nccl processes,
# --node-rank 0 and 1, --master-addr 127.0.0.1), each with its own NCCL_HOSTID, so that NCCL takes them for two hosts
# and carries the all-reduce over its network transport (sockets on the loopback interface: NCCL_SOCKET_IFNAME=lo,
# NCCL_IB_DISABLE=1), every run started by torch's launcher on both. Checks the GPU path across nodes: each rank on
# its node's GPU (LOCAL_RANK), NCCL's process group through torch's rendezvous store, CUDA graphs of all-reduces
# that cross the "network", sums checked, figures shared, NCCL's own word on the network (NCCL_DEBUG=INFO), the same
# file on both nodes, and what `auto` then decides on each node.
#   bash benchmarks/gpu_tune_nccl_two_nodes.sh      (from the checkout root; nothing to carry)
# GPUs: with 2 or more visible, node 0 takes the first half and node 1 the second; with 1, both nodes share it
# (NCCL_HOSTID keeps NCCL from refusing two ranks on one GPU; their kernels then take turns on it, so the figures
# say nothing about speed). Writes $OUT (default /tmp/gpu-tune-two-nodes): run.log, node0.json, node1.json.
set -u
OUT=${OUT:-/tmp/gpu-tune-two-nodes}
BUDGET=${BUDGET:-420}
LOG=run.log
source benchmarks/gpu_common.sh
export PYTHONPATH=$PWD:$PYTHONPATH

step "0. machine"
$PY -V; nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader
$PY -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
GPUS=$($PY -c 'import torch; print(torch.cuda.device_count())')
if [ "$GPUS" -ge 2 ]; then
  HALF=$(( GPUS / 2 )); DEV0=$(seq -s, 0 $(( HALF - 1 ))); DEV1=$(seq -s, $HALF $(( 2 * HALF - 1 ))); TP=$(( 2 * HALF ))
else
  DEV0=0; DEV1=0; TP=2
fi
echo "node 0: CUDA_VISIBLE_DEVICES=$DEV0; node 1: CUDA_VISIBLE_DEVICES=$DEV1; --tp $TP"
export NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET
COMMON=(-m sglang_pcie tune-nccl --nnodes 2 --master-addr 127.0.0.1 --master-port 29500 --tp "$TP"
        --tokens 1,2 --prefill-tokens 512 --hidden 7168 --layers 2 --profiles default,proto-LL
        --join-timeout 90 --timeout 150 --ipc off)

step "1. two nodes, NCCL over sockets"
T=$(( $(left) - 60 ))
CUDA_VISIBLE_DEVICES=$DEV0 NCCL_HOSTID=tune-node0 timeout "$T" $PY "${COMMON[@]}" --node-rank 0 \
  --out "$OUT/node0.json" >"$OUT/node0.stdout" 2>"$OUT/node0.stderr" &
NODE0=$!
CUDA_VISIBLE_DEVICES=$DEV1 NCCL_HOSTID=tune-node1 timeout "$T" $PY "${COMMON[@]}" --node-rank 1 \
  --out "$OUT/node1.json" >"$OUT/node1.stdout" 2>"$OUT/node1.stderr"
echo "node 1 exit $?"
wait $NODE0; echo "node 0 exit $?"
for node in 0 1; do
  echo "===== node $node: stderr"; cat "$OUT/node$node.stderr"
  echo "===== node $node: stdout"; cat "$OUT/node$node.stdout"
done
if cmp -s "$OUT/node0.json" "$OUT/node1.json"; then
  echo "node0.json and node1.json: the same bytes"
else
  echo "node0.json and node1.json DIFFER (or one is missing)"
fi
$PY -c "
import json, sys
c = json.load(open('$OUT/node0.json'))
fp = c['fingerprint']
print('fingerprint.nodes', fp['nodes'])
for i, n in enumerate(fp['node_fingerprints']):
    print(f'node {i}:', n['gpus'], n['gpu_uuids'], 'net_env', n['net_env'], 'ib_devices', n['ib_devices'],
          'transport_env', n['transport_env'], 'nccl', n['nccl'])
print('ranks', c['measured']['nodes']['ranks'])
" || true

step "2. what auto decides on each node (SGLang's --nnodes 2, then a one-node launch)"
for node in 0 1; do
  DEV=$([ $node = 0 ] && echo "$DEV0" || echo "$DEV1")
  for nodes in 2 1; do
    echo "--- node $node, --nnodes $nodes"
    CUDA_VISIBLE_DEVICES=$DEV NCCL_DEBUG= NCCL_DEBUG_SUBSYS= SGLANG_PCIE_TUNED_FILE="$OUT/node$node.json" \
      timeout 60 $PY -m sglang_pcie env --nnodes "$nodes" --json | $PY -c "
import json, sys
d = json.load(sys.stdin)
print(d['profile'], d['values'], d['nodes'], '|', d['reason'][:500])
" || echo "(env failed)"
  done
done
rm -f "$OUT"/node?.stdout "$OUT"/node?.stderr
step "done"
