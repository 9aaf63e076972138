"""SourceTree, the one reader of SGLang's source: names resolve as Python would import them, methods are found on
the class or inherited; on small trees written here."""
from __future__ import annotations

from pathlib import Path

from sglang_pcie.patching.source import SourceTree



# What the patches' static checks read, copied instead of a release's 4,700 files.  The control test below


# -- the name resolution the checks rely on (SourceTree), on a small tree written here

def write_tree(root: Path, files: dict[str, str]) -> SourceTree:
    for rel, text in {"sglang/__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return SourceTree(root)


def test_names_resolve_as_python_would_import_them(tmp_path):
    tree = write_tree(tmp_path, {
        "sglang/utils/__init__.py": "from sglang.utils.common import *\nfrom .extra import helper as public_helper\n",
        "sglang/utils/common.py": "__all__ = ['probe', 'reexported']\nfrom sglang.utils.gpu import probe as reexported\n"
                                  "def probe(): pass\ndef not_exported(): pass\n_private = 1\n",
        "sglang/utils/gpu.py": "def probe(): pass\n",
        "sglang/utils/extra.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from x import Hidden\n"
                                 "try:\n    import fast as helper\nexcept ImportError:\n    def helper(): pass\n",
        "sglang/lazy.py": "def __getattr__(name): raise AttributeError(name)\n",
        "sglang/runtime_only.py": "import typing\nif not typing.TYPE_CHECKING:\n    def at_run_time(): pass\n"
                                  "else:\n    def for_checkers(): pass\n",
    })
    assert tree.defines("sglang.runtime_only", "at_run_time")  # `if not TYPE_CHECKING:` runs its body
    assert not tree.defines("sglang.runtime_only", "for_checkers")
    assert tree.origin("sglang.utils", "probe") == ("sglang.utils.common", "probe")
    assert tree.origin("sglang.utils", "reexported") == ("sglang.utils.gpu", "probe")
    assert not tree.defines("sglang.utils", "not_exported")  # not in common's __all__
    assert not tree.defines("sglang.utils", "_private")
    assert tree.defines("sglang.utils", "public_helper")  # relative import, alias; try/except both bind it
    assert not tree.defines("sglang.utils.extra", "Hidden")  # only for type checkers
    assert tree.origin("sglang.utils", "gpu") == ("sglang.utils.gpu", "")  # a submodule
    assert tree.defines("sglang.lazy", "anything")  # a module __getattr__ may answer any name
    assert not tree.defines("sglang.missing", "probe")
    (tmp_path / "sglang/broken.py").write_text("from sglang.gone import probe\nfrom torch import tensor\n")
    assert not tree.defines("sglang.broken", "probe")  # imported from a module of the tree that is not there
    assert tree.origin("sglang.broken", "tensor") == ("torch", "tensor")  # outside the tree: taken as it says


def test_methods_are_found_on_the_class_or_inherited(tmp_path):
    tree = write_tree(tmp_path, {
        "sglang/base.py": "from abc import ABC, abstractmethod\nclass Base(ABC):\n    @abstractmethod\n"
                          "    def draft(self): ...\n    def verify(self):\n        return 1\n"
                          "    def todo(self):\n        raise NotImplementedError\n",
        "sglang/worker.py": "from typing import Generic, TypeVar\nfrom sglang.base import Base as _Base\n"
                            "T = TypeVar('T')\nclass Worker(_Base, Generic[T]):\n    def draft(self):\n        return 2\n"
                            "NewName = Worker\nclass Other(_Base):\n    pass\n",
    })
    assert tree.method("sglang.worker", "Worker", "draft")[:2] == ("sglang.worker", "Worker")
    assert tree.method("sglang.worker", "Worker", "verify")[:2] == ("sglang.base", "Base")  # inherited
    assert tree.method("sglang.worker", "NewName", "verify")[:2] == ("sglang.base", "Base")  # through an alias
    assert tree.method("sglang.worker", "Other", "draft")[:2] == ("sglang.base", "Base")
    assert tree.method("sglang.worker", "Other", "draft", concrete=True) is None  # abstract: not an implementation
    assert tree.method("sglang.worker", "Other", "todo", concrete=True) is None
    assert tree.method("sglang.worker", "Other", "missing") is None
