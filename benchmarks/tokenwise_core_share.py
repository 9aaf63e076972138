"""How many of bench's random prompts walk the `make-test-models --acceptance tokenwise` target's core, read from the
files make-test-models writes.

usage: python -m benchmarks.tokenwise_core_share [--preset tiny|e2e] [--layers N] [--seed N] [--batch N,N,...]
                                                 [--decoded FILE.json]

The pair's greedy text depends on the last prompt token only (attention outputs are zero): the next token of t is
the token whose `lm_head` row carries the code of t's embedding (its first block, by sign). This script writes the
pair (`--preset tiny --layers 6` by default, seed 0) into a temporary folder, reads that map from the target's
`model.safetensors` (embedding and `lm_head`, by the signs of the code block: standard library only), finds its
cycles (the core: `tokenwise.CORE_TOKENS`), and counts
  * the token ids in bench's default range (10:30000) whose walk enters the core: the share of uniformly drawn
    prompts that walk it;
  * bench's own prompts (`Workload(seed=0, batch_requests=N)`, batch and stream phases) that walk it, for each N
    of --batch (128: bench's default; 2,400 and 3,200: the GPU runs of docs/draft-token-watch.md).
Every generated token of a request lies on the cycle its walk entered, so the share of requests that walk the core
is also the core's share of the generated tokens. --decoded: a raw JSON of benchmarks.tokenwise_drafter_cpu (same
preset and seed), whose greedy tokens (transformers' decode) are checked to follow the map read here.
"""
from __future__ import annotations

import argparse
import json
import struct
import tempfile
from dataclasses import replace
from pathlib import Path

from sglang_pcie.tools import make_test_models
from sglang_pcie.tools.bench.plan import Workload
from sglang_pcie.tools.make_test_models import tokenwise


def sign_rows(path: Path, name: str, width: int) -> list[bytes]:
    """Per row of the bf16 tensor ``name``: the sign bits and zero-ness of its first ``width`` entries, as bytes
    (b'+', b'-', b'0' per entry)."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        entry = header[name]
        rows, cols = entry["shape"]
        begin = 8 + size + entry["data_offsets"][0]
        out = []
        for row in range(rows):
            f.seek(begin + 2 * cols * row)
            raw = f.read(2 * width)
            out.append(bytes(b"0"[0] if raw[2 * i:2 * i + 2] in (b"\0\0", b"\0\x80")
                             else (b"-"[0] if raw[2 * i + 1] & 0x80 else b"+"[0]) for i in range(width)))
        return out


def next_token_map(target: Path, code_size: int) -> list[int]:
    """next[t]: the target's greedy next token after t, from its embedding and lm_head."""
    weights = target / "model.safetensors"
    embed = sign_rows(weights, "model.embed_tokens.weight", code_size)
    head = sign_rows(weights, "lm_head.weight", code_size)
    by_code = {code: j for j, code in enumerate(head) if code.strip(b"0")}
    assert len(by_code) == sum(1 for code in head if code.strip(b"0")), "two lm_head rows share a code"
    return [by_code[code] for code in embed]


def cycles(nxt: list[int]) -> dict[int, int]:
    """cycle id (its smallest token) of every token on a cycle of ``nxt``; -> {token: cycle id}."""
    on = {}
    for start in set(nxt):
        if start in on:
            continue
        ring, t = [start], nxt[start]
        while t != start:
            ring.append(t)
            t = nxt[t]
        for t in ring:
            on[t] = min(ring)
    return on


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(make_test_models.PRESETS), default="tiny")
    parser.add_argument("--layers", type=int, help="target layers (default: 6 for tiny, the preset's otherwise)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", default="128,2400,3200", help="bench batch sizes whose prompts are counted")
    parser.add_argument("--decoded", type=Path, help="tokenwise_drafter_cpu's JSON: its tokens checked against the map")
    args = parser.parse_args()
    preset = make_test_models.PRESETS[args.preset]
    shape = replace(preset, layers=args.layers or (6 if args.preset == "tiny" else preset.layers))
    with tempfile.TemporaryDirectory() as tmp:
        make_test_models.make_models(Path(tmp), shape, args.seed, "tokenwise")
        nxt = next_token_map(Path(tmp) / "target", tokenwise.code_size(shape))
    ring_of = cycles(nxt)
    sizes: dict[int, int] = {}
    for ring in ring_of.values():
        sizes[ring] = sizes.get(ring, 0) + 1
    core = [ring for ring, size in sizes.items() if size == tokenwise.CORE_TOKENS]
    assert len(core) == 1, f"cycle sizes {sorted(sizes.values())}: no single {tokenwise.CORE_TOKENS}-token core"
    walks_core = [ring_of[nxt[t]] == core[0] for t in range(shape.vocab)]
    low, high = Workload.token_low, Workload.token_high
    hits = sum(walks_core[low:high])
    print(f"tokenwise, {args.preset} with {shape.layers} layers (hidden {shape.hidden}), seed {args.seed}: vocabulary"
          f" {shape.vocab}, draft vocabulary {shape.draft_vocab}; cycles of the greedy map: {sorted(sizes.values())}")
    print(f"  token ids {low}:{high} whose walk enters the {tokenwise.CORE_TOKENS}-token core: {hits} of"
          f" {high - low} ({hits / (high - low):.1%})")
    for batch in (int(n) for n in args.batch.split(",")):
        prompts = Workload(seed=0, batch_requests=batch).prompts()
        for phase in ("batch", "stream"):
            last = [p[-1] for p in prompts[phase]]
            n = sum(walks_core[t] for t in last)
            print(f"  bench's prompts (seed 0, {batch} batch requests), {phase} phase: {n} of {len(last)} walk the core"
                  f" ({n / len(last):.1%})")
    if args.decoded:
        sequences = json.loads(args.decoded.read_text())["tokens"]
        steps = [(a, b) for seq in sequences for a, b in zip(seq, seq[1:])]
        agree = sum(nxt[a] == b for a, b in steps)
        print(f"  {args.decoded.name}: {agree} of {len(steps)} consecutive greedy tokens follow the map")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
