"""The lm_head rows check: on the models make-test-models writes (``--acceptance mixed``: the drafter's lm_head rows
are the target's embedding rows of its hot tokens; ``random``: unrelated rows) and on drafters whose d2t is wrong
but valid (permuted within its own hot set), with no tokenizer and no reference drafter."""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from drafter_models import DRAFT_VOCAB, H, by_name, check, make_draft, make_target, random_rows, raw_tensors
from drafter_models import frequent_ids_fixture, src23_fixture, tokenizer_json_fixture  # noqa: F401 (fixtures)
from sglang_pcie.tools import safetensors_io as st
from sglang_pcie.tools.check_drafter import head_rows
from sglang_pcie.tools.make_test_models import Shape, make_models

SHAPE = Shape(vocab=2048, hidden=64, layers=4, heads=4, kv_heads=2, intermediate=128, draft_vocab=512)


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    """make-test-models' random and mixed pairs (tiny shapes), written once."""
    root = tmp_path_factory.mktemp("made")
    return {kind: make_models(root / kind, SHAPE, seed=0, acceptance=kind) for kind in ("random", "mixed")}


def with_map(draft: str, folder: Path, targets_of) -> Path:
    """A copy of ``draft`` whose d2t maps draft id i to ``targets_of(hot)[i]`` (t2d and every weight unchanged)."""
    shutil.copytree(draft, folder)
    file = folder / "model.safetensors"
    tensors = raw_tensors(file)
    hot = [i + d for i, d in enumerate(st.read_tensor(file, "d2t")[2])]
    new = targets_of(hot)
    tensors["d2t"] = ("I64", (len(new),), st.pack("I64", [t - i for i, t in enumerate(new)]))
    st.write_safetensors(file, tensors, {"format": "pt"})
    return folder


def shifted(hot: list[int]) -> list[int]:
    """The issue's drafter: draft id i maps to the target id of draft id i+1 (every id valid and distinct)."""
    return [hot[(i + 1) % len(hot)] for i in range(len(hot))]


def rows_check(capsys, draft, target) -> dict:
    code, report = check(capsys, "--draft", draft, "--target", target)
    assert by_name(report)["mapping"]["status"] == "ok"  # each map is valid on its own
    return by_name(report)["lm_head rows"]


def test_made_mixed_drafter_lines_up(capsys, made):
    result = rows_check(capsys, made["mixed"]["draft"]["path"], made["mixed"]["target"]["path"])
    assert result["status"] == "ok"
    assert result["reason"].startswith("under d2t, 64 of 64 line up with the target's embed_tokens rows")


def test_a_map_shifted_by_one_is_found(capsys, made, tmp_path):
    draft = with_map(made["mixed"]["draft"]["path"], tmp_path / "shifted", shifted)
    result = rows_check(capsys, draft, made["mixed"]["target"]["path"])
    assert result["status"] == "fail"
    assert "the rows fit d2t shifted by one position: draft id i's row belongs to the target id d2t gives draft" \
           " id i-1" in result["reason"]
    assert result["shifted"]["by"] == -1


def test_a_map_permuted_within_its_hot_set_is_found(capsys, made, tmp_path):
    draft = with_map(made["mixed"]["draft"]["path"], tmp_path / "shuffled",
                     lambda hot: random.Random(1).sample(hot, len(hot)))
    result = rows_check(capsys, draft, made["mixed"]["target"]["path"])
    assert result["status"] == "fail" and result["reason"].startswith("the rows fit other target ids than d2t says")
    first = result["elsewhere"]["matches"][0]
    hot = [i + d for i, d in enumerate(st.read_tensor(Path(made["mixed"]["draft"]["path"]) / "model.safetensors",
                                                      "d2t")[2])]
    assert first["matches"] == hot[first["draft_id"]] != first["d2t"]  # the row's own token, found again
    assert f"draft id {first['draft_id']}'s row is the target's embed_tokens row of id {first['matches']}" \
        in result["reason"]  # the reason names the first match


@pytest.mark.parametrize("map_of", [None, shifted])
def test_unrelated_rows_cannot_tell(capsys, made, tmp_path, map_of):
    """make-test-models' random drafter: its rows resemble no target row, under any map: never "ok"."""
    draft = made["random"]["draft"]["path"]
    if map_of:
        draft = with_map(draft, tmp_path / "shifted", map_of)
    result = rows_check(capsys, draft, made["random"]["target"]["path"])
    assert result["status"] == "skip" and result["reason"].startswith("cannot tell: under d2t 0 of 64 line up")


@pytest.mark.parametrize("broken, status", [(6, "ok"), (7, "warn")])
def test_ninety_percent_of_the_rows_must_line_up(capsys, made, tmp_path, broken, status):
    """58 of 64 sampled rows lining up is "ok" (>= 90%); 57 is not, and the 7 others, random rows, fit nowhere."""
    draft = with_map(made["mixed"]["draft"]["path"], tmp_path / "draft", lambda hot: hot)
    file = draft / "model.safetensors"
    tensors = raw_tensors(file)
    head = list(st.read_tensor(file, "lm_head.weight")[2])
    noise = random.Random(5)
    for i in head_rows.sample_ids(SHAPE.draft_vocab)[:broken]:
        head[i * SHAPE.hidden:(i + 1) * SHAPE.hidden] = [noise.uniform(-0.03, 0.03) for _ in range(SHAPE.hidden)]
    tensors["lm_head.weight"] = ("BF16", [SHAPE.draft_vocab, SHAPE.hidden], st.pack("BF16", head))
    st.write_safetensors(file, tensors)
    result = rows_check(capsys, draft, made["mixed"]["target"]["path"])
    assert result["status"] == status
    assert result["embed_tokens"]["rows"]["lined_up"] == 64 - broken


def test_another_width_is_judged_by_the_similarity_structure(capsys, tmp_path, frequent_ids):
    """A drafter whose hidden size is not the target's (its rows: the target's embedding rows, twice over): the
    rows cannot be compared value by value, their similarity structure can."""
    target = make_target(tmp_path / "target", weights=True)
    source = st.read_tensor(target / "model.safetensors", "model.embed_tokens.weight")[2]
    wide = [v for t in frequent_ids for v in list(source[t * H:(t + 1) * H]) * 2]
    for name, ids in (("draft", frequent_ids), ("shifted", shifted(frequent_ids))):
        draft = make_draft(tmp_path / name, ids, hidden=2 * H, target_hidden=H)
        tensors = raw_tensors(draft / "model.safetensors")
        tensors["lm_head.weight"] = ("BF16", (DRAFT_VOCAB, 2 * H), st.pack("BF16", wide))
        st.write_safetensors(draft / "model.safetensors", tensors)
        code, report = check(capsys, "--draft", draft, "--target", target)
        result = by_name(report)["lm_head rows"]
        if name == "draft":
            assert result["status"] == "ok" and "resemble one another as their target rows do" in result["reason"]
            assert "rows" not in result["embed_tokens"]  # no value-by-value test across widths
        else:
            assert result["status"] == "fail" and "shifted by one position" in result["reason"]


@pytest.mark.parametrize("case, words", [
    ("zero rows", "cannot tell: the 64 sampled lm_head rows are zero"),
    ("target's head", "the drafter takes the target's lm_head (no draft_vocab_size): its rows are the target's"),
    ("no target", "give --target to compare the lm_head rows with the target's"),
])
def test_what_the_check_cannot_compare(capsys, tmp_path, frequent_ids, case, words):
    target = make_target(tmp_path / "target", weights=True)
    if case == "target's head":
        draft = make_draft(tmp_path / "draft", list(range(512)), draft_vocab=None)
    else:
        draft = make_draft(tmp_path / "draft", frequent_ids)
    code, report = check(capsys, "--draft", draft, *(["--target", target] if case != "no target" else []))
    result = by_name(report)["lm_head rows"]
    assert (result["status"], result["reason"].startswith(words)) == ("skip", True), result["reason"]


def test_reads_a_bounded_number_of_rows(tmp_path, frequent_ids, monkeypatch):
    """The sample: at most SAMPLE rows per matrix and map, SEARCH_LIMIT rows of SEARCH_COLUMNS for the scan."""
    target = make_target(tmp_path / "target", weights=True)
    draft = make_draft(tmp_path / "draft", frequent_ids)
    tensors = raw_tensors(draft / "model.safetensors")
    tensors["lm_head.weight"] = random_rows(DRAFT_VOCAB, H, 9)  # unrelated: every look is taken
    st.write_safetensors(draft / "model.safetensors", tensors)
    asked = []
    from sglang_pcie.tools.check_drafter.checkpoint import Checkpoint
    real = Checkpoint.rows

    def counting(self, name, rows, columns):
        asked.append((self.role, name, len(rows), len(columns)))
        return real(self, name, rows, columns)

    monkeypatch.setattr(Checkpoint, "rows", counting)
    from sglang_pcie.tools.check_drafter import run_checks

    report = run_checks(str(draft), str(target))
    assert by_name(report)["lm_head rows"]["status"] == "skip"
    assert max(n for _, _, n, _ in asked) <= 4096  # read in chunks
    assert max(c for _, _, _, c in asked) <= H  # never more columns than a row has
    # The sample: the drafter's rows, then 2 target matrices x 3 maps (d2t, shifted back and forth); the scan: the
    # searched rows, every target row the map names once per matrix, 3 rows to confirm each match.
    sample, searched, hot = head_rows.SAMPLE, head_rows.SEARCHED_ROWS, len(set(frequent_ids))
    assert sum(n for _, _, n, _ in asked) <= sample * (1 + 2 * 3) + searched + 2 * (hot + 3 * searched)
    assert json.dumps(report)  # the report stays JSON


def test_a_verdict_that_found_nothing_names_every_reference_compared_the_same_way():
    """Two drafters, each closest to another of the target's matrices: both lines name the rows compared the same
    way, every reference in one order (embed_tokens, then lm_head), whichever came closest."""
    embed, lm_head = (head_rows.Reference(label, f"model.{label}.weight", H) for label in ("embed_tokens", "lm_head"))

    def found(lined_up, z):
        rows = {"lined_up": lined_up, "of": 64, "own_median": 0.1, "shuffled_mean": 0.0, "shuffled_sd": 0.1,
                "threshold": 0.5, "not_lined_up": []}
        return {"rows": rows, "structure": {"r": 0.1, "null_mean": 0.0, "null_sd": 0.1, "z": z, "pairs": 2016}}

    closest_lm_head = head_rows.best_words([(embed, found(1, 0.5)), (lm_head, found(9, 1.0))])
    closest_embed = head_rows.best_words([(embed, found(9, 1.0)), (lm_head, found(1, 0.5))])
    for words in (closest_lm_head, closest_embed):
        names = [part.split("the target's ")[1].split(" rows")[0] for part in words.split("; ")]
        assert names == ["embed_tokens", "embed_tokens", "lm_head", "lm_head"], words
    assert closest_lm_head.startswith("1 of 64 line up with the target's embed_tokens rows")
    assert closest_embed.startswith("9 of 64 line up with the target's embed_tokens rows")


def test_a_row_lines_up_only_where_its_own_target_row_also_scores_highest():
    """The line-up rule has two halves: the own row LINE_UP_Z SDs above the shuffled pairs, and highest of the row.
    Row 0 clears the first (0.6, far above the shuffled pairs) but scores row 1's target higher (0.8): not lined up."""
    n = 10
    theirs = [[1.0 if k == i else 0.0 for k in range(n)] for i in range(n)]
    mine = [list(row) for row in theirs]
    mine[0] = [0.6, 0.8] + [0.0] * (n - 2)
    found = head_rows.row_test(mine, theirs)
    assert found["threshold"] < 0.6
    assert (found["lined_up"], found["not_lined_up"]) == (n - 1, [0])


def test_a_map_wrong_for_some_rows_only_names_where_those_rows_fit(capsys, made, tmp_path):
    """Half the hot set permuted among itself: half the sampled rows line up (enough to show a related head), the
    others are scanned and found at other target ids: a failure, not "cannot tell"."""
    def half_permuted(hot):
        first = hot[:len(hot) // 2]
        return random.Random(2).sample(first, len(first)) + hot[len(hot) // 2:]

    draft = with_map(made["mixed"]["draft"]["path"], tmp_path / "half", half_permuted)
    result = rows_check(capsys, draft, made["mixed"]["target"]["path"])
    assert result["status"] == "fail" and result["reason"].startswith("the rows fit other target ids than d2t says")
    assert head_rows.RELATED_SHARE * 64 <= result["embed_tokens"]["rows"]["lined_up"] < head_rows.MIN_SHARE * 64


def _rewrite_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("case, words", [
    ("tied", "lm_head is the embedding table (tie_word_embeddings): see embeddings"),
    ("invalid map", "the d2t map is not valid (see mapping)"),
    ("seven ids", "fewer than 8 draft ids: too few to compare"),
    ("seven rows, no d2t", "fewer than 8 draft ids: too few to compare"),  # the head's rows are the draft ids
    ("int head", "no 2-D float lm_head.weight to compare (see embeddings)"),
    ("1-D head", "no 2-D float lm_head.weight to compare (see embeddings)"),
    ("no head", "no 2-D float lm_head.weight to compare (see embeddings)"),
    ("eight ids", None),
    ("no target rows", "cannot tell: the target has no float embed_tokens / lm_head with a row per token"),
])
def test_each_reason_the_rows_cannot_be_compared(capsys, tmp_path, frequent_ids, case, words):
    """Each of cannot_compare's reasons, on a drafter whose rows are otherwise the target's under its map."""
    target = make_target(tmp_path / "target", weights=True)
    ids = list(frequent_ids)
    if case == "invalid map":
        ids[10] = ids[9]
    if case in ("seven ids", "eight ids", "seven rows, no d2t"):
        ids = ids[:8 if case == "eight ids" else 7]
    draft = make_draft(tmp_path / "draft", ids, head_from=target, draft_vocab=len(ids),
                       with_t2d=case != "no target rows", with_head=case != "no head")
    if case == "tied":
        _rewrite_config(draft, tie_word_embeddings=True)
    if case in ("int head", "1-D head", "seven rows, no d2t"):
        tensors = raw_tensors(draft / "model.safetensors")
        if case == "seven rows, no d2t":
            del tensors["d2t"], tensors["t2d"]
        else:
            dtype, shape = ("I32", (len(ids), H)) if case == "int head" else ("BF16", (len(ids) * H,))
            tensors["lm_head.weight"] = (dtype, shape, st.pack(dtype, [1] * len(ids) * H))
        st.write_safetensors(draft / "model.safetensors", tensors)
    if case == "no target rows":  # every matrix has fewer rows than the vocabulary: no row per token
        _rewrite_config(target, vocab_size=DRAFT_VOCAB * 4)
    result = by_name(check(capsys, "--draft", draft, "--target", target)[1])["lm_head rows"]
    if words is None:  # eight rows, each its target row: compared, and they line up
        assert result["status"] == "ok" and result["reason"].startswith("under d2t, 8 of 8 line up"), result
    else:
        assert (result["status"], result["reason"]) == ("skip", words)


def test_the_structure_test_of_rows_all_alike_is_zero_not_an_error():
    """Rows (or target rows) whose pairwise similarities do not vary: no correlation to speak of, z 0."""
    alike = [[1.0, 0.0]] * 10
    varied = [[1.0, 0.0] if i % 2 else [0.0, 1.0] for i in range(10)]
    for mine, theirs in ((alike, varied), (varied, alike)):
        assert head_rows.structure_test(mine, theirs) == {"r": 0.0, "null_mean": 0.0, "null_sd": 0.0, "z": 0.0,
                                                          "pairs": 45}


@pytest.mark.parametrize("zeroed, status", [(32, "ok"), (33, "skip")])
def test_a_head_is_a_placeholder_when_more_than_half_its_sampled_rows_are_zero(capsys, made, tmp_path, zeroed,
                                                                               status):
    """Half the sampled rows zero: the other half is compared (and lines up); one more, and it is a placeholder."""
    draft = with_map(made["mixed"]["draft"]["path"], tmp_path / "draft", lambda hot: hot)
    file = draft / "model.safetensors"
    tensors = raw_tensors(file)
    head = list(st.read_tensor(file, "lm_head.weight")[2])
    for i in head_rows.sample_ids(SHAPE.draft_vocab)[:zeroed]:
        head[i * SHAPE.hidden:(i + 1) * SHAPE.hidden] = [0.0] * SHAPE.hidden
    tensors["lm_head.weight"] = ("BF16", [SHAPE.draft_vocab, SHAPE.hidden], st.pack("BF16", head))
    st.write_safetensors(file, tensors)
    result = rows_check(capsys, draft, made["mixed"]["target"]["path"])
    if status == "ok":
        assert result["status"] == "ok" and result["reason"].startswith("under d2t, 32 of 32 line up")
    else:
        assert (result["status"], result["reason"]) == (
            "skip", "cannot tell: the 64 sampled lm_head rows are zero (a placeholder?)")


def test_a_target_whose_rows_are_zero_cannot_tell(capsys, tmp_path, frequent_ids):
    """The drafter's rows are real, the target's sampled rows are zero (a placeholder target): nothing compared."""
    weighted = make_target(tmp_path / "weighted", weights=True)
    draft = make_draft(tmp_path / "draft", frequent_ids, head_from=weighted)
    placeholder = make_target(tmp_path / "placeholder")
    result = by_name(check(capsys, "--draft", draft, "--target", placeholder)[1])["lm_head rows"]
    assert (result["status"], result["reason"]) == (
        "skip", "cannot tell: the sampled target rows are zero (a placeholder target?)")


@pytest.mark.parametrize("pairs, compared", [(7, False), (8, True)])
def test_eight_pairs_of_nonzero_rows_are_the_least_compared(pairs, compared):
    """compare() keeps the pairs where both rows are nonzero; fewer than 8 such pairs: nothing to say (None)."""
    n = 10
    identity = [[1.0 if k == i else 0.0 for k in range(n)] for i in range(n)]
    target_rows = [row if i < pairs else [0.0] * n for i, row in enumerate(identity)]

    class Target:
        def rows(self, name, ids, columns):
            return [target_rows[i] for i in ids]

    class Ctx:
        target = Target()

    ref = head_rows.Reference("embed_tokens", "model.embed_tokens.weight", n)
    found = head_rows.compare(Ctx(), ref, head_rows.unit_rows(identity), list(range(n)), n)
    assert (found is not None) == compared
    if compared:
        assert (found["rows"]["lined_up"], found["rows"]["of"]) == (8, 8)


def test_a_map_shifted_the_other_way_is_found_too(capsys, made, tmp_path):
    """Draft id i mapped to the target id of draft id i-1: the rows fit d2t shifted by +1."""
    draft = with_map(made["mixed"]["draft"]["path"], tmp_path / "back", lambda hot: [hot[i - 1] for i in range(len(hot))])
    result = rows_check(capsys, draft, made["mixed"]["target"]["path"])
    assert result["status"] == "fail" and result["shifted"]["by"] == 1
    assert "draft id i's row belongs to the target id d2t gives draft id i+1" in result["reason"]


def test_the_line_up_rule_and_the_structure_rule_hold_at_their_bounds():
    """90% of the rows lining up is enough (9 of 10); STRUCTURE_Z SDs exactly is enough."""
    assert head_rows.lines_up({"rows": {"lined_up": 9, "of": 10}}) is True
    assert head_rows.lines_up({"rows": {"lined_up": 8, "of": 10}}) is False
    assert head_rows.lines_up({"structure": {"z": 99.0}}) is False  # no row test (another width): never lines up
    assert head_rows.agrees({"structure": {"z": head_rows.STRUCTURE_Z}}) is True
    assert head_rows.agrees({"structure": {"z": head_rows.STRUCTURE_Z - 0.1}}) is False


def test_the_structure_of_rows_against_themselves_correlates_fully():
    """r is the correlation of the n(n-1)/2 pairwise similarities (each pair once, none with itself): 1.0 for rows
    compared with themselves, well above the shuffled maps'."""
    rng = random.Random(3)
    rows = head_rows.unit_rows([[rng.uniform(-1, 1) for _ in range(16)] for _ in range(12)])
    found = head_rows.structure_test(rows, rows)
    assert found["pairs"] == 12 * 11 // 2 and found["r"] == 1.0
    assert found["null_sd"] > 0 and found["z"] == round((1.0 - found["null_mean"]) / found["null_sd"], 1) > 5


def test_the_columns_compared_are_spread_over_the_row():
    assert head_rows.spread(64) == list(range(64))  # a narrow row: every value
    wide = head_rows.spread(1024)
    assert len(wide) == head_rows.COLUMNS and wide == sorted(set(wide)) and wide[0] == 0 and wide[-1] < 1024
    assert head_rows.sample_ids(10) == list(range(10))
    ids = head_rows.sample_ids(1000)
    assert len(ids) == head_rows.SAMPLE and ids == sorted(set(ids)) and ids[-1] < 1000
