"""sglang-pcie verify-patches on pristine and edited release sources: the report, its statuses and exit codes,
the metadata listing."""
from __future__ import annotations

import json

import pytest

from sglang_pcie.patching.diffs import diffs_for, touched_files
from sglang_pcie.patching.engine import STATUSES
from support.cli import run_cli
from support.releases import release_copy, replace_text

from support import PATCH_IDS, REPO


@pytest.fixture
def copy_of(pristine_source, tmp_path):
    """A writable copy of the whole release, and the files the diffs of ``version`` touch."""
    def make(version):
        target = release_copy(version, tmp_path / version)
        files = sorted({rel for diff in diffs_for(version) for rel in touched_files(diff)})
        return pristine_source(version), target, files
    return make


def snapshot(root, version):
    """Every file (with its bytes) in the folders apply-diffs may write to (those of the files its diffs touch):
    what "nothing changed" and "restored byte for byte" compare, stray files included."""
    folders = {(root / rel).parent for diff in diffs_for(version) for rel in touched_files(diff)}
    return {p.relative_to(root).as_posix(): p.read_bytes() for folder in folders for p in sorted(folder.iterdir())
            if p.is_file()}




@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_static_json_report(capsys, pristine_source, version):
    code, out, _ = run_cli(capsys, "verify-patches", "--sglang-source", str(pristine_source(version)), "--json")
    report = json.loads(out)
    assert code == 0
    assert set(report) == {"sglang_version", "mode", "source", "patches", "nccl", "allreduce"}
    assert (report["sglang_version"], report["mode"]) == (version, "static")
    assert [row["id"] for row in report["patches"]] == PATCH_IDS
    assert all(row["status"] in STATUSES and row["detail"] for row in report["patches"])
    # eagle3-profile is opt-in: switched off, its fit is still checked and named.
    eagle = report["patches"][1]
    assert eagle["status"] == "disabled" and "applicable" in eagle["detail"]
    assert {"requested", "profile", "values", "user_set", "reason"} <= set(report["nccl"])


def test_sglang_version_fetches_the_release(capsys):
    code, out, _ = run_cli(capsys, "verify-patches", "--sglang-version", "0.5.21", "--json")
    assert code == 0 and json.loads(out)["sglang_version"] == "0.5.21"


def test_a_release_older_than_the_covered_range_is_not_applicable(capsys):
    """Issue 10: `verify-patches --sglang-version 0.5.7` must not say applicable; every row names the range."""
    code, out, _ = run_cli(capsys, "verify-patches", "--sglang-version", "0.5.7", "--json")
    rows = json.loads(out)["patches"]
    assert code == 0 and [row["id"] for row in rows] == PATCH_IDS
    assert all(row["status"] in ("not-applicable", "disabled") for row in rows), rows
    assert all("sglang 0.5.7 is older than the releases this patch covers (0.5.8 to 0.5.23)" in row["detail"]
               for row in rows), rows


def test_human_table_names_each_patch_and_the_nccl_profile(capsys, pristine_source):
    code, out, _ = run_cli(capsys, "verify-patches", "--sglang-source", str(pristine_source("0.5.9")))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("sglang 0.5.9 (static")
    assert [line.split()[0] for line in lines[2:2 + len(PATCH_IDS)]] == PATCH_IDS
    assert any(line.startswith("NCCL profile:") for line in lines) and "a server started now uses:" in lines[-1]


def test_user_disabled_patch_is_reported_disabled(capsys, pristine_source, monkeypatch):
    monkeypatch.setenv("SGLANG_PCIE_DISABLE_PATCHES", "drafter-delegation")
    _, out, _ = run_cli(capsys, "verify-patches", "--sglang-source", str(pristine_source("0.5.9")), "--json")
    rows = {row["id"]: row for row in json.loads(out)["patches"]}
    assert rows["drafter-delegation"]["status"] == "disabled"
    assert rows["drafter-delegation"]["detail"].startswith("listed in SGLANG_PCIE_DISABLE_PATCHES")
    # sm120-allreduce-fusion is opt-in: disabled until SGLANG_PCIE_SM120_FUSION=1, its fit still checked.
    assert rows["sm120-allreduce-fusion"] == {"id": "sm120-allreduce-fusion", "status": "disabled",
                                              "detail": "opt-in: set SGLANG_PCIE_SM120_FUSION=1 (source check: "
                                                        "applicable)"}


@pytest.mark.parametrize("name, value", [("SGLANG_PCIE_NCCL_PROFILE", "fastest"), ("EAGLE3_PROFILE", "yes please")])
def test_bad_setting_exits_2_naming_it(capsys, pristine_source, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    code, _, err = run_cli(capsys, "verify-patches", "--sglang-source", str(pristine_source("0.5.9")))
    assert code == 2 and name in err and repr(value) in err


def test_both_sources_is_a_usage_error(capsys):
    code, _, err = run_cli(capsys, "verify-patches", "--sglang-source", "x", "--sglang-version", "0.5.9")
    assert code == 2 and "not allowed with argument" in err


def test_drift_exits_1(capsys, copy_of):
    _, target, _ = copy_of("0.5.9")
    replace_text(target / "sglang/srt/layers/communicator.py", "def apply_flashinfer_allreduce_fusion(",
                 "def fusion_gate(")
    code, out, _ = run_cli(capsys, "verify-patches", "--sglang-source", str(target), "--json")
    rows = {row["id"]: row["status"] for row in json.loads(out)["patches"]}
    assert code == 1 and rows["sm120-allreduce-fusion"] == "drifted"


def test_metadata_lists_every_field(capsys):
    code, out, _ = run_cli(capsys, "verify-patches", "--metadata", "--json")
    meta = json.loads(out)
    assert code == 0 and [m["id"] for m in meta] == PATCH_IDS
    for item in meta:
        for key in ("summary", "why", "upstream", "remove_when", "releases", "upstream_check", "runtime_method",
                    "static_method", "targets"):
            assert item[key], (item["id"], key)




def test_a_long_list_in_a_detail_is_folded_and_the_json_keeps_it_whole(capsys, pristine_source):
    code, out, _ = run_cli(capsys, "verify-patches", "--sglang-source", str(pristine_source("0.5.23")))
    row = next(line for line in out.splitlines() if line.startswith("drafter-delegation"))
    assert len(row) < 500 and "and 21 more (--json lists them all)" in row
    code, out, _ = run_cli(capsys, "verify-patches", "--sglang-source", str(pristine_source("0.5.23")), "--json")
    detail = next(r["detail"] for r in json.loads(out)["patches"] if r["id"] == "drafter-delegation")
    assert detail.count(" (.") == 25


@pytest.mark.parametrize("option", ["--sglang-version", "--sglang-source"])
def test_an_empty_value_is_named_not_read_as_absent(capsys, option):
    code, _, err = run_cli(capsys, "verify-patches", option, "")
    assert code == 2 and "no sglang installed here" not in err
    assert err.startswith("sglang-pcie: error: ") and "''" in err


@pytest.mark.parametrize("how", ["version", "source"])
def test_a_release_checked_from_elsewhere_is_told_apart_from_this_machines_figures(capsys, pristine_source, how):
    """The GPUs, links and FlashInfer are this machine's; the SGLang is the release checked: the report says which
    figure comes from where, not one install's."""
    where = ["--sglang-version", "0.5.23"] if how == "version" else ["--sglang-source", str(pristine_source("0.5.23"))]
    code, out, _ = run_cli(capsys, "verify-patches", *where)
    head = next(line for line in out.splitlines() if line.startswith("All-reduce paths"))
    assert head.startswith("All-reduce paths (this machine: ") and "FlashInfer " in head.split("SGLang")[0], head
    assert head.endswith(f"SGLang 0.5.23 from {pristine_source('0.5.23')}, the release checked, not this "
                         "machine's install):"), head
    assert json.loads(run_cli(capsys, "verify-patches", *where, "--json")[1])["allreduce"]["sglang_from"] == str(
        pristine_source("0.5.23"))


def test_no_sglang_to_check_is_exit_2_as_its_help_says(capsys, monkeypatch):
    from sglang_pcie.tools import verify_patches

    monkeypatch.setattr(verify_patches, "installed_sglang_root", lambda: None)
    code, _, err = run_cli(capsys, "verify-patches")
    assert code == 2 and err.strip().endswith("no sglang installed here; use --sglang-source DIR or --sglang-version X")
    assert "2 for bad usage or settings, or no SGLang to check" in verify_patches.EPILOG


def test_an_id_that_is_no_patch_exits_2_and_every_patch_is_reported_off(capsys, pristine_source, monkeypatch):
    """README's settings table: a SGLANG_PCIE_DISABLE_PATCHES naming an id that is no patch switches every patch off
    (one line listing the ids that exist) and verify-patches exits 2; the report shows what a server would do."""
    from sglang_pcie.runtime.patch_table import UNKNOWN_ID_REASON

    monkeypatch.setenv("SGLANG_PCIE_DISABLE_PATCHES", "drafter-delegation,drafter-delgation")
    code, out, err = run_cli(capsys, "verify-patches", "--sglang-source", str(pristine_source("0.5.9")), "--json")
    assert code == 2 and err.splitlines() == [
        "sglang-pcie: error: SGLANG_PCIE_DISABLE_PATCHES='drafter-delegation,drafter-delgation' names no patch "
        f"'drafter-delgation' (patch ids: {', '.join(PATCH_IDS)}); every patch is off until it names only patch ids"]
    rows = json.loads(out)["patches"]
    assert [row["status"] for row in rows] == ["disabled"] * len(PATCH_IDS)
    assert all(row["detail"].startswith(f"{UNKNOWN_ID_REASON} (source check: ") for row in rows), rows
    _, help_text, _ = run_cli(capsys, "verify-patches", "--help")
    assert ("a SGLANG_PCIE_DISABLE_PATCHES that names an id that is no patch switches every patch off, and exits 2"
            in " ".join(help_text.split()))
    readme = " ".join((REPO / "README.md").read_text().split())
    assert ("A list naming an id that is no patch switches every patch off (one warning listing the ids that exist;"
            " verify-patches and env exit 2): it is never half-applied") in readme


# ------------------------------------------------------------------------------------------------------------
# The table's lines, the runtime mode's own paths, the metadata listing and the exit status, each pinned


def test_fold_keeps_four_items_and_counts_the_rest_only_past_five():
    from sglang_pcie.tools.verify_patches import fold

    five = "found: a (.x), b (.y), c, d, e"
    assert fold(five) == five  # one more than kept: shown whole, no "1 more"
    assert fold(five + ", f") == "found: a (.x), b (.y), c, d and 2 more (--json lists them all)"
    assert fold("no list here") == "no list here" and fold("a: b, c", keep=1) == "a: b, c"


def test_the_table_lines_up_its_columns_and_says_what_nccl_gets_and_keeps():
    from sglang_pcie.tools.verify_patches import format_table

    report = {"sglang_version": "0.5.23", "mode": "static", "source": "/src",
              "patches": [{"id": "abc", "status": "applied", "detail": "fine"},
                          {"id": "a-longer-id", "status": "not-applicable", "detail": "old"}],
              "nccl": {"profile": "pcie", "reason": "asked", "values": {"NCCL_ALGO": "Ring", "NCCL_BUFFSIZE": "131072"},
                       "user_set": {"NCCL_PROTO": "Simple"}}}
    assert format_table(report).splitlines() == [
        "sglang 0.5.23 (static: /src)",
        "PATCH        STATUS          DETAIL",
        "abc          applied         fine",
        "a-longer-id  not-applicable  old",
        "NCCL profile: pcie (asked); NCCL_ALGO=Ring NCCL_BUFFSIZE=131072",
        "  kept as the user set them: NCCL_PROTO=Simple"]
    report.update(patches=[{"id": "ab", "status": "error", "detail": "x"}], nccl={"profile": "none", "reason": "off"})
    assert format_table(report).splitlines()[1:] == ["PATCH  STATUS          DETAIL", "ab     error           x",
                                                     "NCCL profile: none (off); nothing set"]


def test_the_variables_table_goes_after_the_nccl_profile_and_before_the_all_reduce_paths(monkeypatch):
    from sglang_pcie.tools import allreduce_report
    from sglang_pcie.tools.verify_patches import format_table

    monkeypatch.setattr(allreduce_report, "format_report", lambda paths: ["All-reduce paths", "  a server ..."])
    monkeypatch.setattr("sglang_pcie.tools.verify_patches.format_report", allreduce_report.format_report)
    report = {"sglang_version": "0.5.23", "mode": "static", "source": "/src",
              "patches": [{"id": "ab", "status": "error", "detail": "x"}], "nccl": {"profile": "none", "reason": "off"},
              "allreduce": {"paths": []}}
    assert format_table(report, ["Variables", "  ROW"]).splitlines()[3:] == [
        "NCCL profile: none (off); nothing set", "Variables", "  ROW", "All-reduce paths", "  a server ..."]


@pytest.mark.parametrize("statuses, code", [(["applied", "applicable", "upstream", "not-applicable", "disabled"], 0),
                                            (["applied", "drifted"], 1), (["error"], 1)])
def test_the_exit_status_is_1_exactly_when_a_patch_is_drifted_or_error(statuses, code):
    from sglang_pcie.tools.verify_patches import exit_code

    assert exit_code({"patches": [{"status": s} for s in statuses]}) == code


def test_runtime_with_the_overlay_off_reports_every_patch_disabled_without_importing(capsys, pristine_source,
                                                                                    monkeypatch):
    from sglang_pcie.patching import verify

    monkeypatch.setenv("SGLANG_PCIE_DISABLE", "1")
    monkeypatch.setattr(verify, "runtime_results", lambda *a: pytest.fail("imported SGLang"))
    code, out, _ = run_cli(capsys, "verify-patches", "--runtime", "--sglang-source", str(pristine_source("0.5.9")),
                           "--json")
    report = json.loads(out)
    assert code == 0 and report["mode"] == "runtime" and report["sglang_version"] == "0.5.9"
    assert report["patches"] == [{"id": p, "status": "disabled", "detail": "SGLANG_PCIE_DISABLE is set"}
                                 for p in PATCH_IDS]


def test_runtime_that_cannot_check_is_one_line_and_exit_1(capsys, pristine_source, monkeypatch):
    from sglang_pcie.patching import verify

    seen = []

    def failing(root):
        seen.append(root)
        raise RuntimeError("the child python exited 1: ImportError")
    monkeypatch.setattr(verify, "runtime_results", failing)
    source = str(pristine_source("0.5.9"))
    code, out, err = run_cli(capsys, "verify-patches", "--runtime", "--sglang-source", source)
    assert (code, out, err) == (1, "", "sglang-pcie: the child python exited 1: ImportError\n")
    assert seen == [source]  # the folder given is the one checked


def test_runtime_rows_are_reported_as_the_child_found_them(capsys, pristine_source, monkeypatch):
    from sglang_pcie.patching import verify

    rows = [{"id": p, "status": "applied", "detail": "in effect"} for p in PATCH_IDS]
    monkeypatch.setattr(verify, "runtime_results", lambda root: ("0.5.9", rows))
    code, out, _ = run_cli(capsys, "verify-patches", "--runtime", "--sglang-source", str(pristine_source("0.5.9")),
                           "--json")
    assert code == 0 and json.loads(out)["patches"] == rows and json.loads(out)["mode"] == "runtime"
    rows[0]["status"] = "drifted"
    assert run_cli(capsys, "verify-patches", "--runtime", "--sglang-source", str(pristine_source("0.5.9")))[0] == 1


def test_metadata_as_text_lists_each_patch_and_its_fields_but_the_refs(capsys):
    code, out, _ = run_cli(capsys, "verify-patches", "--metadata")
    lines = out.splitlines()
    heads = [line for line in lines if not line.startswith("  ")]
    assert code == 0 and [h.split(":")[0] for h in heads] == PATCH_IDS
    assert all(line.split(":")[0].strip() not in ("id", "summary", "upstream_refs") for line in lines
               if line.startswith("  "))
    assert any(line.startswith("  why: ") for line in lines)
