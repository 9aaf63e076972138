#!/usr/bin/env bash
# tune-nccl's two-node mode on one machine: two "nodes" (two tune-nccl processes, --node-rank 0 and 1) meeting at
# 127.0.0.1, each run started by torch's launcher on both, the real worker on CPU tensors (gloo). Checks the
# machinery across nodes (lockstep, the rendezvous, the result handed out), measures nothing NCCL uses.
#
#   bash benchmarks/tune_nccl_two_nodes_gloo.sh PYTHON OUT_DIR [extra tune-nccl arguments]
#
# PYTHON: a Python with torch and this checkout importable (e.g. an SGLang env with PYTHONPATH=<checkout>).
# Writes OUT_DIR/node0.json and node1.json (must be the same bytes), OUT_DIR/transcript.txt (both nodes' stderr and
# stdout, and the comparison), and then shows node 0 alone (node 1 never comes: one line, no result).
set -u
python=${1:?usage: $0 PYTHON OUT_DIR [tune-nccl arguments]}
out=${2:?usage: $0 PYTHON OUT_DIR [tune-nccl arguments]}
shift 2
mkdir -p "$out"
port=${PORT:-29700}
common=(-m sglang_pcie tune-nccl --backend gloo --nnodes 2 --master-addr 127.0.0.1 --master-port "$port"
        --tp 4 --tokens 1,2,4 --prefill-tokens 64 --hidden 256 --layers 2 --profiles default,proto-LL,channels-2
        --join-timeout 120 "$@")
transcript="$out/transcript.txt"
began=$(date +%s)
"$python" "${common[@]}" --node-rank 0 --out "$out/node0.json" >"$out/node0.stdout" 2>"$out/node0.stderr" &
node0=$!
"$python" "${common[@]}" --node-rank 1 --out "$out/node1.json" >"$out/node1.stdout" 2>"$out/node1.stderr"
code1=$?
wait "$node0"
code0=$?
{
    echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -n), $(nproc) cores; $("$python" -c 'import torch; print("torch", torch.__version__)')"
    echo "# both nodes: python ${common[*]} --node-rank N --out DIR/nodeN.json ($(($(date +%s) - began)) s)"
    for node in 0 1; do
        code=$([ "$node" = 0 ] && echo "$code0" || echo "$code1")
        echo; echo "===== node $node (exit $code): stderr"; cat "$out/node$node.stderr"
        echo "===== node $node: stdout"; cat "$out/node$node.stdout"
    done
    echo
    if cmp -s "$out/node0.json" "$out/node1.json"; then
        echo "node0.json and node1.json: the same bytes (the files' sha256 $(sha256sum <"$out/node0.json" | cut -d' ' -f1);" \
             "content_sha256 inside covers every field but itself)"
    else
        echo "node0.json and node1.json DIFFER"
    fi
} >"$transcript"
# Node 0 alone: node 1 never comes.
alone_began=$(date +%s)
"$python" "${common[@]}" --node-rank 0 --join-timeout 15 --master-port $((port + 10)) --out "$out/alone.json" \
    >"$out/alone.stdout" 2>"$out/alone.stderr"
code=$?
{
    echo; echo "===== node 0 alone, --join-timeout 15 (exit $code, $(($(date +%s) - alone_began)) s): stderr"
    cat "$out/alone.stderr"
    echo "===== stdout"; cat "$out/alone.stdout"
    [ -e "$out/alone.json" ] && echo "alone.json WRITTEN" || echo "(no alone.json written)"
} >>"$transcript"
rm -f "$out"/node?.stdout "$out"/node?.stderr "$out"/alone.stdout "$out"/alone.stderr
cat "$transcript"
