"""Which patches act in a real SGLang whose sources carry the versioned diffs (PYTHONPATH: the baked copy), under
the switches of this process. argv[1]: "installed", or "absent" to run as if sglang-pcie were not installed (its
start-up finder taken out, its package unimportable). Prints {patch id: acting}, the files imported and what of
sglang-pcie was loaded."""
import importlib, json, sys

MARKER_ATTR = "__sglang_pcie_patch__"  # runtime.results.MARKER_ATTR, spelled out: sglang_pcie may be absent here
if sys.argv[1] == "absent":
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__module__ != "sglang_pcie_startup"]
    sys.modules["sglang_pcie"] = None  # every `import sglang_pcie...` raises ImportError

import sglang  # noqa: E402


def member(module, cls, name):
    return vars(getattr(importlib.import_module(module), cls))[name]


def sm120():
    """What the diff's opt-in stub answers, and its mark, in the module that hosts the helper on this release."""
    for name in ("sglang.srt.layers.flashinfer_comm_fusion", "sglang.srt.layers.communicator"):
        stub = getattr(importlib.import_module(name), "_sglang_pcie_sm120_opted_in", None)
        if stub is not None:
            return stub() is True and getattr(stub, MARKER_ATTR, None) == "sm120-allreduce-fusion"
    raise SystemExit("no _sglang_pcie_sm120_opted_in: the sm120 diff is not baked in")


targets = {
    "eagle3-profile": lambda: member("sglang.srt.speculative.eagle_worker_v2", "EAGLEWorkerV2", "verify"),
    "drafter-delegation": lambda: member("sglang.srt.model_executor.model_runner", "ModelRunner", "load_model"),
    "accept-length-alarm": lambda: member("sglang.srt.managers.tokenizer_manager", "TokenizerManager",
                                          "_calculate_spec_decoding_metrics"),
    "draft-token-watch": lambda: member("sglang.srt.speculative.eagle_worker_v2", "EAGLEWorkerV2", "verify"),
    "node-agreement": lambda: vars(importlib.import_module("sglang.srt.distributed.parallel_state"))[
        "init_distributed_environment"],
}
acting = {"sm120-allreduce-fusion": sm120()}
def marked(obj, patch_id):
    """The mark on obj or on what it wraps (two patches may wrap one method)."""
    while obj is not None:
        if getattr(obj, MARKER_ATTR, None) == patch_id:
            return True
        obj = getattr(obj, "__wrapped__", None)
    return False


for patch_id, get in targets.items():
    acting[patch_id] = marked(get(), patch_id)
print(json.dumps({"acting": acting, "sglang": sglang.__file__,
                  "sglang_pcie_loaded": sorted(n for n, m in sys.modules.items()
                                               if n.split(".")[0] == "sglang_pcie" and m is not None)}))
