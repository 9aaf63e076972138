"""SourceTree, the one reader of SGLang's source: names resolve as Python would import them, methods are found on
the class or inherited; on small trees written here."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sglang_pcie.patching.source import Definition, SourceTree



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


def test_a_top_level_import_of_a_module_relative_or_not(tmp_path):
    tree = write_tree(tmp_path, {
        "sglang/layers/__init__.py": "",
        "sglang/layers/fusion.py": "",
        "sglang/layers/gate.py": "import os\nfrom .fusion import a\nfrom sglang.layers.fusion import b\n"
                                 "def f():\n    import sglang.layers.fusion\n",
        "sglang/layers/plain.py": "import sglang.layers.fusion as fusion\n",
    })
    assert tree.top_level_import("sglang.layers.gate", "sglang.layers.fusion").lineno == 2  # the first, relative
    assert tree.top_level_import("sglang.layers.plain", "sglang.layers.fusion").lineno == 1
    assert tree.top_level_import("sglang.layers.gate", "os").lineno == 1
    assert tree.top_level_import("sglang.layers.plain", "os") is None


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


# -- the cheap reading: a module cut at its top-level statements, a class parsed only when asked for

TRICKY = '''"""A docstring whose lines sit at column 0:
class NotAClass:
import nothing
"""
from typing import TYPE_CHECKING
import sglang.base as base_module
from ..base import Base, Mixin as _Mixin
if TYPE_CHECKING:
    from sglang.hidden import Hidden
try:
    from sglang.fast import Fast
except ImportError:
    class Fast:
        pass
EntryClass = [Fast]


@decorate(
    "a decorator over lines",
)
class Model(
    Base,
    _Mixin,
):
    """Lines at column 0 in here too:
def not_a_method(self):
"""
    kind = "model"
    size: int = 3

    def forward(self, x):
        return x

    async def step(self):
        text = """
def inner():
"""
        return text


Alias = Model
EntryClass += [Model]


class Sub(base_module.Base):
    def step(self):
        return 2
'''


def test_the_cut_reads_a_module_as_python_does(tmp_path):
    tree = write_tree(tmp_path, {
        "sglang/base.py": "class Base:\n    def step(self):\n        return 1\n    attr: int = 1\n\n"
                          "class Mixin:\n    def mixed(self): ...\n",
        "sglang/fast.py": "class Fast:\n    pass\n",
        "sglang/models/__init__.py": "",
        "sglang/models/tricky.py": TRICKY,
        "sglang/models/other.py": "X = 1\n",
        "sglang/models/sub/__init__.py": "",
        "sglang/models/sub/deep.py": "",
    })
    module = "sglang.models.tricky"
    assert tree.modules("sglang.models") == ["sglang.models.other", "sglang.models.tricky"]
    assert tree.modules("sglang.models", recursive=True) == [
        "sglang.models.other", "sglang.models.sub", "sglang.models.sub.deep", "sglang.models.tricky"]
    assert list(tree.classes(module)) == ["Model", "Sub"]  # not the docstring's; Fast is under try
    assert tree.classes(module)["Model"].bases == ("Base", "_Mixin")  # a header over several lines
    assert tree.classes(module)["Sub"].bases == ("base_module.Base",)
    assert tree.class_at(module, "Fast") == (module, "Fast")  # try and except both count, as in bindings()
    assert tree.class_at(module, "Alias") == (module, "Model")
    assert tree.class_at(module, "base_module.Base") == ("sglang.base", "Base")
    assert tree.class_at(module, "Hidden") is None  # only for type checkers
    model = tree.class_node(module, "Model")
    assert ast.dump(model, include_attributes=True) == ast.dump(tree.bindings(module)["Model"], include_attributes=True)
    assert tree.members(module, "Model") == {"kind", "size", "forward", "step"}
    assert tree.lineage(module, "Model") == [(module, "Model"), ("sglang.base", "Base"), ("sglang.base", "Mixin")]
    assert tree.member_owner(module, "Model", "attr") == ("sglang.base", "Base")
    assert tree.member_owner(module, "Model", "mixed") == ("sglang.base", "Mixin")
    assert tree.member_owner(module, "Model", "not_a_method") is None  # in a docstring
    assert tree.member_owner(module, "Model", "inner") is None  # in a string inside a method
    assert tree.member_owner(module, "Sub", "step") == (module, "Sub")
    assert [ast.unparse(v) for v in tree.assignments(module, "EntryClass")] == ["[Fast]", "[Model]"]
    assert [f.name for f in tree.functions_mentioning(module, "return x")] == ["forward"]


def test_a_cut_that_does_not_parse_falls_back_to_the_whole_module(tmp_path):
    tree = write_tree(tmp_path, {
        "sglang/odd.py": "from sglang.base import (\nBase)\nVALUES = [\n1, 2]\nclass Odd(Base):\n    x = 1\n",
        "sglang/quotes.py": "from sglang.base import Base\n@mark(\"a \'\'\' inside\")\nclass Q(Base):\n    y = 1\n",
        "sglang/base.py": "class Base:\n    pass\n",
        "sglang/bom.py": "\ufeffclass WithMark:\n    pass\n",
    })
    assert tree.class_at("sglang.odd", "Base") == ("sglang.base", "Base")
    assert tree.lineage("sglang.odd", "Odd") == [("sglang.odd", "Odd"), ("sglang.base", "Base")]
    assert tree.members("sglang.odd", "Odd") == {"x"}
    assert tree.lineage("sglang.quotes", "Q") == [("sglang.quotes", "Q"), ("sglang.base", "Base")]
    assert tree.members("sglang.quotes", "Q") == {"y"}
    assert tree.class_at("sglang.bom", "WithMark") == ("sglang.bom", "WithMark")  # a byte-order mark first


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_the_cheap_reading_agrees_with_a_full_parse_on_every_model_module(pristine_source, version):
    """Every name srt/models binds, bound to the same statement; every class, parsed alone, is the class of the
    whole module (line numbers included); the classes listed are the module's classes."""
    tree = SourceTree(pristine_source(version))
    modules = tree.modules("sglang.srt.models")
    assert len(modules) > 150
    for module in modules:
        source = tree.source(module).lstrip("\ufeff")  # tree() cannot parse a byte-order mark; the cut can
        full = SourceTree(tree.root)
        full._sources[module] = source
        assert set(tree.classes(module)) == {n.name for n in ast.parse(source).body if isinstance(n, ast.ClassDef)}
        for name, stmt in full.bindings(module).items():
            cheap = tree._binding(module, name)
            if isinstance(stmt, ast.ClassDef):
                cheap = tree.class_node(module, name)
                assert ast.dump(cheap, include_attributes=True) == ast.dump(stmt, include_attributes=True), name
            elif isinstance(cheap, Definition):
                assert (cheap.kind, cheap.name) == ("def", name) and isinstance(stmt, ast.FunctionDef), name
            else:
                assert ast.dump(cheap) == ast.dump(stmt), (module, name)


def test_a_folder_that_is_not_a_tree_says_what_to_give(tmp_path):
    """The package folder itself gets its parent named; a file is called a file; elsewhere, the plain error."""
    write_tree(tmp_path, {"sglang/srt/__init__.py": ""})
    with pytest.raises(ValueError, match=f"no sglang package under '{tmp_path / 'sglang'}': that is the sglang"
                                         f" package itself; give its parent folder '{tmp_path}'"):
        SourceTree(tmp_path / "sglang")
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(ValueError, match=f"'{tmp_path / 'notes.txt'}' is a file, not a folder"):
        SourceTree(tmp_path / "notes.txt")
    with pytest.raises(ValueError, match=f"^no sglang package under '{tmp_path / 'srt'}'$"):
        SourceTree(tmp_path / "srt")
