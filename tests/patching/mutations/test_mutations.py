"""The mutation suite: upstream-style changes of real releases (tests/mutations/*.yaml, format in README.md).

For each mutation: every patch's static status is the expected one, and apply-diffs on the mutated tree is safe
(refuses where any patch drifted, never applies anything but the change the check approves, reverses byte for
byte).  The session ends with the caught / false-alarm counts.
"""
from __future__ import annotations

import importlib.util
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from sglang_pcie.patching.engine import DRIFTED, ERROR, NOT_APPLICABLE, UPSTREAM
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.patching.diff_apply import ALREADY, REFUSE, REMOVE, apply_release_diffs
from sglang_pcie.patching.diffs import DiffError, diffs_for, touched_files
from sglang_pcie.patching.matrix import check_tree
from sglang_pcie.patching.verify import check_source
from sglang_pcie.patching.engine import all_patches, get_patch
from sglang_pcie.patching.releases import fetch_source

pytestmark = pytest.mark.slow  # upstream tracking over every release tree: CI runs it, the fast loop leaves it out

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent.parent
KINDS = ("drift", "harmless")
APPLY_OUTCOMES = ("refused", "applied", "already-applied")
MUTATION_KEYS = {"name", "release", "kind", "why", "edits", "expect", "detail", "apply"}
EVERY_PATCH = "every-patch"  # in expect / detail: every patch of the register (a patch named beside it overrides it)
EDIT_KINDS = ("replace", "regex", "insert_before", "insert_after", "append", "write", "delete", "move_to", "call")

_spec = importlib.util.spec_from_file_location("mutation_edits", HERE / "edits.py")
edits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(edits)


@dataclass(frozen=True)
class Mutation:
    name: str
    release: str
    kind: str
    why: str
    edits: tuple
    expect: dict = field(default_factory=dict)
    detail: dict = field(default_factory=dict)
    apply: str | None = None
    source: str = ""

    def __str__(self):
        return self.name


def for_every_patch(given: dict, patch_ids) -> dict:
    """``given`` (a mutation's expect or detail) with its ``every-patch`` key expanded to each patch id of the
    register, in the register's order; a patch named beside it keeps its own value."""
    every = {pid: given[EVERY_PATCH] for pid in patch_ids} if EVERY_PATCH in given else {}
    return {**every, **{pid: value for pid, value in given.items() if pid != EVERY_PATCH}}


def load_mutations() -> list[Mutation]:
    mutations, names = [], set()
    patch_ids = [patch.id for patch in all_patches()]
    # each patch's own cases in its test folder, and the shared machinery's here
    for path in [*sorted((TESTS / "patches").glob("*/mutations.yaml")), HERE / "shared.yaml"]:
        source = path.relative_to(TESTS).as_posix()
        for raw in yaml.safe_load(path.read_text(encoding="utf-8")) or []:
            where = f"{source}: {raw.get('name', raw)!r}"
            assert set(raw) <= MUTATION_KEYS, f"{where}: unknown keys {set(raw) - MUTATION_KEYS}"
            assert {"name", "release", "kind", "why", "edits"} <= set(raw), f"{where}: missing keys"
            assert isinstance(raw["release"], str), f"{where}: quote the release"
            assert raw["kind"] in KINDS, f"{where}: kind must be one of {KINDS}"
            assert raw["name"] not in names, f"{where}: duplicate name"
            assert set(raw.get("expect", {})) | set(raw.get("detail", {})) <= {*patch_ids, EVERY_PATCH}, \
                f"{where}: unknown patch id"
            assert raw.get("apply") in (None, *APPLY_OUTCOMES), f"{where}: apply must be one of {APPLY_OUTCOMES}"
            if raw["kind"] == "drift":
                assert raw.get("expect"), f"{where}: a drift mutation names the patch(es) that must notice it"
            for edit in raw["edits"]:
                kinds = [k for k in EDIT_KINDS if k in edit]
                assert len(kinds) == 1, f"{where}: each edit has exactly one of {EDIT_KINDS}: {edit}"
                assert "file" in edit or kinds == ["call"], f"{where}: edit without file: {edit}"
            names.add(raw["name"])
            mutations.append(Mutation(raw["name"], raw["release"], raw["kind"], " ".join(raw["why"].split()),
                                      tuple(raw["edits"]), for_every_patch(raw.get("expect", {}), patch_ids),
                                      for_every_patch(raw.get("detail", {}), patch_ids),
                                      raw.get("apply"), source))
    return mutations


MUTATIONS = load_mutations()


def apply_edit(root: Path, edit: dict) -> None:
    if "call" in edit:
        getattr(edits, edit["call"])(root, **edit.get("args", {}))
        return
    path = root / edit["file"]
    if "delete" in edit:
        assert path.is_file(), f"no {edit['file']} to delete"
        path.unlink()
        return
    if "move_to" in edit:
        assert path.is_file(), f"no {edit['file']} to move"
        (root / edit["move_to"]).parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, root / edit["move_to"])
        return
    if "write" in edit:
        edits.write_text(path, edit["write"])
        return
    text = path.read_text(encoding="utf-8")
    count = edit.get("count")
    if "replace" in edit:
        found = text.count(edit["replace"])
        assert found and (count is None or found == count), \
            f"{edit['file']}: {edit['replace']!r} occurs {found} times: the mutation no longer matches the release"
        text = text.replace(edit["replace"], edit["with"])
    elif "regex" in edit:
        text, found = re.subn(edit["regex"], edit["with"], text, flags=re.M)
        assert found and (count is None or found == count), \
            f"{edit['file']}: {edit['regex']!r} matched {found} times: the mutation no longer matches the release"
    elif "append" in edit:
        text += edit["append"]
    else:
        anchor = edit.get("insert_before", edit.get("insert_after"))
        at = text.find(anchor)
        assert at >= 0, f"{edit['file']}: no {anchor!r}: the mutation no longer matches the release"
        at += 0 if "insert_before" in edit else len(anchor)
        text = text[:at] + edit["text"] + text[at:]
    edits.write_text(path, text)


@pytest.fixture(scope="session")
def release_copy():
    """``release_copy(version, dest)``: a hard-linked copy of the pristine release at ``dest``."""
    from support.releases import release_copy as make

    return make


@pytest.fixture(scope="session")
def pristine():
    """Each release's rows (id, status, detail) on the pristine sources."""
    rows: dict[str, list[dict]] = {}

    def get(version: str) -> list[dict]:
        if version not in rows:
            rows[version] = check_tree(str(fetch_source(version)))[1]
        return rows[version]

    return get


TALLY: Counter = Counter()


def expected_rows(mutation: Mutation, pristine_rows: list[dict]) -> dict[str, str]:
    return {row["id"]: mutation.expect.get(row["id"], row["status"]) for row in pristine_rows}


@pytest.mark.parametrize("mutation", MUTATIONS, ids=str)
def test_mutation(mutation, pristine, release_copy, tmp_path):
    base_rows = pristine(mutation.release)
    root = release_copy(mutation.release, tmp_path / "tree")
    for edit in mutation.edits:
        apply_edit(root, edit)
    tree = SourceTree(root)
    got = {patch.id: {"id": patch.id, "status": result.status, "detail": result.detail}
           for patch in all_patches() for result in [check_source(patch, tree)]}
    expected = expected_rows(mutation, base_rows)
    if mutation.kind == "harmless":
        assert all(status == row["status"] for status, row in zip(expected.values(), base_rows)), \
            f"{mutation.name}: a harmless mutation expects a status other than the pristine release's"
    wrong = {pid: got[pid] for pid, status in expected.items() if got[pid]["status"] != status}
    wrong.update({pid: got[pid] for pid, text in mutation.detail.items() if text not in got[pid]["detail"]})
    TALLY[mutation.kind, "wrong" if wrong else "right"] += 1
    assert not wrong, f"{mutation.name} ({mutation.why}): expected {expected} {mutation.detail}, got {wrong}"
    for row in base_rows:  # patches the mutation does not name read exactly as on the pristine release
        if row["id"] not in mutation.expect:
            assert got[row["id"]] == row, f"{mutation.name}: {row['id']} changed: {got[row['id']]} (was {row})"
    if mutation.kind == "drift":
        noticed = [pid for pid, row in zip(got, base_rows) if got[pid] != row]
        assert noticed, f"{mutation.name}: no patch's status or detail changed"

    for pid, status in mutation.expect.items():  # what the patch would write here is valid, marked Python
        if status == "applicable":
            for module, text in get_patch(pid).rewrite(tree).items():
                compile(text, module, "exec", dont_inherit=True)
                assert f"sglang-pcie: {pid}" in text, (mutation.name, module)

    outcome = check_apply_diffs(mutation, tree, got)
    TALLY["apply", f"{mutation.kind} {outcome}"] += 1


def composed(pristine: str, rewrites: list[str]) -> str:
    """What several patches' rewrites of one file make together, applied in order: each rewrite only inserts
    lines (SourceEdits), so the result is the pristine file with every rewrite's insertions at their places (at one
    place, in the patches' order)."""
    import difflib

    if len(rewrites) == 1:
        return rewrites[0]
    old = pristine.splitlines(keepends=True)
    inserted: dict[int, list[str]] = {}
    for text in rewrites:
        new = text.splitlines(keepends=True)
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
            assert tag in ("equal", "insert"), f"a rewrite that does more than insert lines ({tag} at {i1})"
            if tag == "insert":
                inserted.setdefault(i1, []).extend(new[j1:j2])
    return "".join(line for i in range(len(old) + 1) for line in inserted.get(i, []) + old[i:i + 1])


def snapshot(root: Path, folders: set[Path]) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for folder in folders if folder.is_dir()
            for p in sorted(folder.iterdir()) if p.is_file()}


def check_apply_diffs(mutation: Mutation, tree: SourceTree, rows: dict[str, dict]) -> str:
    """apply-diffs on the mutated tree is safe: refuses where it must (nothing changed), otherwise applies exactly
    what each patch's rewrite() makes of this tree (the dry run first, announcing the same), says "already applied"
    the second time and reverses byte for byte. Returns the outcome: refused, applied, already-applied, no-diffs.

    (The static checks are the expensive part, so a refusal is checked with the real run alone; test_cli checks
    that the dry run refuses alike.)"""
    root = tree.root
    try:
        diffs = {p.stem: p for p in diffs_for(mutation.release)}
    except DiffError:
        diffs = {}
    folders = {(root / rel).parent for d in diffs.values() for rel in touched_files(d)}
    before = snapshot(root, folders)
    must_refuse = [pid for pid, row in rows.items() if row["status"] in (DRIFTED, ERROR)
                   or (row["status"] in (UPSTREAM, NOT_APPLICABLE) and pid in diffs)]
    try:  # the tree the statuses were read from (its checks are not run twice)
        run = apply_release_diffs(tree, dry_run=not must_refuse)
    except DiffError as exc:  # a release with no diffs (e.g. a version outside the covered range)
        assert "no diffs for sglang" in str(exc), exc
        assert snapshot(root, folders) == before
        return _expect(mutation, "no-diffs")
    assert snapshot(root, folders) == before, f"{mutation.name}: files changed by a refusal or a dry run"
    refused = [s for s in run.steps if s.action == REFUSE]
    for pid in must_refuse:
        assert any(s.patch_id == pid for s in refused), f"{mutation.name}: {pid} is {rows[pid]['status']} and " \
                                                         "apply-diffs did not refuse it"
    assert all(s.status == rows[s.patch_id]["status"] for s in run.steps)  # the statuses verify-patches shows
    if refused:
        return _expect(mutation, "refused")
    if not run.changing:
        return _expect(mutation, "already-applied")

    announced = [(s.patch_id, s.action) for s in run.steps]
    wanted = {s.patch_id: get_patch(s.patch_id).rewrite(tree) for s in run.changing}
    run = apply_release_diffs(tree)  # the dry run wrote nothing: the same tree, its checks already made
    assert [(s.patch_id, s.action) for s in run.steps] == announced, f"{mutation.name}: the dry run said otherwise"
    after = snapshot(root, folders)
    per_file: dict[str, list[tuple[str, str]]] = {}  # rel -> [(patch id, its rewrite)] in apply order
    for step in run.changing:
        for module, text in wanted[step.patch_id].items():
            per_file.setdefault(SourceTree(root).path(module).relative_to(root).as_posix(), []).append(
                (step.patch_id, text))
    expected_changed = set(per_file)
    for rel, rewrites in per_file.items():  # exactly the approved change: nothing inserted twice, nothing else
        expected = composed(before[rel].decode("utf-8"), [text for _, text in rewrites])
        owners = " + ".join(pid for pid, _ in rewrites)
        assert after[rel].decode("utf-8") == expected, f"{mutation.name}: {rel} is not {owners}'s rewrite"
    assert {rel for rel in after if after[rel] != before.get(rel)} == expected_changed, mutation.name
    assert set(after) == set(before), f"{mutation.name}: files appeared or vanished"
    again = apply_release_diffs(SourceTree(root))  # also what verify-patches now says of each patch
    assert not again.refused and not again.changing and snapshot(root, folders) == after
    for step in again.steps:
        applied_now = step.patch_id in wanted
        assert (step.action == ALREADY) if applied_now else (step.status == rows[step.patch_id]["status"]), step
    back = apply_release_diffs(SourceTree(root), reverse=True)
    assert not back.refused, [s.line() for s in back.refused]
    assert sorted(s.patch_id for s in back.steps if s.action == REMOVE) == sorted(wanted)
    assert snapshot(root, folders) == before, f"{mutation.name}: --reverse did not restore the tree byte for byte"
    return _expect(mutation, "applied")


def _expect(mutation: Mutation, outcome: str) -> str:
    if mutation.apply:
        assert outcome == mutation.apply, f"{mutation.name}: apply-diffs {outcome}, expected {mutation.apply}"
    return outcome


def test_the_suite_is_big_enough(capsys):
    kinds = Counter(m.kind for m in MUTATIONS)
    releases = sorted({m.release for m in MUTATIONS})
    assert len(MUTATIONS) == len({m.name for m in MUTATIONS})
    assert kinds["drift"] >= 40 and kinds["harmless"] >= 10 and len(releases) >= 3, (kinds, releases)


def test_zz_report_counts(capsys):
    """Runs last (pytest keeps file order): the caught / false-alarm counts of this session's run, which must be
    whole: every mutation that ran was judged right and went through its apply-diffs check, and where the whole
    suite ran, every drift was caught and no harmless change raised an alarm."""
    kinds = Counter(m.kind for m in MUTATIONS)
    judged = {kind: TALLY[kind, "right"] + TALLY[kind, "wrong"] for kind in KINDS}
    if not sum(judged.values()):
        pytest.skip("no mutation ran in this session: nothing to report")
    applied = sum(count for (area, _), count in TALLY.items() if area == "apply")
    assert TALLY["drift", "wrong"] == 0 and TALLY["harmless", "wrong"] == 0, TALLY
    assert applied == sum(judged.values()), f"{applied} apply-diffs checks for {sum(judged.values())} mutations"
    if judged == {kind: kinds[kind] for kind in KINDS}:
        assert TALLY["drift", "right"] == kinds["drift"] and TALLY["harmless", "right"] == kinds["harmless"]
    with capsys.disabled():
        print(f"\nmutation suite: drift caught {TALLY['drift', 'right']}/{judged['drift']}, harmless false alarms "
              f"{TALLY['harmless', 'wrong']}/{judged['harmless']} (of {kinds['drift']} and {kinds['harmless']} in "
              "the suite); apply-diffs: "
              + ", ".join(f"{k} {v}" for (area, k), v in sorted(TALLY.items()) if area == "apply"))
