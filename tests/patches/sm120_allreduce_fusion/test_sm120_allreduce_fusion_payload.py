"""The helper sm120-allreduce-fusion inserts into SGLang, run as the module it is kept in: the decision, each
condition's message, and that it stays self-contained (a versioned diff must work without sglang-pcie).

The inserted text itself (the baked diffs, the code swap) is tested in ``tests/patching``; here torch, FlashInfer
and SGLang are fakes.
"""
from __future__ import annotations

import ast
import inspect
import logging
import sys
from types import ModuleType, SimpleNamespace

import pytest

from sglang_pcie.patches.sm120_allreduce_fusion import payload as helper

BUILD_SPEC = """
def gen_trtllm_comm_module():
    return gen_jit_spec("trtllm_comm", sources, supported_major_versions={majors})
"""


@pytest.fixture
def torch(monkeypatch):
    """A torch with ``count`` GPUs, ``blocked`` the (a, b) pairs without peer access; not compiling."""
    fake = SimpleNamespace(count=2, blocked=set(), compiling=False)
    fake.compiler = SimpleNamespace(is_compiling=lambda: fake.compiling)
    fake.cuda = SimpleNamespace(device_count=lambda: fake.count,
                                can_device_access_peer=lambda a, b: (a, b) not in fake.blocked)
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(helper, "_sglang_pcie_sm120_fusion", None)
    return fake


@pytest.fixture
def flashinfer(monkeypatch, tmp_path):
    """A FlashInfer 0.7.2 whose comm has ``fused`` and whose TRT-LLM all-reduce is built for SM9x, SM10x, SM12x."""
    package = ModuleType("flashinfer")
    package.__version__, package.__file__ = "0.7.2", str(tmp_path / "flashinfer" / "__init__.py")
    package.comm = ModuleType("flashinfer.comm")
    package.comm.fused = lambda: None
    (tmp_path / "flashinfer" / "jit").mkdir(parents=True)
    (tmp_path / "flashinfer" / "jit" / "comm.py").write_text(BUILD_SPEC.format(majors=[9, 10, 12]))
    monkeypatch.setitem(sys.modules, "flashinfer", package)
    monkeypatch.setitem(sys.modules, "flashinfer.comm", package.comm)
    monkeypatch.setattr(helper, "_SGLANG_PCIE_FLASHINFER_ENTRY_POINTS", ("fused",))
    return package


def opted_in_on_sm120(monkeypatch):
    monkeypatch.setattr(helper, "_sglang_pcie_sm120_opted_in", lambda: True)
    monkeypatch.setattr(helper, "_sglang_pcie_is_sm120", lambda: True)


def test_not_opted_in_it_is_off_and_asks_nothing_else(torch, monkeypatch, caplog):
    monkeypatch.setattr(helper, "_sglang_pcie_is_sm120", lambda: pytest.fail("asked the GPU"))
    assert helper._sglang_pcie_sm120_fusion_ok() is False
    assert helper._sglang_pcie_sm120_fusion is False and not caplog.records


def test_opted_in_on_sm120_with_every_condition_met_it_is_on(torch, flashinfer, monkeypatch, caplog):
    opted_in_on_sm120(monkeypatch)
    assert helper._sglang_pcie_sm120_fusion_ok() is True and not caplog.records


def test_decided_once_and_never_while_dynamo_traces(torch, flashinfer, monkeypatch):
    opted_in_on_sm120(monkeypatch)
    torch.compiling = True
    assert helper._sglang_pcie_sm120_fusion_ok() is False and helper._sglang_pcie_sm120_fusion is None
    torch.compiling = False
    assert helper._sglang_pcie_sm120_fusion_ok() is True
    torch.count = 0  # asked again: the decision stands
    monkeypatch.setattr(helper, "_sglang_pcie_sm120_can_fuse", lambda: pytest.fail("decided twice"))
    assert helper._sglang_pcie_sm120_fusion_ok() is True


def test_a_missing_condition_is_logged_once_and_keeps_it_off(torch, flashinfer, monkeypatch, caplog):
    opted_in_on_sm120(monkeypatch)
    torch.count, torch.blocked = 3, {(0, 2), (2, 0)}
    with caplog.at_level(logging.WARNING, logger="sglang_pcie.sm120_allreduce_fusion"):
        assert helper._sglang_pcie_sm120_fusion_ok() is False
        assert helper._sglang_pcie_sm120_fusion_ok() is False
    assert [r.getMessage() for r in caplog.records] == [
        "sglang-pcie: FlashInfer all-reduce fusion stays off on SM120: GPU 0 has no peer-to-peer access to GPU 2 "
        "(2 of 6 pairs of visible GPUs lack it)"]


def test_what_flashinfer_lacks_is_named(flashinfer, monkeypatch, tmp_path):
    assert helper._sglang_pcie_flashinfer_missing() == []
    monkeypatch.setattr(helper, "_SGLANG_PCIE_FLASHINFER_ENTRY_POINTS", ("fused", "create_workspace", "destroy"))
    assert helper._sglang_pcie_flashinfer_missing() == ["flashinfer.comm 0.7.2 lacks create_workspace, destroy"]
    monkeypatch.setattr(helper, "_SGLANG_PCIE_FLASHINFER_ENTRY_POINTS", ())
    (tmp_path / "flashinfer" / "jit" / "comm.py").write_text(BUILD_SPEC.format(majors=(9, 10)))
    assert helper._sglang_pcie_flashinfer_missing() == [
        "FlashInfer 0.7.2 has no SM12x kernels for its TRT-LLM all-reduce (FlashInfer PR #3903)"]
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    [missing] = helper._sglang_pcie_flashinfer_missing()
    assert missing.startswith("FlashInfer cannot be imported (ModuleNotFoundError: ")


@pytest.mark.parametrize("text, majors", [(BUILD_SPEC.format(majors=[9, 10, 12]), [9, 10, 12]),
                                          ("def gen_trtllm_comm_module(:\n", []),
                                          ("def other():\n    f(supported_major_versions=[12])\n", []),
                                          (None, [])])
def test_the_majors_are_read_from_the_build_spec_without_importing_it(tmp_path, text, majors):
    build_spec = tmp_path / "comm.py"
    if text is not None:
        build_spec.write_text(text)
    assert helper._sglang_pcie_trtllm_allreduce_majors(build_spec) == majors


@pytest.mark.parametrize("function, module, name, value", [
    (helper._sglang_pcie_is_sm120, "sglang.srt.runtime_context", "get_platform", lambda: SimpleNamespace(is_sm120=1)),
    (helper._sglang_pcie_is_sm120_by_probe, "sglang.srt.utils", "is_sm120_supported", lambda: 1),
])
def test_both_ways_of_asking_for_sm12x(monkeypatch, function, module, name, value):
    for parent in ("sglang", "sglang.srt"):
        monkeypatch.setitem(sys.modules, parent, ModuleType(parent))
    monkeypatch.setitem(sys.modules, module, SimpleNamespace(**{name: value}))
    assert function() is True


def test_on_its_own_it_is_sglangs_answer_not_opted_in():
    assert helper._sglang_pcie_sm120_opted_in() is False


def test_it_is_self_contained():
    """Nothing imported at module level, and inside its functions only the standard library, torch, FlashInfer and
    SGLang: never sglang_pcie, which a baked image may not have."""
    tree = ast.parse(inspect.getsource(helper))
    assert not [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert {name.split(".")[0] for name in imported} <= {"ast", "logging", "pathlib", "torch", "flashinfer", "sglang"}
