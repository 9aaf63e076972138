"""The distributions as the package index gets them: built from a checkout that holds an untracked scratch folder
(which must not ship), checked by `twine check --strict`, with the metadata a user and the index read."""
from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile

import pytest

from support import REPO

# The sdist is the wheel's source (pyproject.toml says why): no tests, CI scripts or measurements, which need a clone.
SDIST_TOP = {"sglang_pcie", "sitecustomize", "diffs", "docs", "pyproject.toml", "README.md", "ARCHITECTURE.md",
             "CHANGELOG.md", "COMPATIBILITY.md", "LICENSE", "PKG-INFO", ".gitignore"}


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    checkout = tmp_path_factory.mktemp("checkout")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["cp", "--parents", "-t", str(checkout), *tracked.decode().split("\0")[:-1]], cwd=REPO,
                   check=True)
    (checkout / "scratch").mkdir()  # what a working checkout may hold: never shipped
    (checkout / "scratch" / "big.bin").write_bytes(b"\0" * 1024)
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(checkout)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return sorted(out.glob("*.whl"))[0], sorted(out.glob("*.tar.gz"))[0]


def test_twine_check_strict_passes(dists):
    proc = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, dists)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.count("PASSED") == 2, proc.stdout + proc.stderr


def test_the_sdist_holds_the_listed_paths_only(dists):
    with tarfile.open(dists[1]) as sdist:
        top = {name.split("/", 2)[1] for name in sdist.getnames() if name.count("/") >= 1}
    assert top <= SDIST_TOP and {"sglang_pcie", "LICENSE", "diffs", "docs"} <= top and "scratch" not in top
    assert not {"tests", "ci", "benchmarks"} & top  # they need a clone (the workflows, git, the SGLang installs)


def test_the_sdist_is_the_wheels_source(dists, tmp_path):
    """What the sdist is for: unpacked, it builds the same wheel as the checkout does (file for file)."""
    with tarfile.open(dists[1]) as sdist:
        sdist.extractall(tmp_path / "unpacked", filter="data")
    (source,) = (tmp_path / "unpacked").iterdir()
    proc = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "wheel"), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rebuilt = sorted((tmp_path / "wheel").glob("*.whl"))[0]
    with zipfile.ZipFile(dists[0]) as a, zipfile.ZipFile(rebuilt) as b:
        assert sorted(a.namelist()) == sorted(b.namelist())
        assert all(a.read(name) == b.read(name) for name in a.namelist() if not name.endswith("/RECORD"))


def test_the_wheel_carries_the_license_the_hook_and_the_metadata_the_index_shows(dists):
    with zipfile.ZipFile(dists[0]) as wheel:
        names = wheel.namelist()
        meta = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert any(n.endswith("licenses/LICENSE") for n in names) and "sglang_pcie.pth" in names
    assert "sglang_pcie_startup.py" in names and "sglang_pcie/tools/data/sample.txt" in names
    head = meta.split("\n\n", 1)[0]
    assert "License-Expression: Apache-2.0" in head and "Classifier: Programming Language :: Python :: 3.12" in head
    assert "Project-URL: Repository, https://" in head and "Author: " in head
    body = meta.split("\n\n", 1)[1]
    # The index shows the long description: every link in it is absolute.
    import re

    links = re.findall(r"\]\(([^)]+)\)", body)
    assert links and all(link.startswith("https://") for link in links), links
