"""sm120-allreduce-fusion not opted in, in a real SGLang 0.5.23 process: SGLang's own gate, resolver and messages."""
import importlib, json
from pathlib import Path
import sglang
from sglang_pcie.runtime import activate
from sglang_pcie.runtime import code_swap
from sglang_pcie.patches.sm120_allreduce_fusion import check as sm120
state = {"switched_off": activate.SWITCHED_OFF.get(sm120.PATCH_ID)}
for module_name, gate_name in sm120.GATE_LOCATIONS:
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        continue
    if hasattr(module, gate_name):
        gate = getattr(module, gate_name)
        compiled = compile(Path(module.__file__).read_text(), module.__file__, "exec")
        state.update({"own_code": gate.__code__ == code_swap.code_of(compiled, gate_name),
                      "helper": hasattr(module, sm120.HELPER),
                      "marked": hasattr(gate, "__sglang_pcie_patch__")})
        break
fusion = importlib.import_module(sm120.FUSION)
compiled = compile(Path(fusion.__file__).read_text(), fusion.__file__, "exec")
state["resolver_own_code"] = fusion._resolve_backend.__code__ == code_swap.code_of(compiled, "_resolve_backend")
from sglang.srt.runtime_context import override_platform
with override_platform(is_sm90=False, is_sm100=False, is_sm120=True):  # an SM120 machine
    try:
        fusion._resolve_backend("auto", False)
        state["resolver_on_sm120"] = "returned"
    except ValueError as exc:
        state["resolver_on_sm120"] = str(exc)
print(json.dumps(state))
