"""Throw-away virtual environments with this checkout's wheel installed (or not), for start-up hook tests.

These need no SGLang: they check what the ``.pth`` hook does in a plain interpreter.
"""
from __future__ import annotations

import subprocess
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def make_venv(path: Path, install: list[str] | None = None) -> Path:
    """A venv at ``path`` (pip-installing ``install`` into it without dependencies); returns its python."""
    venv.EnvBuilder(with_pip=True).create(path)  # with pip, as users' venvs are: it adds its own .pth
    python = path / "bin" / "python"
    if install:
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", *install], check=True)
    return python


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)
