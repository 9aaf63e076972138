"""The models on disk: writing them, and reading back what their files decide."""
from __future__ import annotations

import json
import struct
from pathlib import Path

from sglang_pcie.tools.safetensors_io import read_header, read_tensor, write_safetensors


def write_model(folder: Path, config: dict, tensors: dict) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    (folder / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}) + "\n")
    write_safetensors(folder / "model.safetensors", tensors, metadata={"format": "pt"})
    return sum(len(t[2]) for t in tensors.values())


def tensor_bytes(path: Path, name: str) -> bytes:
    """One tensor's raw bytes, undecoded (read_header validates the offsets)."""
    begin, end = read_header(path)[name]["data_offsets"]
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        f.seek(8 + header_len + begin)
        return f.read(end - begin)


def predicted_chain(root: Path):
    """For ``mixed`` / ``full`` models in ``root``: a function (last prompt token, n) -> the n greedy tokens that
    follow, read from the files, or None where the files do not decide them. The state after token t is its
    embedding row; with --all-reduce-check that is the row of a draft token g(t) (t itself in the draft
    vocabulary); lm_head's row j starts with the embedding of partner(j): the tokens are partner(g(t)), g(t),
    partner(g(t)), ... Without --all-reduce-check a prompt token outside the draft vocabulary has a row of its own
    (None). Rows are told apart by their first half (the check chain's coordinates are in the second)."""
    row = 2 * json.loads((root / "target" / "config.json").read_text())["hidden_size"]
    key = row // 2
    embed = tensor_bytes(root / "target" / "model.safetensors", "model.embed_tokens.weight")
    head = tensor_bytes(root / "target" / "model.safetensors", "lm_head.weight")
    _, _, d2t = read_tensor(root / "draft" / "model.safetensors", "d2t")
    draft_of_row = {embed[t * row:t * row + key]: t for t in (x + i for i, x in enumerate(d2t))}

    def chain(last_token: int, count: int) -> list[int] | None:
        alias = draft_of_row.get(embed[last_token * row:last_token * row + key])
        if alias is None:
            return None
        partner = draft_of_row[head[alias * row:alias * row + key]]
        return [(partner, alias)[i % 2] for i in range(count)]
    return chain
