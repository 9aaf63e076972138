"""sm120-allreduce-fusion's helper: whether SM120 joins FlashInfer's all-reduce fusion, decided once per process.

Code that runs inside SGLang, but never imported there under this name:
``patches/sm120_allreduce_fusion/check_inserted.py`` reads the
lines from the ``(begin)`` comment below to the ``(end)`` comment from this file and inserts them into the release's
flashinfer_comm_fusion module, for the baked diffs and for the runtime code swap alike. So they are self-contained
(a versioned diff must work without sglang-pcie installed): module-level code imports nothing, each function imports
what it uses, from the release, FlashInfer and torch only.

Written as for 0.5.19 and later; ``helper_block`` fits the text to the release at hand:

* ``_SGLANG_PCIE_FLASHINFER_ENTRY_POINTS`` becomes the ``flashinfer.comm`` functions the release calls;
* ``_sglang_pcie_sm120_opted_in`` gains the guard's decorator, which answers True where the patch is on;
* before 0.5.19 (no platform object) ``_sglang_pcie_is_sm120`` takes the body of ``_sglang_pcie_is_sm120_by_probe``.
"""


# sglang-pcie: sm120-allreduce-fusion (begin).
# SM120 (RTX PRO 6000 Blackwell) joins SM90/SM100 in FlashInfer's all-reduce fusion only when the user opted
# in (SGLang's own fusion option and SGLANG_PCIE_SM120_FUSION=1) and the fused kernel can run: peer-to-peer
# access between the GPUs, and a FlashInfer with SM12x kernels for its TRT-LLM all-reduce (FlashInfer PR
# #3903) and the entry points this release calls. Not opted in, switched off (SGLANG_PCIE_DISABLE=1,
# SGLANG_PCIE_DISABLE_PATCHES) or without sglang-pcie, nothing here changes what SGLang does or logs.
# Decided once per process and the same way on every TP rank (all of them see the same GPUs): a rank that
# alone fell back to NCCL would hang its peers.
_SGLANG_PCIE_FLASHINFER_ENTRY_POINTS = ()
_sglang_pcie_sm120_fusion = None  # the decision, once made


def _sglang_pcie_sm120_opted_in():
    return False  # SGLang's own answer; where the patch is on, its guard answers True instead


def _sglang_pcie_is_sm120():
    from sglang.srt.runtime_context import get_platform

    return bool(get_platform().is_sm120)


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


# Not inserted: the body _sglang_pcie_is_sm120 takes in releases before 0.5.19, which ask SGLang's probe.
def _sglang_pcie_is_sm120_by_probe():
    from sglang.srt.utils import is_sm120_supported

    return bool(is_sm120_supported())
