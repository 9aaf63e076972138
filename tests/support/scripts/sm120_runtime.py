"""sm120-allreduce-fusion in a real SGLang process (opted in): the gate patched, its callers holding the same function, the committed diff compiling to the code running here. argv[1]: the modules that import the gate by name (JSON list); SM120_TEST_DIFF: the diff."""
import contextlib, importlib, json, logging, os, subprocess, sys, tempfile, types
from pathlib import Path
import torch
import sglang
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.patching.engine import is_patched
from sglang_pcie.runtime import code_swap
from sglang_pcie.patches.sm120_allreduce_fusion import check as sm120
from sglang_pcie.patches.sm120_allreduce_fusion import check_inserted as inserted
from sglang_pcie.runtime.settings import for_process

report = {}
fusion = importlib.import_module(sm120.FUSION)
for module_name, gate_name in sm120.GATE_LOCATIONS:
    try:
        gate_module = importlib.import_module(module_name)
    except ImportError:
        continue
    if hasattr(gate_module, gate_name):
        break
gate = getattr(gate_module, gate_name)
helper_module = sys.modules[getattr(gate_module, sm120.HELPER).__module__]
report["gate"] = f"{gate_module.__name__}.{gate_name}"
report["helper_host"] = helper_module.__name__
report["gate_patched"] = is_patched(gate, sm120.PATCH_ID)
report["check_runtime"] = sm120.PATCH.check_runtime({m: sys.modules[m] for m in sm120.PATCH.targets
                                                     if m in sys.modules}, for_process()).status
# Modules that imported the gate by name hold the very same (patched) function object.
report["callers"] = {}
for caller in json.loads(sys.argv[1]):
    report["callers"][caller] = getattr(importlib.import_module(caller), gate_name) is gate

# The committed diff, applied to a copy of the installed files, compiles to the code running here.
root = Path(sglang.__file__).parent.parent
diff = os.environ["SM120_TEST_DIFF"]
with tempfile.TemporaryDirectory() as tmp:
    touched = [l[6:].strip() for l in Path(diff).read_text().splitlines() if l.startswith("+++ b/")]
    for rel in touched:
        (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
        (Path(tmp) / rel).write_text((root / rel).read_text())
    subprocess.run(["patch", "-p1", "--fuzz=0", "--batch", "-s", "-i", diff], cwd=tmp, check=True)
    same = {}
    for module in (gate_module, fusion):
        rel = Path(module.__file__).relative_to(root).as_posix()
        if rel not in touched:
            continue
        new = (Path(tmp) / rel).read_text()
        changed, added = code_swap.top_level_changes(Path(module.__file__).read_text(), new)
        compiled = compile(new, "diff", "exec", dont_inherit=True)
        for name in changed:
            same[name] = getattr(module, name).__code__.co_code == code_swap.code_of(compiled, name).co_code
        for name in code_swap.function_names(added):
            value = getattr(module, name)
            same[name] = (value.__code__.co_code == code_swap.code_of(compiled, name).co_code
                          if isinstance(value, types.FunctionType) and value.__module__ == module.__name__
                          else value is getattr(helper_module, name))
report["diff_code_matches_live_code"] = same

pristine_gate = types.FunctionType(
    code_swap.code_of(compile(Path(gate_module.__file__).read_text(), gate_module.__file__, "exec"), gate_name),
    gate_module.__dict__)

records = []
class Capture(logging.Handler):
    def emit(self, record):
        records.append([record.levelname, record.getMessage()])
log = logging.getLogger(inserted.LOGGER_NAME)
log.addHandler(Capture())
log.setLevel(logging.INFO)
peer_queries = []

@contextlib.contextmanager
def machine(gpu, opt_in=True, peer=True, sm12x_kernels=None):
    """Simulate the GPU (SM capability), peer access and the opt-in; forget the helper's decision."""
    saved = dict(gate_module.__dict__), dict(helper_module.__dict__), dict(fusion.__dict__)
    gate_module._is_sm90_supported, gate_module._is_sm100_supported = gpu == "sm90", gpu == "sm100"
    helper_module._sglang_pcie_sm120_fusion = None
    if sm12x_kernels is not None:  # this FlashInfer's build spec, as if it had / lacked SM12x kernels
        helper_module._sglang_pcie_trtllm_allreduce_majors = lambda spec: [9, 10, 12] if sm12x_kernels else [9, 10]
    torch.cuda.device_count = lambda: 2
    torch.cuda.can_device_access_peer = lambda a, b: peer_queries.append((a, b)) or peer
    # The opt-in as the diff's guard answered it at import (the runtime's gate): on here, off for a baked diff
    # whose gate said no.
    helper_module._sglang_pcie_sm120_opted_in = lambda: opt_in
    facts = dict(is_sm90=gpu == "sm90", is_sm100=gpu == "sm100", is_sm120=gpu == "sm120")
    try:
        from sglang.srt.runtime_context import override_platform
        context = override_platform(**facts)
    except ImportError:
        import sglang.srt.utils as utils
        for fact, value in facts.items():
            setattr(utils, f"{fact}_supported", lambda value=value: value)
        context = contextlib.nullcontext()
    del records[:]
    with context:
        yield
    for module, state in zip((gate_module, helper_module, fusion), saved):
        module.__dict__.clear()
        module.__dict__.update(state)

def configure(backend="auto", dp=False, flashinfer=True, unavailable=False, cp_size=1):
    """The gate's other inputs, through the module globals it reads."""
    args = types.SimpleNamespace(enable_flashinfer_allreduce_fusion=backend is not None,
                                 flashinfer_allreduce_fusion_backend=backend, attn_cp_size=cp_size)
    inputs = {"_is_flashinfer_available": flashinfer, "is_dp_attention_enabled": lambda: dp,
              "is_flashinfer_allreduce_unavailable": lambda: unavailable,
              "get_global_server_args": lambda: args, "get_server_args": lambda: args,
              "get_exec": lambda: types.SimpleNamespace(comm=args),
              "uses_cutedsl_ar_fusion": lambda: backend == "cutedsl"}
    for name in gate.__code__.co_names:
        if name in inputs:
            setattr(gate_module, name, inputs[name])

def scenario(name, gpu, calls=3, **conditions):
    with machine(gpu, **conditions):
        configure()
        answers = [gate(16) for _ in range(calls)]
        report[name] = {"gate": answers, "log": list(records)}
        if hasattr(fusion, sm120.RESOLVER):
            try:
                report[name]["resolver_auto"] = fusion._resolve_backend("auto", False)
            except ValueError as exc:
                report[name]["resolver_auto"] = f"ValueError: {exc}"

scenario("sm120_real_flashinfer", "sm120")
scenario("sm120_ready", "sm120", sm12x_kernels=True)
del peer_queries[:]
with machine("sm120", sm12x_kernels=True):
    configure()
    first = gate(16)
    torch.cuda.can_device_access_peer = lambda a, b: False  # a later change is not seen: decided once
    report["decided_once"] = [first, gate(16), gate(1), len(peer_queries)]
scenario("sm120_no_opt_in", "sm120", opt_in=False, sm12x_kernels=True)
scenario("sm120_no_peer_access", "sm120", peer=False, sm12x_kernels=True)
scenario("sm120_no_sm12x_kernels", "sm120", sm12x_kernels=False)

# Every configuration on every simulated machine: the patched gate against the release's own function.
table = {"equal_off_sm120": True, "sm120_as_sm90": True, "pristine_sm120_never": True, "cases": 0}
configurations = [dict(backend=b, dp=d, flashinfer=f, unavailable=u, cp_size=c)
                  for b in (None, "auto", "cutedsl") for d in (False, True) for f in (False, True)
                  for u in (False, True) for c in (1, 2)]
for configuration in configurations:
    for batch_size in (0, 1, 2048, 2049):
        answers = {}
        for gpu in ("sm90", "sm100", "sm89", "sm120"):
            with machine(gpu, sm12x_kernels=True):
                configure(**configuration)
                answers[gpu] = (gate(batch_size), pristine_gate(batch_size))
        table["cases"] += 1
        for gpu in ("sm90", "sm100", "sm89"):
            patched, pristine = answers[gpu]
            table["equal_off_sm120"] &= patched == pristine and type(patched) is type(pristine)
        table["sm120_as_sm90"] &= answers["sm120"][0] == answers["sm90"][1]
        table["pristine_sm120_never"] &= not answers["sm120"][1]
report["truth_table"] = table
print(json.dumps(report))
