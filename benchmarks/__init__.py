"""The measurement scripts (benchmarks/README.md: which script made which published figure, and how to rerun it).

Run a script as ``python -m benchmarks.<name>`` from the checkout root: the checkout's own ``sglang_pcie`` is then
imported (the root is first on sys.path) and a script imports another as ``benchmarks.<name>``.  The one thing of
tests/ a script may import is the package the tests share their fakes through, ``tests/support`` (``support``):
this file puts tests/ on sys.path right after the checkout root, as pyproject.toml's ``pythonpath`` does for pytest,
so that ``support`` is the same package in both.  tests/test_benchmarks.py checks that no script imports any other
test module, that no script edits sys.path itself, and that no test imports a script.
"""
import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent.parent / "tests")
if _TESTS not in sys.path:
    sys.path.insert(1, _TESTS)
