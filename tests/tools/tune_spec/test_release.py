"""What tune-spec reads of a release's adaptive steps, on the pristine sources of real releases across every boundary
(none up to 0.5.10.post1; one global EMA on 0.5.11-0.5.12.post1, 0.5.11 only without the overlap scheduler; the
table by batch size from 0.5.13; step 0 from 0.5.14; the option declared in arg_groups' fields from 0.5.20), each
fact checked against what that source itself says: its declaration, its DEFAULT_ADAPTIVE_CONFIG, and its own
config loader run on a table holding step 0."""
from __future__ import annotations

import ast
import json

import pytest

from sglang_pcie.tools.tune_spec.release import NO_TREE, NOT_READ, AdaptiveFacts, adaptive_facts

PARAMS_FILE = "sglang/srt/speculative/adaptive_spec_params.py"
SERVER_ARGS = "sglang.srt.server_args.ServerArgs"
SPEC_FIELDS = "sglang.srt.arg_groups.fields.spec.Spec"
TABLE_0_5_13 = {1: [1, 3, 7], 8: [1, 3], 32: [1]}
TABLE_0_5_14 = {1: [1, 3, 7], 8: [0, 1, 3], 32: [0, 1], 64: [0]}
TABLE_0_5_20 = {1: [1, 3, 5, 7], 8: [0, 1, 3], 32: [0, 1], 64: [0]}

# version -> (available, declared_in, per_batch, zero_steps, needs_no_overlap, default_table)
EXPECTED = {
    "0.5.8": (False, None, False, False, False, {}),
    "0.5.10.post1": (False, None, False, False, False, {}),
    "0.5.11": (True, SERVER_ARGS, False, False, True, {}),
    "0.5.12": (True, SERVER_ARGS, False, False, False, {}),
    "0.5.12.post1": (True, SERVER_ARGS, False, False, False, {}),
    "0.5.13": (True, SERVER_ARGS, True, False, False, TABLE_0_5_13),
    "0.5.13.post1": (True, SERVER_ARGS, True, False, False, TABLE_0_5_13),
    "0.5.14": (True, SERVER_ARGS, True, True, False, TABLE_0_5_14),
    "0.5.16": (True, SERVER_ARGS, True, True, False, TABLE_0_5_14),
    "0.5.19": (True, SERVER_ARGS, True, True, False, TABLE_0_5_14),
    "0.5.20": (True, SPEC_FIELDS, True, True, False, TABLE_0_5_20),
    "0.5.23": (True, SPEC_FIELDS, True, True, False, TABLE_0_5_20),
}


def release_params(root):
    """The release's own DEFAULT_ADAPTIVE_CONFIG and _load_adaptive_config (None where it has none), executed from
    its source with nothing else of SGLang imported."""
    path = root / PARAMS_FILE
    if not path.is_file():
        return None, None
    module = ast.parse(path.read_text())
    keep = [node for node in module.body
            if isinstance(node, ast.FunctionDef) and node.name == "_load_adaptive_config"
            or isinstance(node, (ast.Assign, ast.AnnAssign)) and "DEFAULT_ADAPTIVE_CONFIG" in ast.unparse(node)]
    space = {"json": json}
    exec(compile(ast.Module(keep, []), str(path), "exec"), space)  # noqa: S102 (a pristine release's own code)
    return space.get("DEFAULT_ADAPTIVE_CONFIG"), space.get("_load_adaptive_config")


@pytest.mark.parametrize("version", sorted(EXPECTED))
def test_facts_of_each_release_are_what_its_source_says(pristine_source, tmp_path, version):
    root = pristine_source(version)
    facts = adaptive_facts(root)
    got = (facts.available, facts.declared_in, facts.per_batch, facts.zero_steps, facts.needs_no_overlap,
           facts.default_table)
    assert got == EXPECTED[version] and facts.version == version
    # the declaration, as the source has it
    server_args = (root / "sglang/srt/server_args.py").read_text()
    fields = root / "sglang/srt/arg_groups/fields/spec.py"
    in_server_args = "\n    speculative_adaptive: " in server_args
    in_fields = fields.is_file() and "\n    speculative_adaptive: " in fields.read_text()
    assert facts.declared_in == (SERVER_ARGS if in_server_args else SPEC_FIELDS if in_fields else None)
    # the table, as the release's own dict holds it
    default, load = release_params(root)
    if facts.per_batch:
        assert facts.default_table == {int(k): v["candidate_steps"] for k, v in default.items()}
        # each bucket whole (its hysteresis too), so that a tuned table copying it runs it as measured
        assert facts.default_config == {int(k): v for k, v in default.items()}
        # step 0: what the release's own loader does with a bucket holding it
        table = tmp_path / "zero.json"
        table.write_text(json.dumps({"1": {"candidate_steps": [0, 3]}}))
        try:
            load(str(table))
            takes_zero = True
        except ValueError:
            takes_zero = False
        assert facts.zero_steps == takes_zero
    else:
        assert default is None


def test_the_overlap_scheduler_check_is_read_from_the_reason_function(pristine_source):
    """0.5.11's adaptive_unsupported_reason refuses the overlap scheduler; 0.5.12's no longer does."""
    for version, refuses in (("0.5.11", True), ("0.5.12", False)):
        text = (pristine_source(version) / PARAMS_FILE).read_text()
        reason = text[text.index("def adaptive_unsupported_reason"):]
        reason = reason[:reason.index("\ndef ")]
        assert ("not server_args.disable_overlap_schedule" in reason) == refuses
        assert adaptive_facts(pristine_source(version)).needs_no_overlap == refuses


def test_no_tree_or_a_folder_that_is_none_is_not_read(tmp_path):
    assert adaptive_facts(None) is NO_TREE
    assert adaptive_facts(tmp_path) is NO_TREE
    assert NO_TREE == AdaptiveFacts(False, version=NOT_READ)


def test_describe_says_each_kind_in_one_line():
    assert NO_TREE.describe() == ("no SGLang source was read (no sglang for this python, or another --server-cmd, or"
                                  " --no-adaptive): adaptive steps are left out")
    assert AdaptiveFacts(False, version="0.5.9").describe() == "SGLang 0.5.9 has no adaptive speculative steps"
    assert AdaptiveFacts(True, SERVER_ARGS, needs_no_overlap=True, version="0.5.11").describe() == (
        "SGLang 0.5.11 has adaptive steps without a table by batch size (one EMA for all batches, and only with"
        " --disable-overlap-schedule)")
    assert AdaptiveFacts(True, SERVER_ARGS, version="0.5.12").describe() == (
        "SGLang 0.5.12 has adaptive steps without a table by batch size (one EMA for all batches)")
    assert AdaptiveFacts(True, SERVER_ARGS, per_batch=True, default_table={8: [1, 3], 1: [1, 3, 7]},
                         version="0.5.13").describe() == (
        "SGLang 0.5.13 runs adaptive steps from a table by batch size (declared in sglang.srt.server_args.ServerArgs;"
        " its default {1: [1, 3, 7], 8: [1, 3]}; step 0 refused)")
    assert AdaptiveFacts(True, SPEC_FIELDS, per_batch=True, zero_steps=True, default_table={64: [0]},
                         version="0.5.20").describe().endswith("its default {64: [0]}; step 0 allowed)")


def test_facts_round_trip_through_json_with_integer_buckets():
    facts = AdaptiveFacts(True, SPEC_FIELDS, per_batch=True, zero_steps=True, default_table=TABLE_0_5_20,
                          default_config={1: {"candidate_steps": [1, 3, 5, 7], "down_hysteresis": -0.25}},
                          needs_no_overlap=False, version="0.5.20")
    stored = json.loads(json.dumps(facts.as_dict()))
    assert stored["default_table"] == {"1": [1, 3, 5, 7], "8": [0, 1, 3], "32": [0, 1], "64": [0]}
    assert AdaptiveFacts.from_dict(stored) == facts
    assert AdaptiveFacts.from_dict(dict(stored, unknown=1)) == facts  # a later schema's extra key is ignored
    assert AdaptiveFacts.from_dict(None) == AdaptiveFacts(False)
    assert AdaptiveFacts.from_dict({}) == AdaptiveFacts(False)


def tree(root, params: str):
    """A stand-in sglang tree: ServerArgs declaring the option, and ``params`` as adaptive_spec_params.py."""
    files = {"sglang/__init__.py": "", "sglang/version.py": '__version__ = "9.9.9"\n',
             "sglang/srt/server_args.py": "class ServerArgs:\n    speculative_adaptive: bool = False\n",
             PARAMS_FILE: params}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


LOADER = """
def _load_adaptive_config(cfg_path):
    for key, entry in cfg.items():
        if not all(isinstance(s, int) and s >= 0 for s in entry["candidate_steps"]):
            raise ValueError(key)
"""


def test_the_table_is_the_last_assignment_that_runs_without_its_non_bucket_keys(tmp_path):
    params = ('DEFAULT_ADAPTIVE_CONFIG = {"1": {"candidate_steps": [2]}}\n'
              'DEFAULT_ADAPTIVE_CONFIG = {"4": {"candidate_steps": [0, 5]}, "16": {"candidate_steps": [1]},'
              ' "default": {"candidate_steps": [9]}}\n' + LOADER)
    facts = adaptive_facts(tree(tmp_path, params))
    assert facts == AdaptiveFacts(True, SERVER_ARGS, per_batch=True, zero_steps=True,
                                  default_table={4: [0, 5], 16: [1]},
                                  default_config={4: {"candidate_steps": [0, 5]}, 16: {"candidate_steps": [1]}},
                                  version="9.9.9")


def test_a_table_that_is_no_literal_is_no_table(tmp_path):
    facts = adaptive_facts(tree(tmp_path, "DEFAULT_ADAPTIVE_CONFIG = dict(steps=[1, 3])\n" + LOADER))
    assert (facts.available, facts.per_batch, facts.zero_steps, facts.default_table) == (True, False, False, {})
