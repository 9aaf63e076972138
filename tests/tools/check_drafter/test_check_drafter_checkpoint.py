"""Reading checkpoints: the standard-library safetensors reader (against the real ``safetensors`` library of the
cached SGLang 0.5.23 install), Hugging Face cache entries, sharded targets read a header at a time, and every kind
of unreadable input as one line and exit 2."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from drafter_models import (DRAFT_VOCAB, TARGET_VOCAB, H, by_name, check, make_draft, make_target, random_rows,
                            run_cli)
from drafter_models import (frequent_ids_fixture, pair_fixture, src23_fixture,  # noqa: F401 (fixtures)
                            tokenizer_json_fixture)
from sglang_pcie.tools import safetensors_io as st
from sglang_pcie.tools.check_drafter import checkpoint


def test_safetensors_roundtrip_and_single_tensor_read(tmp_path):
    path = tmp_path / "t.safetensors"
    st.write_safetensors(path, {"d2t": ("I64", (3,), st.pack("I64", [5, -1, 0])),
                                "t2d": ("BOOL", (4,), st.pack("BOOL", [1, 0, 0, 1])),
                                "w": ("BF16", (2,), st.pack("BF16", [1.5, -2.0])),
                                "f": ("F32", (1, 1), st.pack("F32", [0.25]))}, {"format": "pt"})
    header = st.read_header(path)
    assert header["w"] == {"dtype": "BF16", "shape": [2], "data_offsets": [28, 32]}
    assert st.read_metadata(path) == {"format": "pt"}
    assert list(st.read_tensor(path, "d2t")[2]) == [5, -1, 0]
    assert st.read_tensor(path, "t2d")[2] == [True, False, False, True]
    assert st.read_tensor(path, "w")[2] == [1.5, -2.0]
    assert st.read_tensor(path, "f")[:2] == ("F32", [1, 1])
    with pytest.raises(KeyError, match="nope"):
        st.read_tensor(path, "nope")


def test_safetensors_zero_tensors_are_holes(tmp_path):
    path = tmp_path / "sparse.safetensors"
    st.write_safetensors(path, {"big": ("BF16", (1 << 20, 1024), None), "d2t": ("I64", (2,), st.pack("I64", [1, 2])),
                                "tail": ("F32", (4,), None)})
    header = st.read_header(path)
    data_bytes = 2 * (1 << 30) + 16 + 16
    assert header["tail"]["data_offsets"][1] == data_bytes
    with open(path, "rb") as f:
        assert path.stat().st_size == 8 + int.from_bytes(f.read(8), "little") + data_bytes
    assert list(st.read_tensor(path, "d2t")[2]) == [1, 2]
    assert list(st.read_tensor(path, "tail")[2]) == [0.0] * 4
    assert path.stat().st_blocks * 512 < 1 << 20  # 2 GiB apparent size, almost nothing on disk


def test_safetensors_truncated_and_oversized_headers(tmp_path):
    good = tmp_path / "good.safetensors"
    st.write_safetensors(good, {"x": ("F32", (8,), st.pack("F32", range(8)))})
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:-4])
    with pytest.raises(ValueError, match="'x' ends at byte 32 of a 28-byte data section"):
        st.read_header(cut)
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes((10 ** 12).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match="header length 1000000000000 does not fit in a 10-byte file"):
        st.read_header(huge)
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match="too short"):
        st.read_header(short)
    with pytest.raises(ValueError, match="needs 12"):
        st.write_safetensors(tmp_path / "bad.safetensors", {"x": ("F32", (3,), b"\0" * 8)})


def test_safetensors_agrees_with_the_real_library(tmp_path, sglang_env):
    """Files written here load with the real safetensors (in the cached SGLang 0.5.23 venv) and vice versa."""
    python = sglang_env("0.5.23").python
    mine = tmp_path / "mine.safetensors"
    st.write_safetensors(mine, {"d2t": ("I64", (3,), st.pack("I64", [7, -2, 0])),
                                "t2d": ("BOOL", (2,), st.pack("BOOL", [0, 1])),
                                "w": ("BF16", (2, 1), st.pack("BF16", [0.5, 3.0]))})
    theirs = tmp_path / "theirs.safetensors"
    code = (
        "import sys, torch, json\n"
        "from safetensors.torch import load_file, save_file\n"
        "t = load_file(sys.argv[1])\n"
        "print(json.dumps({k: v.float().flatten().tolist() for k, v in t.items()}))\n"
        "save_file({'a': torch.arange(5, dtype=torch.int64) - 2, 'b': torch.tensor([1.25, -4.0],"
        " dtype=torch.bfloat16), 'c': torch.tensor([True, False, True])}, sys.argv[2])\n")
    proc = subprocess.run([str(python), "-c", code, str(mine), str(theirs)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {"d2t": [7.0, -2.0, 0.0], "t2d": [0.0, 1.0],
                                                         "w": [0.5, 3.0]}
    assert list(st.read_tensor(theirs, "a")[2]) == [-2, -1, 0, 1, 2]
    assert st.read_tensor(theirs, "b")[2] == [1.25, -4.0]
    assert st.read_tensor(theirs, "c")[2] == [True, False, True]


def test_hugging_face_cache_entry_and_sharded_target(capsys, tmp_path, tokenizer_json, frequent_ids, src23):
    entry = tmp_path / "hub" / "models--org--target"
    snapshot = make_target(entry / "snapshots" / "abc123", tokenizer_json, shards=3, layer_tensors=4)
    (entry / "blobs").mkdir()
    for file in list(snapshot.iterdir()):  # as huggingface_hub stores them: links into blobs/
        blob = entry / "blobs" / f"blob-{file.name}"
        file.rename(blob)
        file.symlink_to(Path("..", "..", "blobs", blob.name))
    make_target(entry / "snapshots" / "old999", tokenizer_json, vocab=7)  # an older snapshot: must not be used
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text("abc123\n")
    draft = make_draft(tmp_path / "draft", frequent_ids)
    code, report = check(capsys, "--draft", draft, "--target", entry, "--sglang-source", src23)
    assert code == 0, report
    assert report["target"] == str(entry / "snapshots" / "abc123")
    code, report = check(capsys, "--draft", draft, "--target", entry / "snapshots" / "abc123")
    assert code == 0


def test_reads_headers_and_maps_only(capsys, tmp_path, tokenizer_json, frequent_ids, monkeypatch):
    """A sharded target of 200 GiB (sparse files) costs kilobytes of reading: headers, d2t and t2d, and the 64
    sampled rows of the drafter's lm_head and of the target's embed_tokens and lm_head."""
    target = make_target(tmp_path / "target", tokenizer_json, shards=4, layer_tensors=2)
    for shard in range(4):  # one 50 GiB hole per shard, listed in the index like real weights
        file = target / f"model-{shard + 1:05d}-of-00004.safetensors"
        tensors = {n: (e["dtype"], e["shape"], None) for n, e in st.read_header(file).items()}
        tensors[f"model.layers.{shard}.mlp.experts.weight"] = ("BF16", (25 * 1024, 1024 * 1024), None)
        st.write_safetensors(file, tensors)
    index = json.loads((target / "model.safetensors.index.json").read_text())
    index["weight_map"].update({f"model.layers.{s}.mlp.experts.weight": f"model-{s + 1:05d}-of-00004.safetensors"
                                for s in range(4)})
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    assert sum(f.stat().st_size for f in target.glob("*.safetensors")) > 200 * 2 ** 30
    draft = make_draft(tmp_path / "draft", frequent_ids)
    tensors = {n: (e["dtype"], e["shape"], None) for n, e in st.read_header(draft / "model.safetensors").items()}
    tensors["lm_head.weight"] = random_rows(DRAFT_VOCAB, H, 3)
    tensors["d2t"] = ("I64", (DRAFT_VOCAB,), st.pack("I64", [t - i for i, t in enumerate(frequent_ids)]))
    tensors["t2d"] = ("BOOL", (TARGET_VOCAB,), st.pack("BOOL", [j in set(frequent_ids) for j in range(TARGET_VOCAB)]))
    st.write_safetensors(draft / "model.safetensors", tensors)
    read = []
    real_open = open

    class Counting:
        def __init__(self, *args, **kwargs):
            self.f = real_open(*args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, n=-1):
            data = self.f.read(n)
            read.append(len(data))
            return data

        def seek(self, *args):
            return self.f.seek(*args)

    monkeypatch.setattr(st, "open", Counting, raising=False)
    monkeypatch.setattr(checkpoint, "open", Counting, raising=False)
    code, report = check(capsys, "--draft", draft, "--target", target)
    assert code == 0, report
    assert by_name(report)["lm_head rows"]["reason"].startswith("cannot tell: the sampled target rows are zero")
    assert 0 < sum(read) < 64 * 1024, read


@pytest.mark.parametrize("problem", ["missing", "no-config", "bad-json", "bad-header", "missing-shard", "text",
                                     "bad-value"])
def test_unreadable_input_exits_2(capsys, tmp_path, pair, problem):
    target, draft = pair
    args = ["--draft", draft, "--target", target]
    if problem == "missing":
        args[1] = tmp_path / "nowhere"
    elif problem == "no-config":
        (draft / "config.json").unlink()
    elif problem == "bad-json":
        (draft / "config.json").write_text("{not json")
    elif problem == "bad-header":
        (draft / "model.safetensors").write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    elif problem == "bad-value":
        config = json.loads((draft / "config.json").read_text())
        (draft / "config.json").write_text(json.dumps({**config, "hidden_size": "thirty-two"}))
    elif problem == "missing-shard":
        (target / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "gone.safetensors"}}))
    else:
        args += ["--text", tmp_path / "none.txt"]
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == ""
    assert err.startswith("sglang-pcie check-drafter: error: ") and len(err.strip().splitlines()) == 1
