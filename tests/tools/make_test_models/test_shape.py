"""The models' shapes (sglang_pcie/tools/make_test_models/shape.py): the presets the docs quote, each bad shape
refused in one line naming the option, the all-reduce check's own needs at their edges, and three distinct captured
layers."""
from __future__ import annotations

from dataclasses import replace

import pytest

from sglang_pcie.tools.make_test_models.shape import ACCEPTANCE, PRESETS, Shape, aux_layer_ids


def test_the_presets_are_the_documented_shapes():
    tiny, e2e = PRESETS["tiny"], PRESETS["e2e"]
    assert (tiny.hidden, tiny.layers, tiny.heads, tiny.kv_heads, tiny.vocab, tiny.draft_vocab) == (256, 4, 4, 2,
                                                                                                   32000, 8192)
    assert (e2e.hidden, e2e.layers, e2e.heads, e2e.kv_heads, e2e.intermediate) == (2048, 8, 16, 8, 5632)
    assert tiny.head_dim == 64 and e2e.head_dim == 128
    assert ACCEPTANCE == {"random": None, "mixed": 0.5, "full": 1.0, "tokenwise": None, "interleaved": None}


@pytest.mark.parametrize("fields, message", [
    ({"hidden": 250}, "--hidden 250 is not a multiple of --heads 4"),
    ({"kv_heads": 3}, "--heads 4 is not a multiple of --kv-heads 3"),
    ({"layers": 3}, "--layers 3: the drafter captures three distinct target layers (>= 4)"),
    ({"draft_vocab": 32001}, "--draft-vocab 32001: must be in 1..32000 (the target's vocab)"),
    ({"draft_vocab": 0}, "--draft-vocab 0: must be in 1..32000 (the target's vocab)"),
])
def test_a_bad_shape_is_one_value_error_naming_the_option(fields, message):
    with pytest.raises(ValueError) as caught:
        replace(Shape(), **fields).check()
    assert str(caught.value) == message


def test_the_edges_of_a_good_shape_pass():
    replace(Shape(), layers=4, draft_vocab=32000).check()
    replace(Shape(), draft_vocab=1, heads=4, kv_heads=4).check()


@pytest.mark.parametrize("acceptance, fields, message", [
    ("random", {}, "--all-reduce-check needs --acceptance mixed or full (got --acceptance random)"),
    ("tokenwise", {}, "--all-reduce-check needs --acceptance mixed or full (got --acceptance tokenwise)"),
    ("mixed", {"heads": 2, "kv_heads": 1}, "--all-reduce-check needs an even number of heads and KV heads, not"
                                           " --heads 2 --kv-heads 1"),
    ("mixed", {"heads": 1, "kv_heads": 1}, "--all-reduce-check needs an even number of heads and KV heads, not"
                                           " --heads 1 --kv-heads 1"),
    ("full", {"intermediate": 1026}, "--all-reduce-check: --intermediate 1026 is not a multiple of --heads 4 (one"
                                     " MLP block per head)"),
    ("full", {"layers": 65}, "--all-reduce-check: --hidden 256 is under 4 x --layers 65 (the check chain takes 2"
                             " coordinates per layer, at most half the hidden size)"),
    ("full", {"draft_vocab": 16001}, "--all-reduce-check: --draft-vocab 16001 is over half --vocab 32000 (each draft"
                                     " token has a decoy outside the draft vocabulary)"),
])
def test_the_all_reduce_check_names_what_it_needs(acceptance, fields, message):
    with pytest.raises(ValueError) as caught:
        replace(Shape(), **fields).check_all_reduce(acceptance)
    assert str(caught.value) == message


def test_the_all_reduce_checks_edges_pass():
    replace(Shape(), layers=64, draft_vocab=16000).check_all_reduce("mixed")  # 4 x 64 = 256, 2 x 16000 = 32000
    Shape().check_all_reduce("full")


@pytest.mark.parametrize("layers", [4, 5, 6, 7, 8, 61])
def test_the_captured_layers_are_three_distinct_ones_spread_over_the_model(layers):
    ids = aux_layer_ids(layers)
    assert ids == [0, layers // 2 - 1, layers - 2] and len(set(ids)) == 3 and max(ids) < layers
