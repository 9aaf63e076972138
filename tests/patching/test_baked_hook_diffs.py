"""A wrap patch's baked diff derived from its hooks (``patching/baked.hook_diffs``): each placement's lines, the
guard once per module, a module already carrying them left alone. The real patches' diffs are checked against the
committed ones on every covered release by ``ci/generate-diffs --check`` (tests/patching/test_diffs.py)."""
from __future__ import annotations

from sglang_pcie.patching import baked
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.runtime.patch_table import Hook, Row

TOY = '''def greet(name):
    return name


class Worker:
    @staticmethod
    def helper():
        return 1

    def verify(self, batch):
        return batch

    def draft(self):
        return 0
'''


def tree_of(tmp_path, text=TOY) -> SourceTree:
    (tmp_path / "sglang").mkdir(parents=True)
    (tmp_path / "sglang/__init__.py").write_text('__version__ = "0.5.23"\n')
    (tmp_path / "sglang/toy.py").write_text(text)
    return SourceTree(tmp_path)


def row(*hooks) -> Row:
    return Row(id="toy-patch", payload="x:y", hooks=hooks)


GUARD = baked.guard_block("toy-patch")


def test_decorate_a_function_and_two_methods_with_the_guard_once(tmp_path):
    hooks = (Hook("sglang.toy", "greet", says=""), Hook("sglang.toy", "Worker.verify", args=("v2",), says=""),
             Hook("sglang.toy", "Worker.draft", says=""))
    text = baked.hook_diffs(row(*hooks), tree_of(tmp_path))["sglang.toy"]
    assert text.count(GUARD) == 1
    assert text.startswith(GUARD + "\n\n" + baked.decorator("toy-patch") + "def greet(name):\n")
    assert ("    " + baked.decorator("toy-patch", "v2") + "    def verify(self, batch):") in text
    assert ("    " + baked.decorator("toy-patch") + "    def draft(self):") in text


def test_after_the_class_and_at_the_end(tmp_path):
    after = baked.hook_diffs(row(Hook("sglang.toy", "Worker.verify", says="", diff="after-class")),
                             tree_of(tmp_path))["sglang.toy"]
    assert after == TOY + "\n\n" + GUARD + "\n\n" + baked.rebinding("toy-patch", "Worker.verify")
    end = baked.hook_diffs(row(Hook("sglang.toy", "Worker.draft", args=("v1",), says="", diff="at-end")),
                           tree_of(tmp_path / "b"))["sglang.toy"]
    assert end == TOY + "\n\n" + GUARD + baked.rebinding("toy-patch", "Worker.draft", "v1")


def test_two_hooks_at_the_end_share_one_guard_block_and_run(tmp_path):
    hooks = (Hook("sglang.toy", "Worker.verify", args=("v2",), says="", diff="at-end"),
             Hook("sglang.toy", "Worker.draft", args=("load",), says="", diff="at-end"))
    text = baked.hook_diffs(row(*hooks), tree_of(tmp_path))["sglang.toy"]
    assert text == (TOY + "\n\n" + GUARD + baked.rebinding("toy-patch", "Worker.verify", "v2")
                    + baked.rebinding("toy-patch", "Worker.draft", "load"))
    namespace = {}
    exec(compile(text, "toy.py", "exec"), namespace)  # the module still runs: its guard is bound before both lines
    assert namespace["Worker"]().draft() == 0


def test_a_module_carrying_the_lines_or_absent_is_left_alone(tmp_path):
    hooks = (Hook("sglang.toy", "greet", says=""), Hook("sglang.gone", "f", says="", optional=True))
    assert baked.hook_diffs(row(*hooks), tree_of(tmp_path, TOY + "# sglang-pcie: toy-patch\n")) == {}
