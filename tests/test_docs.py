"""The documents' own references: every repository path a page names (in backticks, or as a relative link) exists, so
that a reader who follows one finds it (paths move when the package is reorganised)."""
from __future__ import annotations

import re

import pytest

from support import REPO

PAGES = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md", REPO / "ARCHITECTURE.md", REPO / "COMPATIBILITY.md",
         REPO / "benchmarks" / "README.md"]
NAMED = re.compile(r"`((?:sglang_pcie|tests|ci|benchmarks|patches|docs|sitecustomize)/[^`\s]*)`")
LINKED = re.compile(r"\]\((?!https?:|mailto:|#)([^)#\s]+)")


def named_paths(text: str) -> list[str]:
    """The repository paths a page names: placeholders (<release>), globs and pytest node ids' tails left out."""
    found = [m.split("::")[0].rstrip("/.,:") for m in NAMED.findall(text)]
    return [p for p in found if not any(c in p for c in "<>*{}")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_path_a_page_names_exists(page):
    text = page.read_text()
    missing = [p for p in named_paths(text) if not (REPO / p).exists()]
    missing += [link for link in LINKED.findall(text) if not (page.parent / link).exists()]
    assert not missing, f"{page.relative_to(REPO)} names {missing}"


def test_pypis_page_says_what_the_overlay_may_print_as_readme_does():
    """docs/pypi.md (PyPI's project page) and README: the same lines an overlay nobody asked for anything may print."""
    said = ("What it may say: on a multi-GPU machine without NVLink and without a tuning result, one line per process "
            "tree suggests `sglang-pcie tune-nccl`; on a launch over several nodes, one line per node.")
    for page in (REPO / "README.md", REPO / "docs" / "pypi.md"):
        text = " ".join(page.read_text().split())
        assert said in text, page.name
        assert "the only new output" not in text, page.name
    pypi = " ".join((REPO / "docs" / "pypi.md").read_text().split())
    assert "drafts are essentially never accepted" in pypi and "NCCL settings differ" in pypi
