"""The known-bad NCCL releases (tools/doctor/nccl_releases.py): every row complete, real matching on the rows
(one release, a range, GPU names), what doctor says for a match through host.versions and through the whole command
on a recorded box, and docs/doctor.md's table being what the rows render."""
from __future__ import annotations

import json
import re
import shutil

import pytest
from support import REPO, SUPPORT

from sglang_pcie.tools import cli
from sglang_pcie.tools.doctor import host, nccl_releases
from sglang_pcie.tools.doctor.gpu_facts import Gpu, GpuFacts
from sglang_pcie.tools.doctor.nccl_releases import KNOWN_BAD, KnownBad, Release, Releases, match, parse

WORKSTATION = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
SERVER = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
NCCL_2418 = next(row for row in KNOWN_BAD if row.source == "https://github.com/NVIDIA/nccl/issues/2418")


def gpus(*names: str) -> GpuFacts:
    listed = [Gpu(i, name, f"GPU-{i}", f"0000:{i + 1:02x}:00.0") for i, name in enumerate(names)]
    return GpuFacts(gpus=listed, visible=list(range(len(listed))), chosen=list(range(len(listed))))


def test_every_row_carries_its_source_releases_gpus_and_a_way_out():
    assert KNOWN_BAD
    for row in KNOWN_BAD:
        assert row.source.startswith("https://") and row.name and re.fullmatch(r"\d{4}-\d\d-\d\d", row.checked), row
        assert isinstance(row.releases.first, Release) and row.releases.first <= row.releases.last, row
        assert row.gpus and all(g.startswith("NVIDIA ") and g == " ".join(g.split()) for g in row.gpus), row
        assert row.symptom and row.reported and row.fix, row
        assert row.fixed_in or row.avoid_with, row
        assert row.fixed_in is None or row.fixed_in not in row.releases, row  # the way out is not itself bad
    assert len({row.source for row in KNOWN_BAD}) == len(KNOWN_BAD)


def test_the_2418_row_says_what_the_report_says():
    assert str(NCCL_2418.releases) == "2.26.2" and NCCL_2418.gpus == (WORKSTATION,)
    assert NCCL_2418.fixed_in == Release(2, 31, 2) and not NCCL_2418.avoid_with
    assert "512 KiB" in NCCL_2418.symptom and "2.26.2+cuda12.2" in NCCL_2418.reported
    assert NCCL_2418.fix.startswith("install NCCL 2.31.2 (found working in NVIDIA/nccl #2418)")
    assert "pip install nvidia-nccl-cu12==2.31.2" in NCCL_2418.fix


@pytest.mark.parametrize("text, release", [
    ("2.26.2", Release(2, 26, 2)),  # torch.cuda.nccl.version() as the copy check reports it
    ("nvidia-nccl-cu12==2.26.2", Release(2, 26, 2)),  # installed_nccl()
    (" nvidia-nccl-cu13==2.31.2 ", Release(2, 31, 2)),
    ("2.26.2+cuda12.2", Release(2, 26, 2)),  # NCCL's build tag: the same release
    ("2.26.2-1+cuda12.8", Release(2, 26, 2)),  # NCCL's package revision
    ("nvidia-nccl-cu12==2.26.2.post1", Release(2, 26, 2, 1)),  # a rebuilt wheel: another release
    ("2708", None),  # an int from an old torch: not guessed at
    ("2.26", None), ("2.26.x", None), ("", None), ("nvidia-nccl-cu12==", None),
])
def test_parse_reads_both_of_doctors_forms_and_nothing_else(text, release):
    assert parse(text) == release


def test_one_release_matches_exactly_and_a_post_rebuild_is_another_release():
    assert [row for row, _ in match(Release(2, 26, 2), [WORKSTATION])] == [NCCL_2418]
    for other in (Release(2, 26, 1), Release(2, 26, 2, 1), Release(2, 26, 5), Release(2, 31, 2), Release(3, 26, 2)):
        assert NCCL_2418 not in [row for row, _ in match(other, [WORKSTATION])], other


def test_a_range_holds_its_ends_and_what_lies_between(monkeypatch):
    ranged = KnownBad(source="https://example.org/report", name="a range", checked="2026-12-05",
                      releases=Releases(Release(2, 27, 3), Release(2, 28, 9)), gpus=("NVIDIA GeForce RTX 4090",),
                      symptom="s", reported="r", avoid_with="NCCL_P2P_DISABLE=1")
    monkeypatch.setattr(nccl_releases, "KNOWN_BAD", (ranged,))
    assert str(ranged.releases) == "2.27.3 to 2.28.9" and ranged.fix == "serve with NCCL_P2P_DISABLE=1"
    inside = [Release(2, 27, 3), Release(2, 27, 7), Release(2, 28, 3), Release(2, 28, 9), Release(2, 27, 3, 1)]
    for release in inside:
        assert match(release, ["NVIDIA GeForce RTX 4090"]) == [(ranged, ["NVIDIA GeForce RTX 4090"])], release
    for release in (Release(2, 27, 2), Release(2, 28, 9, 1), Release(2, 29, 2), Release(1, 28, 3)):
        assert match(release, ["NVIDIA GeForce RTX 4090"]) == [], release


def test_gpus_match_by_their_exact_product_name():
    assert match(Release(2, 26, 2), [WORKSTATION, WORKSTATION]) == [(NCCL_2418, [WORKSTATION, WORKSTATION])]
    assert match(Release(2, 26, 2), ["nvidia rtx pro 6000  Blackwell Workstation Edition"])[0][1]  # case, spaces
    for other in (SERVER, "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "NVIDIA H200", "RTX PRO 6000"):
        assert match(Release(2, 26, 2), [other]) == [(NCCL_2418, [])], other
    assert match(Release(2, 26, 2), []) == [(NCCL_2418, [])]


def test_a_match_on_two_gpus_is_a_warning_with_the_way_out():
    (found,) = host.nccl_release("2.26.2", "torch in the copy check", gpus(WORKSTATION, WORKSTATION))
    assert (found.id, found.severity) == ("host.nccl-release", "warning")
    assert found.what.startswith(f"NCCL 2.26.2 is a release reported bad on {WORKSTATION} (GPU 0, 1): CUDA illegal "
                                 "memory access in collectives of 512 KiB and more")
    assert "NVIDIA/nccl #2418: one bare-metal workstation" in found.what
    assert found.fix == NCCL_2418.fix
    assert found.source == ("NVIDIA/nccl #2418 https://github.com/NVIDIA/nccl/issues/2418; NCCL from torch in the copy "
                            "check")


def test_one_gpu_other_gpus_no_nccl_and_a_version_not_understood():
    (alone,) = host.nccl_release("2.26.2", "torch in the copy check", gpus(WORKSTATION))
    assert alone.severity == "info" and alone.what.endswith("one GPU here, so no collective between GPUs")
    (elsewhere,) = host.nccl_release("nvidia-nccl-cu12==2.26.2", "nvidia-nccl-cu* dist-info", gpus(SERVER, SERVER))
    assert elsewhere.severity == "info"
    assert elsewhere.what.startswith(f"NCCL 2.26.2 is reported bad on {WORKSTATION}, not on these GPUs: ")
    assert host.nccl_release("nvidia-nccl-cu12==2.26.2", "nvidia-nccl-cu* dist-info", gpus()) == []  # no GPU
    assert host.nccl_release(None, "nvidia-nccl-cu* dist-info", gpus(WORKSTATION, WORKSTATION)) == []
    assert host.nccl_release("2.27.3", "torch in the copy check", gpus(WORKSTATION, WORKSTATION)) == []
    (odd,) = host.nccl_release("2708", "torch in the copy check", gpus(WORKSTATION, WORKSTATION))
    assert (odd.severity, odd.what) == ("not-visible", "NCCL version '2708' not understood: not compared with the "
                                                       "NCCL releases reported bad (docs/doctor.md)")


def test_each_of_several_nccl_distributions_is_judged():
    found = host.nccl_release("nvidia-nccl-cu12==2.26.2,nvidia-nccl-cu13==2.28.9", "nvidia-nccl-cu* dist-info",
                              gpus(WORKSTATION, WORKSTATION))
    assert [(f.severity, f.what.split(" is ")[0]) for f in found] == [("warning", "NCCL 2.26.2")]


def test_versions_judges_the_nccl_it_reports(monkeypatch):
    from sglang_pcie.runtime import allreduce

    monkeypatch.setattr(allreduce, "flashinfer_install", lambda: allreduce.FlashinferInstall(None, False, None))
    monkeypatch.setattr(allreduce, "sglang_install", lambda: allreduce.SglangInstall(None, None, False))
    monkeypatch.setattr(host.tuned_file, "installed_nccl", lambda: "nvidia-nccl-cu12==2.26.2")
    box = gpus(WORKSTATION, WORKSTATION)
    found = host.versions(box, None)  # no copy check: the dist-info folder
    assert [f.id for f in found] == ["host.versions", "host.nccl-release"]
    assert "NCCL nvidia-nccl-cu12==2.26.2" in found[0].what and found[1].source.endswith("nvidia-nccl-cu* dist-info")
    found = host.versions(box, {"torch": "2.7.0+cu128", "cuda": "12.8", "nccl": "2.28.3"})  # the child's NCCL wins
    assert [f.id for f in found] == ["host.versions"]
    monkeypatch.setattr(host.tuned_file, "installed_nccl", lambda: None)
    assert [f.id for f in host.versions(box, None)] == ["host.versions"]
    assert "NCCL not found" in host.versions(box, None)[0].what


@pytest.fixture
def workstation_box(tmp_path):
    """The recorded 8-GPU box (tools/doctor's pcie-8gpu-2socket) made RTX PRO 6000 Workstation Editions whose copy
    check's torch loaded NCCL 2.26.2; all else as recorded (with --tp 4: nothing wrong, exit 0)."""
    box = tmp_path / "box"
    shutil.copytree(SUPPORT / "data" / "host-facts" / "pcie-8gpu-2socket", box)
    smi = box / "commands" / "nvidia-smi-q.txt"
    smi.write_text(smi.read_text().replace(SERVER, WORKSTATION))
    for check in (box / "commands").glob("p2p-copy-check*.txt"):
        assert '"nccl": "2.28.3"' in check.read_text()
        check.write_text(check.read_text().replace('"nccl": "2.28.3"', '"nccl": "2.26.2"'))
    return box


@pytest.fixture
def hermetic(monkeypatch, tmp_path):
    for name in ("CUDA_VISIBLE_DEVICES", "SGLANG_CACHE_DIR", "NCCL_P2P_DISABLE", "SGLANG_PCIE_SM120_FUSION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("HOME", "/home/nobody")


def test_doctor_names_the_match_in_one_line_and_exits_1(capsys, workstation_box, hermetic):
    code = cli.main(["doctor", "--facts", str(workstation_box), "--tp", "4"])
    out = capsys.readouterr().out.splitlines()
    assert code == 1 and out[-2].endswith("exit 1") and "1 warning" in out[-2]
    (line,) = [line for line in out if "host.nccl-release" in line]
    assert line.startswith(f"warning     host.nccl-release        NCCL 2.26.2 is a release reported bad on "
                           f"{WORKSTATION} (GPU 0, 1, 2, 3): CUDA illegal memory access")
    assert f" Fix: {NCCL_2418.fix} [" in line
    assert line.endswith("[NVIDIA/nccl #2418 https://github.com/NVIDIA/nccl/issues/2418; NCCL from torch in the "
                         "copy check]")
    assert out.index(line) > out.index("== host")
    code = cli.main(["doctor", "--facts", str(workstation_box), "--tp", "4", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == data["exit"] == 1
    assert [f["id"] for f in data["findings"] if f["severity"] == "warning"] == ["host.nccl-release"]


def test_the_recorded_server_editions_are_told_of_the_report_without_a_warning(capsys, tmp_path, hermetic):
    box = tmp_path / "box"
    shutil.copytree(SUPPORT / "data" / "host-facts" / "pcie-8gpu-2socket", box)
    for check in (box / "commands").glob("p2p-copy-check*.txt"):
        check.write_text(check.read_text().replace('"nccl": "2.28.3"', '"nccl": "2.26.2"'))
    code = cli.main(["doctor", "--facts", str(box), "--tp", "4", "--json"])
    found = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["id"] == "host.nccl-release"]
    assert code == 0 and [f["severity"] for f in found] == ["info"] and "not on these GPUs" in found[0]["what"]


def test_docs_doctor_md_holds_the_table_the_rows_render():
    page = (REPO / nccl_releases.DOCS_PAGE).read_text()
    assert page == nccl_releases.with_docs_table(page), "docs/doctor.md's NCCL table is stale: run ci/generate-docs"
    assert page.count(nccl_releases.DOCS_BEGIN) == page.count(nccl_releases.DOCS_END) == 1
    for row in KNOWN_BAD:
        assert f"[{row.name}]({row.source})" in page
    assert "| `host.nccl-release` |" in page
    with pytest.raises(ValueError, match="markers"):
        nccl_releases.with_docs_table("# a page without the markers\n")
