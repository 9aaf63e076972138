"""What sm120-allreduce-fusion inserts into a release, as text: the helper that decides, once per process, whether
SM120 joins FlashInfer's all-reduce fusion, and the lines at the gate, the backend resolver and the workspace
preflight that ask it.

The helper is self-contained (a versioned diff must work without sglang-pcie installed): it imports only what the
release and FlashInfer have, and answers False unless the guard every diff binds says the patch is on.
``sm120_allreduce_fusion`` decides where each piece goes in the release at hand; ``helper_block`` writes the helper
for that release.
"""
from __future__ import annotations

from sglang_pcie.patching import baked
from sglang_pcie.patching.engine import DIFF_MARKER

PATCH_ID = "sm120-allreduce-fusion"
MARKER = f"{DIFF_MARKER} {PATCH_ID}"
LOGGER_NAME = "sglang_pcie.sm120_allreduce_fusion"  # the logger the helper warns through

FUSION = "sglang.srt.layers.flashinfer_comm_fusion"  # holds the helper from 0.5.10 (see _host_helper)
# The names the helper defines in the release.
HELPER = "_sglang_pcie_sm120_fusion_ok"
IS_SM120 = "_sglang_pcie_is_sm120"
OPTED_IN = "_sglang_pcie_sm120_opted_in"
# What it asks whether the GPU is SM12x.
RUNTIME_CONTEXT = "sglang.srt.runtime_context"
UTILS = "sglang.srt.utils"
SM120_FACT = "is_sm120"  # get_platform().is_sm120, from 0.5.19
SM120_PROBE = "is_sm120_supported"  # sglang.srt.utils, every covered release

# How the inserted helper asks whether the GPU is SM12x: written for the release at hand, through the name its
# check found there (the platform object from 0.5.19, SGLang's probe before), so that no fallback hides a rename.
IS_SM120_BY_PLATFORM = f"""\
    from {RUNTIME_CONTEXT} import get_platform

    return bool(get_platform().{SM120_FACT})
"""
IS_SM120_BY_PROBE = f"""\
    from {UTILS} import {SM120_PROBE}

    return bool({SM120_PROBE}())
"""

# Inserted into the release, self-contained (the diffs must work without sglang-pcie installed).
# __ENTRY_POINTS__ becomes what the release's flashinfer_comm_fusion.py calls on flashinfer.comm, __IS_SM120__ one
# of the two bodies above.
HELPER_BLOCK = '''\
# sglang-pcie: sm120-allreduce-fusion (begin).
# SM120 (RTX PRO 6000 Blackwell) joins SM90/SM100 in FlashInfer's all-reduce fusion only when the user opted
# in (SGLang's own fusion option and SGLANG_PCIE_SM120_FUSION=1) and the fused kernel can run: peer-to-peer
# access between the GPUs, and a FlashInfer with SM12x kernels for its TRT-LLM all-reduce (FlashInfer PR
# #3903) and the entry points this release calls. Not opted in, switched off (SGLANG_PCIE_DISABLE=1,
# SGLANG_PCIE_DISABLE_PATCHES) or without sglang-pcie, nothing here changes what SGLang does or logs.
# Decided once per process and the same way on every TP rank (all of them see the same GPUs): a rank that
# alone fell back to NCCL would hang its peers.
_SGLANG_PCIE_FLASHINFER_ENTRY_POINTS = __ENTRY_POINTS__
_sglang_pcie_sm120_fusion = None  # the decision, once made


__OPTED_IN_DECORATOR__def _sglang_pcie_sm120_opted_in():
    return False  # SGLang's own answer; where the patch is on, its guard answers True instead


def _sglang_pcie_is_sm120():
__IS_SM120__

def _sglang_pcie_sm120_fusion_ok():
    global _sglang_pcie_sm120_fusion
    if _sglang_pcie_sm120_fusion is None:
        import torch

        if torch.compiler.is_compiling():
            return False  # decided in eager code only, never while Dynamo traces the gate
        _sglang_pcie_sm120_fusion = bool(
            _sglang_pcie_sm120_opted_in() and _sglang_pcie_is_sm120() and _sglang_pcie_sm120_can_fuse()
        )
    return _sglang_pcie_sm120_fusion


def _sglang_pcie_sm120_can_fuse():
    import logging

    missing = _sglang_pcie_flashinfer_missing() + _sglang_pcie_peer_access_missing()
    if missing:
        logging.getLogger("sglang_pcie.sm120_allreduce_fusion").warning(
            "sglang-pcie: FlashInfer all-reduce fusion stays off on SM120: %s", "; ".join(missing)
        )
        return False
    return True


def _sglang_pcie_flashinfer_missing():
    import pathlib

    try:
        import flashinfer
        import flashinfer.comm
    except Exception as exc:
        return [f"FlashInfer cannot be imported ({type(exc).__name__}: {exc})"]
    version = getattr(flashinfer, "__version__", "?")
    absent = [name for name in _SGLANG_PCIE_FLASHINFER_ENTRY_POINTS if not hasattr(flashinfer.comm, name)]
    if absent:
        return [f"flashinfer.comm {version} lacks {', '.join(absent)}"]
    build_spec = pathlib.Path(flashinfer.__file__).parent / "jit" / "comm.py"
    if 12 not in _sglang_pcie_trtllm_allreduce_majors(build_spec):
        return [f"FlashInfer {version} has no SM12x kernels for its TRT-LLM all-reduce (FlashInfer PR #3903)"]
    return []


def _sglang_pcie_trtllm_allreduce_majors(build_spec):
    """The GPU majors FlashInfer builds its TRT-LLM all-reduce for (gen_trtllm_comm_module in jit/comm.py)."""
    import ast

    try:
        tree = ast.parse(build_spec.read_text())
    except (OSError, SyntaxError):
        return []
    for func in ast.walk(tree):
        if isinstance(func, ast.FunctionDef) and func.name == "gen_trtllm_comm_module":
            for call in ast.walk(func):
                for keyword in getattr(call, "keywords", ()):
                    if keyword.arg == "supported_major_versions":
                        return list(ast.literal_eval(keyword.value))
    return []


def _sglang_pcie_peer_access_missing():
    import torch

    count = torch.cuda.device_count()
    pairs = [(a, b) for a in range(count) for b in range(count) if a != b]
    blocked = [(a, b) for a, b in pairs if not torch.cuda.can_device_access_peer(a, b)]
    if not blocked:
        return []
    a, b = blocked[0]
    return [f"GPU {a} has no peer-to-peer access to GPU {b} "
            f"({len(blocked)} of {len(pairs)} pairs of visible GPUs lack it)"]


# sglang-pcie: sm120-allreduce-fusion (end).
'''
GATE_COMMENT = f"# {MARKER}: SM120 as SM90 once opted in and able to run"
RESOLVER_COMMENT = f"# {MARKER}: SM120 resolves as SM90 (auto -> trtllm) once opted in and able to run"
RESOLVER_OFF = f'''\
# {MARKER}: opted in on SM120 with a condition missing (logged once), a
# backend it could run stays off instead of failing the server start; SGLang's own error otherwise.
if {OPTED_IN}() and {IS_SM120}() and backend in ("auto", "trtllm") and not is_multi_node:
    return None
'''
PREFLIGHT_COMMENT = f'''\
# {MARKER}: FlashInfer's TRT-LLM workspace is unicast, and GPUs without
# multicast (SM120 over PCIe) fail the multicast query.
if not {HELPER}():
'''
IMPORT_LINES = f"from {FUSION} import (  # {MARKER}\n    {HELPER},\n)\n"


def helper_block(entry_points: tuple[str, ...], is_sm120_body: str) -> str:
    """The helper for one release: the entry points its flashinfer_comm_fusion calls on flashinfer.comm, and how
    it tells SM120 there (``IS_SM120_BY_PLATFORM`` or ``IS_SM120_BY_PROBE``)."""
    listed = "".join(f"\n    {name!r}," for name in entry_points)
    return (HELPER_BLOCK.replace("__ENTRY_POINTS__", f"({listed}\n)").replace("__IS_SM120__", is_sm120_body)
            .replace("__OPTED_IN_DECORATOR__", baked.decorator(PATCH_ID)))
