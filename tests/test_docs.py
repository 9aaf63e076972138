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


def test_readmes_fast_loop_set_up_is_the_one_measured_and_its_figures_are_the_raw_files():
    """README gives the fast loop its own set-up command and says what it downloads on a cold cache; the figures are
    those of benchmarks/fast_loop_cold.py's raw file, which ran that very command."""
    readme = (REPO / "README.md").read_text()
    setup = 'python3 -m venv .venv && .venv/bin/python -m pip install -e ".[test]"'
    loop = '.venv/bin/python -m pytest -m "not release and not slow" -n 2'
    assert f"```bash\n{setup}\n{loop}\n```" in readme
    script = (REPO / "benchmarks" / "fast_loop_cold.py").read_text()
    assert '"-m", "venv", ".venv"' in script and '"-m", "pip", "install", "-e", ".[test]"' in script
    assert 'FAST_LOOP = ["-m", "pytest", "-m", "not release and not slow"' in script

    raw = (REPO / "benchmarks/results/2026-12-05-cpu/fast-loop-cold.txt").read_text()
    install, loop_part = raw.split("\nset-up (install): ")[1].split("\nfast loop: ")
    down = [float(m) for m in re.findall(r"through the proxy: ([\d.,]+) MB down", raw)]
    seconds = [float(s) for s in re.findall(r"exit \d+, ([\d.]+) s wall", raw)]
    tests = sum(int(n) for n in re.findall(r"(\d+) (?:passed|failed|skipped)", loop_part.split("afterwards")[0]))
    wheels = re.search(r"release wheels: (\d+)", raw).group(1)
    warm = re.search(r"in [\d.]+s \((\d+):(\d+):(\d+)\)", (REPO / "benchmarks/results/2026-12-05-cpu/fast-loop-warm.txt")
                     .read_text())
    text = " ".join(readme.split())
    assert f"the set-up downloads {round(down[1])} MB from PyPI" in text and f"; {round(seconds[1])} s)" in text
    assert f"fetches the {wheels} pristine SGLang release wheels" in text and f"{round(down[2])} MB downloaded" in text
    cold = re.search(r"in [\d.]+s \((\d+):(\d+):(\d+)\)", loop_part)  # pytest's own time of the loop
    assert f"{tests:,} tests in {int(cold[2])} min {int(cold[3])} s that first time" in text
    assert f"{int(warm[2])} min {int(warm[3])} s once the wheels are cached" in text
    assert install.splitlines()[1].startswith("  exit 0,")  # the set-up worked


def test_readmes_unit_tier_is_the_command_timed_and_its_figures_are_the_raw_files():
    """README's unit tier: the command, and the test count and wall times of the raw file that timed that command."""
    readme = (REPO / "README.md").read_text()
    command = ".venv/bin/python -m pytest -m unit -n 2"
    assert f"```bash\n{command}\n```" in readme
    named = re.findall(r"`(benchmarks/results/[^`]+/unit-tier\.txt)`", readme)
    raw = (REPO / named[0]).read_text()  # the first named is the current figure
    assert f"# command: time {command} -q\n" in raw
    counts = {int(n) for n in re.findall(r"^(\d+) passed", raw, re.M)}
    walls = [int(m) * 60 + float(s) for m, s in re.findall(r"^real\s+(\d+)m([\d.]+)s", raw, re.M)]
    loads = [float(x) for x in re.findall(r"load average before: ([\d.]+)", raw)]
    assert len(counts) == 1 and len(walls) == 3 and "failed" not in raw
    text = " ".join(readme.split())
    assert f"{counts.pop():,} tests in {round(min(walls))}-{round(max(walls))} s" in text and max(walls) < 30
    assert f"load average {min(loads):.1f}-{max(loads):.1f})" in text
    assert all((REPO / path).is_file() for path in named)
