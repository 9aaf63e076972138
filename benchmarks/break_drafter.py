#!/usr/bin/env python3
"""Write broken copies of an EAGLE-3 drafter, for the accept-length alarm's GPU evidence.

Each copy loads and serves like the original (same tensors, shapes, config and hot set) and is silently useless:

* ``<name>-d2t-shifted``: ``d2t`` permuted within the drafter's own hot set, draft id i -> the target id of draft
  id i + 1 (the last one -> the first one's).  Every mapped id is a valid hot token, so ``t2d`` agrees and a
  validity check passes; only ``--compare-d2t`` against the original sees it (0 positions agree).  This is the
  failure measured on one H200 (accept length 1.00 instead of 2.76, batch throughput 0.40x, no warning).
* ``<name>-head-shifted``: the draft ``lm_head`` rows rotated by one (row i holds what row i + 1 held), ``d2t``
  untouched: the head and the vocabulary map disagree, as in a drafter re-exported with its draft vocabulary in
  another order.  No check that reads only configs, headers and the maps can see it.

* ``<name>-layer-ids-plus1``: ``eagle_aux_hidden_state_layer_ids`` in config.json shifted by one (each id + 1),
  the tensors hard-linked: the drafter is fed the wrong target layers.  SGLang never captures the last layer's
  output, so an id of (target layers - 2) or more must not be shifted (``make-test-models --acceptance tokenwise``
  captures up to L - 3 for this reason).
* ``<name>-d2t-permuted-10pct`` / ``-40pct``: ``d2t`` permuted within its hot set at 10% / 40% of the draft ids,
  chosen at random (``--seed``), as one random cycle among them: each chosen draft id maps to the target id of the
  next chosen one.  Same hot set, t2d unchanged; the other draft ids keep their targets.

(Shifting the layer ids breaks a trained drafter and the ``--acceptance tokenwise`` test models, but not the
``mixed`` ones: there every target layer's output is the token embedding, so which layers are captured makes no
difference.)

Standard library only (the checkout's safetensors reader and writer).  Only the shard holding the changed tensor is
rewritten; the other files are hard-linked (copied across file systems).

usage: python benchmarks/break_drafter.py DRAFT_DIR [--out DIR] [--only NAME...] [--seed N]
       (default DIR: the folder holding DRAFT_DIR; NAME: d2t-shifted, head-shifted, layer-ids-plus1,
       d2t-permuted-10pct, d2t-permuted-40pct; default: all)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import struct
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from sglang_pcie.tools.safetensors_io import (element_size, pack, read_header, read_metadata,  # noqa: E402
                                              read_tensor, write_safetensors)


def shard_holding(folder: Path, name: str) -> Path:
    found = [p for p in sorted(folder.glob("*.safetensors")) if name in read_header(p)]
    if len(found) != 1:
        raise SystemExit(f"break_drafter: {folder}: tensor {name!r} found in {len(found)} safetensors files")
    return found[0]


def raw_tensors(path: Path) -> dict:
    """name -> (dtype, shape, raw bytes), in file order."""
    header = read_header(path)
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        base = 8 + length
        tensors = {}
        for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
            begin, end = entry["data_offsets"]
            f.seek(base + begin)
            tensors[name] = (entry["dtype"], entry["shape"], f.read(end - begin))
    return tensors


def copy_with(source: Path, dest: Path, shard: Path, tensors: dict) -> None:
    """``source`` copied to ``dest`` with ``shard`` rewritten from ``tensors``; the rest hard-linked."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for path in sorted(source.iterdir()):
        if path == shard or not path.is_file():
            continue
        try:
            os.link(path, dest / path.name)
        except OSError:
            shutil.copy2(path, dest / path.name)
    write_safetensors(dest / shard.name, tensors, metadata=read_metadata(shard) or None)


def d2t_shifted(source: Path, dest: Path) -> str:
    shard = shard_holding(source, "d2t")
    _, _, d2t = read_tensor(shard, "d2t")
    hot = [offset + i for i, offset in enumerate(d2t)]  # SGLang: hot_token_id = d2t + arange(draft_vocab)
    n = len(hot)
    shifted = [hot[(i + 1) % n] - i for i in range(n)]
    tensors = raw_tensors(shard)
    dtype, shape, _ = tensors["d2t"]
    tensors["d2t"] = (dtype, shape, pack(dtype, shifted))
    copy_with(source, dest, shard, tensors)
    return (f"{dest}: d2t shifted within the hot set ({n} draft ids; draft id 0 -> target id {hot[1]}, was "
            f"{hot[0]}; same hot set, t2d unchanged)")


def head_shifted(source: Path, dest: Path) -> str:
    shard = shard_holding(source, "lm_head.weight")
    tensors = raw_tensors(shard)
    dtype, shape, data = tensors["lm_head.weight"]
    row = element_size(dtype) * shape[1]
    tensors["lm_head.weight"] = (dtype, shape, data[row:] + data[:row])
    copy_with(source, dest, shard, tensors)
    return f"{dest}: lm_head rows rotated by one ({shape[0]} x {shape[1]} {dtype}; d2t unchanged)"


def layer_ids_shifted(source: Path, dest: Path, by: int = 1) -> str:
    config = json.loads((source / "config.json").read_text())
    eagle = config.get("eagle_config") or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        raise SystemExit(f"break_drafter: {source}/config.json names no eagle_config.eagle_aux_hidden_state_layer_ids")
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for path in sorted(source.iterdir()):
        if path.name == "config.json" or not path.is_file():
            continue
        try:
            os.link(path, dest / path.name)
        except OSError:
            shutil.copy2(path, dest / path.name)
    shifted = [i + by for i in ids]
    config["eagle_config"] = {**eagle, "eagle_aux_hidden_state_layer_ids": shifted}
    (dest / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return f"{dest}: eagle_aux_hidden_state_layer_ids {ids} -> {shifted} (tensors unchanged)"


def d2t_permuted(source: Path, dest: Path, share: float, seed: int = 0) -> str:
    """``share`` of the draft ids, chosen at random, permuted as one random cycle among them."""
    shard = shard_holding(source, "d2t")
    _, _, d2t = read_tensor(shard, "d2t")
    hot = [offset + i for i, offset in enumerate(d2t)]
    n = len(hot)
    chosen = random.Random(seed).sample(range(n), max(2, round(share * n)))  # random order: a random cycle
    mapped = list(hot)
    for i, position in enumerate(chosen):
        mapped[position] = hot[chosen[(i + 1) % len(chosen)]]
    tensors = raw_tensors(shard)
    dtype, shape, _ = tensors["d2t"]
    tensors["d2t"] = (dtype, shape, pack(dtype, [t - i for i, t in enumerate(mapped)]))
    copy_with(source, dest, shard, tensors)
    return (f"{dest}: d2t permuted within the hot set at {len(chosen)} of {n} draft ids ({len(chosen) / n:.1%}, one"
            f" random cycle, seed {seed}); {sum(a != b for a, b in zip(hot, mapped))} ids map elsewhere")


BREAKS = {"d2t-shifted": d2t_shifted, "head-shifted": head_shifted, "layer-ids-plus1": layer_ids_shifted,
          "d2t-permuted-10pct": lambda s, d, seed=0: d2t_permuted(s, d, 0.10, seed),
          "d2t-permuted-40pct": lambda s, d, seed=0: d2t_permuted(s, d, 0.40, seed)}
SEEDED = {"d2t-permuted-10pct", "d2t-permuted-40pct"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("draft", metavar="DRAFT_DIR", help="an EAGLE-3 drafter folder (config.json, *.safetensors)")
    parser.add_argument("--out", metavar="DIR", help="where the copies go (default: beside DRAFT_DIR)")
    parser.add_argument("--only", nargs="+", choices=list(BREAKS), metavar="NAME",
                        help=f"write only these copies ({', '.join(BREAKS)}; default: all)")
    parser.add_argument("--seed", type=int, default=0, help="which draft ids the partial permutations choose")
    args = parser.parse_args(argv)
    source = Path(args.draft).resolve()
    if not (source / "config.json").is_file():
        raise SystemExit(f"break_drafter: {source} has no config.json")
    out = Path(args.out).resolve() if args.out else source.parent
    for label in args.only or BREAKS:
        dest = out / f"{source.name}-{label}"
        print(BREAKS[label](source, dest, seed=args.seed) if label in SEEDED else BREAKS[label](source, dest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
