"""make-test-models --acceptance interleaved: its config and bad shapes, and, replayed on the CPU through
transformers' Llama (tests/support/scripts/eagle3_accept.py), the properties draft-token-watch's test relies on:
the next token is f of the token before the last (each frequent token follows many different tokens), the healthy
drafter is accepted token by token and a token it proposes after different tokens is accepted, while a wrong map
entry's token is rejected after every token, and each broken copy (benchmarks/break_drafter.py) lowers the accept
length."""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from sglang_pcie.tools import make_test_models as test_models
from sglang_pcie.tools.cli import main as cli_main
from sglang_pcie.tools.make_test_models import interleaved
from sglang_pcie.tools.safetensors_io import read_tensor
from support import run_benchmark

# the CPU shape of docs/make-test-models.md's interleaved figures (tiny's hidden 256 leaves codes of 42 coordinates)
SHAPE = replace(test_models.PRESETS["tiny"], layers=6, hidden=512, heads=8, kv_heads=4)
BREAKS = ["layer-ids-plus1", "d2t-permuted-10pct", "d2t-permuted-40pct"]


def test_interleaved_config_and_bad_shapes(tmp_path, capsys):
    test_models.make_models(tmp_path / "m", SHAPE, seed=0, acceptance="interleaved")
    for name in ("target", "draft"):
        config = json.loads((tmp_path / "m" / name / "config.json").read_text())
        assert config["rope_theta"] == interleaved.ROPE_THETA  # the previous-token head's frequencies, both models
    draft = json.loads((tmp_path / "m" / "draft" / "config.json").read_text())
    assert draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 3]
    for argv, named in ((["--layers", "4"], "--layers 5 or more"),
                        (["--layers", "6", "--hidden", "128"], "--hidden 145"),
                        (["--layers", "6", "--hidden", "512", "--heads", "8", "--kv-heads", "1"],
                         "--kv-heads x head_dim"),
                        (["--layers", "6", "--intermediate", "200"], "--intermediate >= 6")):
        assert cli_main(["make-test-models", str(tmp_path / "bad"), "--acceptance", "interleaved", *argv]) == 2
        err = capsys.readouterr().err
        assert named in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "bad").exists()


def _successors(tokens: list[list[int]], gap: int) -> dict:
    """token -> the set of tokens seen ``gap`` positions after it."""
    seen = defaultdict(set)
    for sequence in tokens:
        for a, b in zip(sequence, sequence[gap:]):
            seen[a].add(b)
    return seen


def _repeated_first_drafts(records: list) -> dict:
    """First-draft token -> the outcomes (1 accepted, 0 rejected) of the tokens proposed after two or more
    different verified tokens (``records``: eagle3_accept.py's [verified, first draft, accepted])."""
    contexts, outcomes = defaultdict(set), defaultdict(set)
    for verified, first, accepted in records:
        contexts[first].add(verified)
        outcomes[first].add(accepted)
    return {token: outcomes[token] for token in contexts if len(contexts[token]) >= 2}


def test_interleaved_drafter_varies_by_context_and_breaks_lower_it(sglang_env, tmp_path):
    test_models.make_models(tmp_path, SHAPE, seed=0, acceptance="interleaved")
    assert run_benchmark("break_drafter", tmp_path / "draft", "--only", *BREAKS).returncode == 0
    names = ["draft"] + [f"draft-{b}" for b in BREAKS]
    result = sglang_env("0.5.23").run_script_json("eagle3_accept.py", tmp_path / "target",
                                                  *(tmp_path / n for n in names), "--prompts", "8",
                                                  "--new-tokens", "48", "--first-drafts")
    accept = {Path(k).name: v for k, v in result["drafts"].items()}
    # the text: t(n+1) is a function of t(n-1), not of t(n) (a token follows many different tokens)
    generated = [sequence[6:] for sequence in result["tokens"]]  # after the random 6-token prompt
    assert all(len(after) == 1 for after in _successors(generated, 2).values())
    assert sum(len(after) > 1 for after in _successors(generated, 1).values()) >= 20
    healthy = accept["draft"]
    assert 2.5 < healthy["accept_length"] < 3.2, healthy["accept_length"]
    assert all(len(set(lengths)) >= 3 for lengths in healthy["per_prompt"]), healthy["per_prompt"]  # token by token
    # a token the healthy drafter proposes first after different verified tokens is accepted in some of them
    healthy_repeats = _repeated_first_drafts(healthy["first_drafts"])
    assert len(healthy_repeats) >= 10 and all(1 in accepted for accepted in healthy_repeats.values())
    lengths = {name: accept[name]["accept_length"] for name in names}
    assert lengths["draft-layer-ids-plus1"] == 1.0, lengths
    assert lengths["draft-d2t-permuted-10pct"] < lengths["draft"] - 0.1, lengths
    assert lengths["draft-d2t-permuted-40pct"] < lengths["draft-d2t-permuted-10pct"] - 0.3, lengths
    # a moved d2t entry's target token is proposed and rejected whatever the context
    _, _, d2t = read_tensor(tmp_path / "draft" / "model.safetensors", "d2t")
    _, _, moved = read_tensor(tmp_path / "draft-d2t-permuted-40pct" / "model.safetensors", "d2t")
    wrong_targets = {y + i for i, (x, y) in enumerate(zip(d2t, moved)) if x != y}
    broken_repeats = _repeated_first_drafts(accept["draft-d2t-permuted-40pct"]["first_drafts"])
    never = [token for token, accepted in broken_repeats.items() if accepted == {0}]
    assert len(never) >= 5 and set(never) <= wrong_targets, (never, wrong_targets)


def _problem(**fields) -> str | None:
    """The one problem interleaved.check names for SHAPE with ``fields`` changed (None: the shape is fine)."""
    try:
        interleaved.check(replace(SHAPE, **fields))
    except ValueError as exc:
        return str(exc)
    return None


def test_the_documented_bounds_are_exactly_where_a_shape_is_refused():
    """The module's (and docs/make-test-models.md's) bounds at their edges: 5 layers, hidden 145 (codes of
    (hidden - 1) // 6 = 24 coordinates), KV heads x head_dim >= that, intermediate >= 6 x that, an even head_dim."""
    prefix = "--acceptance interleaved needs "
    assert _problem() is None and _problem(layers=5) is None
    assert _problem(layers=4) == prefix + "--layers 5 or more (got 4): the drafter captures [0, L // 2 - 1, L - 3]"
    assert _problem(hidden=144, heads=4, kv_heads=2) == prefix + "--hidden 145 or more (got 144)"
    # 145 clears the hidden bound: the one problem left is its odd head_dim (145 has no even one)
    assert _problem(hidden=145, heads=5, kv_heads=5, intermediate=1024) == prefix + ("an even head_dim (hidden /"
                                                                                      " heads = 29)")
    # hidden 512, 8 heads: head_dim 64, codes of 85 coordinates: 2 KV heads carry them, 1 does not
    assert _problem(kv_heads=2) is None
    assert _problem(kv_heads=1) == prefix + "--kv-heads x head_dim >= (hidden - 1) // 6 = 85 (got 1 x 64)"
    assert _problem(intermediate=6 * 85) is None
    assert _problem(intermediate=6 * 85 - 1) == prefix + "--intermediate >= 6 x ((hidden - 1) // 6) = 510 (got 509)"
    assert interleaved.code_size(replace(SHAPE, hidden=145)) == 24 and interleaved.copy_heads(SHAPE) == 2
