"""SGLang releases: which ones exist, and their pristine sources (wheels fetched without dependencies)."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import urllib.request
import zipfile
import zlib
from pathlib import Path

from sglang_pcie.patching.register import COVERED_RELEASES  # noqa: F401  (listed once, in the register)

INDEX_URL = os.environ.get("SGLANG_PCIE_INDEX_URL", "https://pypi.org/simple")


def cache_dir() -> Path:
    return Path(os.environ.get("SGLANG_PCIE_CACHE") or Path.home() / ".cache" / "sglang-pcie")


def list_releases(index_url: str = INDEX_URL) -> list[str]:
    """Every final release of sglang the index serves (PEP 691 JSON), oldest first."""
    from packaging.version import InvalidVersion, Version

    request = urllib.request.Request(f"{index_url.rstrip('/')}/sglang/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        data = json.load(response)
    versions = []
    for raw in data.get("versions", []):
        try:
            version = Version(raw)
        except InvalidVersion:
            continue
        if not version.is_prerelease and not version.is_devrelease:
            versions.append(version)
    return [str(v) for v in sorted(versions)]


@contextlib.contextmanager
def _locked(path: Path):
    """Serialise processes that fill the same cache entry (parallel test workers, CI jobs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def release_version(version: str) -> str:
    """``version`` in its normal form (``0.5.8-post1`` -> ``0.5.8.post1``); ValueError naming it when it is not a
    version number. Checked before the version becomes part of a cache path (``../../x`` must not)."""
    from packaging.version import InvalidVersion, Version

    try:
        return str(Version(version))
    except InvalidVersion:
        raise ValueError(f"sglang version {version!r} is not a version number (e.g. 0.5.23)") from None


def fetch_wheel(version: str, wheels: Path | None = None) -> Path:
    """The release's wheel, downloaded once into the cache with ``pip download --no-deps``."""
    version = release_version(version)
    wheels = wheels or cache_dir() / "wheels"
    with _locked(wheels / f".sglang-{version}.lock"):
        return _fetch_wheel(version, wheels)


def _fetch_wheel(version: str, wheels: Path) -> Path:
    found = _cached_wheel(version, wheels)
    if found:
        return found
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.11", "--platform", "manylinux_2_34_x86_64", "--implementation", "cp",
           "--abi", "cp311", "--abi", "none", "--abi", "abi3", "-d", str(wheels), f"sglang=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = _cached_wheel(version, wheels)
    if proc.returncode != 0 or not found:
        tail = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise RuntimeError(f"could not fetch sglang=={version}: {tail}")
    return found


def _cached_wheel(version: str, wheels: Path) -> Path | None:
    matches = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    return matches[0] if matches else None


def fetch_source(version: str) -> Path:
    """A folder holding the pristine ``sglang`` package of ``version`` (unpacked once, then cached)."""
    version = release_version(version)
    root = cache_dir() / "src" / version
    if (root / "sglang" / "__init__.py").is_file():
        return root
    wheel = fetch_wheel(version)
    with _locked(root.with_name(f".{version}.lock")):
        if not (root / "sglang" / "__init__.py").is_file():
            _unpack(wheel, root)
    return root


def _unpack(wheel: Path, root: Path) -> None:
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [name for name in archive.namelist()
                       if name.startswith("sglang/") and name.endswith(".py")]
            archive.extractall(partial, members)
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        # A truncated or corrupt download: drop it, so that the next run fetches the wheel again.
        shutil.rmtree(partial, ignore_errors=True)
        wheel.unlink(missing_ok=True)
        raise RuntimeError(f"{wheel}: not a readable wheel ({exc}); deleted, run again to fetch it anew") from None
    shutil.rmtree(root, ignore_errors=True)
    partial.rename(root)
