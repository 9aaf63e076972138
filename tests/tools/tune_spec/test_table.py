"""The table tune-spec writes for this box and the tables it reads: each bucket's step from the best measured fixed
setting, step 0 where the release takes it, the best fixed setting by geometric mean, the file exactly as SGLang's
--speculative-adaptive-config reads it (loaded by 0.5.16's and 0.5.13's own loaders from their pristine sources),
and a given table bounded and checked, each fault named in one line."""
from __future__ import annotations

import ast
import json
import math

import pytest

from sglang_pcie.tools.tune_spec.candidates import Candidate
from sglang_pcie.tools.tune_spec.release import adaptive_facts
from sglang_pcie.tools.tune_spec.table import (TABLE_FILE, best_fixed, bucket_ranges, config_json, copies_default,
                                               default_entry, entry, fixed_medians, read_table, tuned_buckets, uniform,
                                               write_table, STEP_0_MEASURED)

def release_loader(root):
    """The release's own ``_load_adaptive_config``, executed from its pristine source alone."""
    path = root / "sglang/srt/speculative/adaptive_spec_params.py"
    keep = [node for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.FunctionDef) and node.name == "_load_adaptive_config"]
    space = {"json": json}
    exec(compile(ast.Module(keep, []), str(path), "exec"), space)  # noqa: S102 (a pristine release's own code)
    return space["_load_adaptive_config"]


FOUND = [Candidate("none", (), None, "none"), Candidate("chain-1", (), 1, "chain"),
         Candidate("chain-3", (), 3, "chain"), Candidate("chain-7", (), 7, "chain"),
         Candidate("current", (), None, "current"), Candidate("adaptive", (), None, "adaptive")]
MEDIANS = {1: {"none": 100.0, "chain-1": 150.0, "chain-3": 200.0, "chain-7": 250.0, "current": 999.0},
           8: {"none": 800.0, "chain-1": 900.0, "chain-3": 1000.0, "chain-7": 950.0, "adaptive": 999.0},
           64: {"none": 5000.0, "chain-1": 4000.0, "chain-3": 3000.0}}


def test_only_fixed_candidates_count():
    assert fixed_medians(FOUND, MEDIANS) == {
        1: {"none": 100.0, "chain-1": 150.0, "chain-3": 200.0, "chain-7": 250.0},
        8: {"none": 800.0, "chain-1": 900.0, "chain-3": 1000.0, "chain-7": 950.0},
        64: {"none": 5000.0, "chain-1": 4000.0, "chain-3": 3000.0}}


def test_each_bucket_runs_its_levels_best_chain_and_never_step_0_noted_where_none_is_best():
    """Step 0 is not "no speculation" (measured 0.46x of it, table.STEP_0_MEASURED): where none is best, the best
    measured chain, and the note says why."""
    buckets, notes = tuned_buckets(FOUND, MEDIANS)
    assert buckets == {1: [7], 8: [3], 64: [1]}
    assert notes == [f"c=64: no speculation is best, and a table cannot give it ({STEP_0_MEASURED}): chain-1 (0.800x"
                     " of none) instead"]
    assert tuned_buckets(FOUND, {**MEDIANS, 32: {}})[0] == {1: [7], 8: [3], 64: [1]}
    buckets, notes = tuned_buckets(FOUND, {1: {"chain-3": 10.0}, 64: {"none": 9.0}})
    assert buckets == {1: [3]}
    assert notes == [f"c=64: no speculation is best and no chain was measured; a table cannot switch speculation off"
                     f" ({STEP_0_MEASURED})"]


# SGLang 0.5.16's DEFAULT_ADAPTIVE_CONFIG, as release.default_config reads it
DEFAULT_0_5_16 = {1: {"candidate_steps": [1, 3, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
                  8: {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
                  32: {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
                  64: {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0}}
SWEEP_8B = {1: {"adaptive": 460.5, "chain-7": 429.0, "chain-5": 414.2, "chain-3": 377.6},  # tok/s, medians of two
            32: {"chain-7": 5389.0, "chain-5": 5278.0, "chain-3": 5013.0, "adaptive": 4591.0}}  # servers each
FOUND_8B = [Candidate("none", (), None, "none")] + [Candidate(f"chain-{k}", (), k, "chain") for k in (3, 5, 7)] + [
    Candidate("adaptive", (), None, "adaptive")]


def test_where_sglangs_own_table_measured_fastest_its_bucket_is_copied_and_a_chain_elsewhere():
    """The 8B-shaped mixed pair on one H100 (benchmarks/results/2026-12-06-h100/tune-spec/NOTE.txt): SGLang's own
    table led at one request (+7.3% over chain-7), chain-7 at c=32 (SGLang's table there: steps 0 and 1). The table
    for this box takes each: SGLang's bucket 1 whole, then 7 steps."""
    buckets, notes = tuned_buckets(FOUND_8B, SWEEP_8B, DEFAULT_0_5_16)
    assert buckets == {1: [1, 3, 7], 32: [7]}
    assert notes == ["c=1: SGLang's own table measured fastest of the speculative settings (ahead of chain-7 by 7.3%):"
                     " its bucket 1 (steps 1, 3, 7) copied"]
    assert config_json(buckets, DEFAULT_0_5_16) == {"1": DEFAULT_0_5_16[1], "32": {"candidate_steps": [7]}}
    assert bucket_ranges(buckets) == ["batch 1-31: adaptive over steps 1, 3, 7", "batch 32-up: 7 steps"]
    assert uniform(buckets) is None and not copies_default(buckets, DEFAULT_0_5_16)
    # without the release's table (or its server) the chains alone decide, as before
    assert tuned_buckets(FOUND_8B, SWEEP_8B)[0] == {1: [7], 32: [7]}
    assert tuned_buckets(FOUND_8B, {k: {n: v for n, v in row.items() if n != "adaptive"} for k, row in
                                    SWEEP_8B.items()}, DEFAULT_0_5_16)[0] == {1: [7], 32: [7]}


def test_sglangs_bucket_is_the_one_serving_the_level_and_a_tie_goes_to_the_chain():
    medians = {4: {"chain-3": 10.0, "adaptive": 11.0}, 40: {"chain-3": 10.0, "adaptive": 10.0}}
    buckets, _ = tuned_buckets(FOUND_8B, medians, DEFAULT_0_5_16)
    assert buckets == {4: [1, 3, 7], 40: [3]}  # c=4 is served by SGLang's bucket 1; equal figures: the chain
    assert config_json(buckets, DEFAULT_0_5_16)["4"] == DEFAULT_0_5_16[1]
    # with graphs at 1 and 32, SGLang pads a batch of 4 to 32: its own table ran bucket 32 there, and that is copied
    buckets, notes = tuned_buckets(FOUND_8B, medians, DEFAULT_0_5_16, [1, 32])
    assert buckets == {4: [0, 1], 40: [3]} and "its bucket 32 (steps 0, 1) copied" in notes[0]
    assert config_json(buckets, DEFAULT_0_5_16)["4"] == DEFAULT_0_5_16[32]  # its hysteresis, whatever the key
    assert copies_default({4: [0, 1]}, DEFAULT_0_5_16, [1, 32]) and not copies_default({4: [0, 1]}, DEFAULT_0_5_16)


def test_where_no_speculation_is_best_the_faster_of_sglangs_bucket_and_the_best_chain_and_it_is_said():
    medians = {32: {"none": 100.0, "chain-3": 80.0, "adaptive": 90.0}, 64: {"none": 100.0, "adaptive": 50.0}}
    buckets, notes = tuned_buckets(FOUND_8B, medians, DEFAULT_0_5_16)
    assert buckets == {32: [0, 1], 64: [0]}
    assert notes[0] == ("c=32: SGLang's own table measured fastest of the speculative settings (ahead of chain-3 by"
                        " 12.5%; no speculation is best, and a table cannot give it: 0.900x of none): its bucket 32"
                        " (steps 0, 1) copied")
    assert notes[1].startswith("c=64: SGLang's own table measured fastest of the speculative settings (no chain"
                               " measured; no speculation is best")


def test_a_table_of_sglangs_own_buckets_everywhere_is_no_table_of_this_box():
    buckets, _ = tuned_buckets(FOUND_8B, {1: {"chain-7": 1.0, "adaptive": 2.0}, 32: {"chain-7": 1.0, "adaptive": 2.0}},
                               DEFAULT_0_5_16)
    assert buckets == {1: [1, 3, 7], 32: [0, 1]} and copies_default(buckets, DEFAULT_0_5_16)
    assert not copies_default({1: [1, 3, 7], 32: [1]}, DEFAULT_0_5_16) and not copies_default({}, DEFAULT_0_5_16)
    assert not copies_default(buckets, None)


def test_uniform_is_the_one_step_of_every_bucket():
    assert uniform({1: [3], 8: [3], 64: [3]}) == 3
    assert uniform({1: [0], 8: [0]}) == 0
    assert uniform({1: [3], 8: [1]}) is None
    assert uniform({1: [1, 3, 7], 8: [1, 3, 7]}) is None  # one table everywhere is still no fixed step


def test_the_best_fixed_setting_is_the_highest_geometric_mean_share_over_every_level():
    # measured at every level: none and chain-1, chain-3 (chain-7 misses c=64)
    name, share = best_fixed(FOUND, MEDIANS)
    shares = {"none": (100 / 250, 800 / 1000, 1.0), "chain-1": (150 / 250, 900 / 1000, 4000 / 5000),
              "chain-3": (200 / 250, 1.0, 3000 / 5000)}
    means = {n: math.exp(sum(map(math.log, s)) / 3) for n, s in shares.items()}
    assert name == max(means, key=means.get) == "chain-3" and share == pytest.approx(means["chain-3"], abs=1e-12)
    assert best_fixed(FOUND, {1: {"current": 5.0}}) == (None, None)
    assert best_fixed(FOUND, {1: {"chain-1": 5.0}, 8: {"chain-3": 5.0}}) == (None, None)  # none at every level
    assert best_fixed(FOUND, {1: {"chain-3": 5.0, "chain-1": 5.0}}) == ("chain-1", 1.0)  # a tie: by name


def test_the_file_is_sglangs_adaptive_config_exactly(tmp_path):
    path = write_table({64: [0], 1: [7], 8: [3]}, tmp_path)
    assert path == tmp_path / TABLE_FILE == tmp_path / "adaptive-config.json"
    assert path.read_text() == ('{\n "1": {\n  "candidate_steps": [\n   7\n  ]\n },\n "8": {\n  "candidate_steps": [\n'
                                '   3\n  ]\n },\n "64": {\n  "candidate_steps": [\n   0\n  ]\n }\n}\n')
    assert config_json({8: (3,)}) == {"8": {"candidate_steps": [3]}}
    assert read_table(str(path)) == {1: [7], 8: [3], 64: [0]}


def test_sglangs_own_loaders_read_the_file(pristine_source, tmp_path):
    """0.5.16's _load_adaptive_config takes it as written; 0.5.13's refuses its step 0, as the release facts say."""
    path = write_table({1: [7], 8: [3], 64: [0]}, tmp_path)
    load = release_loader(pristine_source("0.5.16"))
    cfg, buckets = load(str(path))
    assert buckets == {1: {"candidate_steps": [7]}, 8: {"candidate_steps": [3]}, 64: {"candidate_steps": [0]}}
    load = release_loader(pristine_source("0.5.13"))
    with pytest.raises(ValueError, match="BS 64"):
        load(str(path))
    assert load(str(write_table({1: [7], 64: [1]}, tmp_path)))[1] == {1: {"candidate_steps": [7]},
                                                                      64: {"candidate_steps": [1]}}
    # a bucket copied from SGLang's own table keeps that bucket's hysteresis
    assert adaptive_facts(pristine_source("0.5.16")).default_config == DEFAULT_0_5_16
    load = release_loader(pristine_source("0.5.16"))
    _, buckets = load(str(write_table({1: [1, 3, 7], 32: [7]}, tmp_path, DEFAULT_0_5_16)))
    assert buckets == {1: DEFAULT_0_5_16[1], 32: {"candidate_steps": [7]}}


def test_each_bucket_serves_the_batches_up_to_the_next():
    assert bucket_ranges({64: [0], 1: [7], 8: [3]}) == ["batch 1-7: 7 steps", "batch 8-63: 3 steps",
                                                        "batch 64-up: no speculation"]
    assert bucket_ranges({8: [2]}) == ["batch 1-up: 2 steps"]  # below the lowest key: the lowest bucket
    assert bucket_ranges({1: [1], 32: [3]}) == ["batch 1-31: 1 step", "batch 32-up: 3 steps"]


def test_a_given_table_keeps_its_buckets_and_skips_other_keys(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"1": {"candidate_steps": [1, 3, 7], "up_hysteresis": 0.0}, "note": "x",
                                "64": {"candidate_steps": [0, 16]}}))
    assert read_table(str(path)) == {1: [1, 3, 7], 64: [0, 16]}


def test_a_table_up_to_64_kib_is_read_and_one_byte_more_is_not(tmp_path):
    path = tmp_path / "t.json"
    body = json.dumps({"1": {"candidate_steps": [3]}})
    path.write_text(body + " " * (64 * 1024 - len(body)))
    assert path.stat().st_size == 64 * 1024 and read_table(str(path)) == {1: [3]}
    path.write_text(body + " " * (64 * 1024 + 1 - len(body)))
    with pytest.raises(ValueError) as caught:
        read_table(str(path))
    assert str(caught.value) == f"{path}: over 64 KiB, not an adaptive table"


BAD_STEPS = "bucket 8: candidate_steps must be a list of steps 0 to 16"


@pytest.mark.parametrize("content, fault", [
    (b"{\"1\": ", "not JSON (Expecting value: line 1 column 7 (char 6))"),
    (b"\xff\xfe{}", "not JSON ("),
    (b"[1, 2]", "not a JSON object"),
    (b"{\"note\": 1}", "no batch-size bucket (keys such as \"1\", \"32\")"),
    (b"{}", "no batch-size bucket (keys such as \"1\", \"32\")"),
    (b"{\"8\": [3]}", BAD_STEPS),
    (b"{\"8\": {}}", BAD_STEPS),
    (b"{\"8\": {\"candidate_steps\": []}}", BAD_STEPS),
    (b"{\"8\": {\"candidate_steps\": 3}}", BAD_STEPS),
    (b"{\"8\": {\"candidate_steps\": [true]}}", BAD_STEPS),
    (b"{\"8\": {\"candidate_steps\": [-1]}}", BAD_STEPS),
    (b"{\"8\": {\"candidate_steps\": [17]}}", BAD_STEPS),
    (b"{\"8\": {\"candidate_steps\": [2.0]}}", BAD_STEPS),
    (b"{\"8\": {\"candidate_steps\": [\"3\"]}}", BAD_STEPS),
])
def test_each_malformed_table_is_named_in_one_line(tmp_path, content, fault):
    path = tmp_path / "t.json"
    path.write_bytes(content)
    with pytest.raises(ValueError) as caught:
        read_table(str(path))
    said = str(caught.value)
    assert said.startswith(f"{path}: {fault}") and "\n" not in said, said


def test_a_path_that_is_no_file_is_named(tmp_path):
    for path in (tmp_path, tmp_path / "missing.json"):
        with pytest.raises(ValueError) as caught:
            read_table(str(path))
        assert str(caught.value) == f"{path}: not a file"


def test_the_edges_of_the_copy_rule():
    """Pinned by a mutation audit (2026-12-07): each line below failed under one planted one-line bug."""
    # a batch below every key of SGLang's table goes to its lowest bucket, as SGLang routes it
    assert default_entry(1, {8: {"candidate_steps": [1, 3]}, 32: {"candidate_steps": [0, 1]}}) == (
        8, {"candidate_steps": [1, 3]})
    # chain-1 winning is a chain winning: no "no speculation is best" note
    assert tuned_buckets(FOUND, {8: {"none": 1.0, "chain-1": 3.0, "chain-3": 2.0}}) == ({8: [1]}, [])
    # SGLang's one-step bucket [0] alone is not "SGLang's own table" (a one-step bucket never switches)
    assert not copies_default({64: [0]}, DEFAULT_0_5_16)
    # the hysteresis copied is that of SGLang's first bucket with those steps, and a one-step bucket carries none
    assert entry([1, 3], {1: {"candidate_steps": [1, 3], "up_hysteresis": 0.1},
                          8: {"candidate_steps": [1, 3], "up_hysteresis": 0.2}}) == {"candidate_steps": [1, 3],
                                                                                       "up_hysteresis": 0.1}
    assert config_json({64: [0]}, DEFAULT_0_5_16) == {"64": {"candidate_steps": [0]}}
