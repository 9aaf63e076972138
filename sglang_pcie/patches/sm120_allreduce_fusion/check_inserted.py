"""What sm120-allreduce-fusion inserts into a release, as text: the helper that decides, once per process, whether
SM120 joins FlashInfer's all-reduce fusion, and the lines at the gate, the backend resolver and the workspace
preflight that ask it.

The helper is code, ``patches/sm120_allreduce_fusion/payload.py``, read here from its file: self-contained (a
versioned diff must
work without sglang-pcie installed), it imports only what the release and FlashInfer have, and answers False unless
the guard every diff binds says the patch is on. ``sm120_allreduce_fusion`` decides where each piece goes in the
release at hand; ``helper_block`` writes the helper for that release.
"""
from __future__ import annotations

import ast
import inspect

from sglang_pcie.patching import baked
from sglang_pcie.patching.engine import DIFF_MARKER
from sglang_pcie.patches.sm120_allreduce_fusion import payload as helper

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

# The helper, as code: read from its module's file, the lines from its (begin) comment to its (end) comment.
BEGIN = f"# {MARKER} (begin).\n"
END = f"# {MARKER} (end).\n"
ENTRY_POINTS = "_SGLANG_PCIE_FLASHINFER_ENTRY_POINTS"


def _helper_source() -> tuple[str, dict[str, str]]:
    """The helper's lines as its module has them, and the body (indented lines after the ``def``) of each of its
    module's functions."""
    source = inspect.getsource(helper)
    lines = source.splitlines(keepends=True)
    bodies = {node.name: "".join(lines[node.lineno:node.end_lineno]) for node in ast.parse(source).body
              if isinstance(node, ast.FunctionDef)}
    return source[source.index(BEGIN):source.index(END) + len(END)], bodies


HELPER_SOURCE, _BODIES = _helper_source()
# How the inserted helper asks whether the GPU is SM12x: written for the release at hand, through the name its
# check found there (the platform object from 0.5.19, SGLang's probe before), so that no fallback hides a rename.
IS_SM120_BY_PLATFORM = _BODIES[IS_SM120]
IS_SM120_BY_PROBE = _BODIES[f"{IS_SM120}_by_probe"]

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
    text = _replace_once(HELPER_SOURCE, f"{ENTRY_POINTS} = ()\n", f"{ENTRY_POINTS} = ({listed}\n)\n")
    text = _replace_once(text, f"def {IS_SM120}():\n{IS_SM120_BY_PLATFORM}", f"def {IS_SM120}():\n{is_sm120_body}")
    return _replace_once(text, f"def {OPTED_IN}():\n", baked.decorator(PATCH_ID) + f"def {OPTED_IN}():\n")


def _replace_once(text: str, old: str, new: str) -> str:
    if text.count(old) != 1:
        raise ValueError(f"{helper.__name__}: {old!r} is in the helper {text.count(old)} times, not once")
    return text.replace(old, new)
