"""Imports each module named in argv[1] (a JSON list) on its own, so that one failure does not hide the others, and reports the install."""
import importlib, json, sys
import sglang
import sglang_pcie, sglang_pcie.runtime.activate
errors = {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except BaseException as exc:
        errors[name] = f"{type(exc).__name__}: {exc}"
import torch
print(json.dumps({
    "sglang_version": sglang.__version__,
    "import_errors": errors,
    "cuda_available": torch.cuda.is_available(),
    "sgl_kernel_loaded": "sgl_kernel" in sys.modules,
    "sglang_pcie_file": sglang_pcie.__file__,
    "prefix": sys.prefix,
    "overlay_activated": sglang_pcie.runtime.activate._activated,
}))
