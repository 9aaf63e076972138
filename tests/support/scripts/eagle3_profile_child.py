"""The eagle3-profile patch in a real SGLang process: imports the real worker modules (the overlay activated by the
real .pth hook), reports how their methods look, then drives the real wrapped cycle methods on instances made without
__init__ (no GPU, no model). argv[1]: {module: path} of diffed copies of the worker modules (JSON); argv[2]: 1 when
EAGLE3_PROFILE=1."""
import contextlib, importlib, importlib.util, json, logging, os, sys, types
import sglang
DIFFED, PROFILING = json.loads(sys.argv[1]), sys.argv[2] == "1"
import torch
import sglang_pcie.runtime.activate as activate
from sglang_pcie.runtime import baked
from sglang_pcie.patches.eagle3_profile import payload as ep
from sglang_pcie.patching.engine import MARKER_ATTR
from sglang_pcie.patches.eagle3_profile.check import PATCH, TARGETS, V1, V2
from sglang_pcie.runtime.settings import for_process
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.managers.utils import GenerationBatchResult

out = {"settings_errors": [], "methods": {}, "diffed": {}}
modules = {}
for name in TARGETS:
    try:
        modules[name] = importlib.import_module(name)
    except ModuleNotFoundError:
        pass
out["modules"] = sorted(modules)
for name, module in modules.items():
    for cls_name, methods in TARGETS[name].items():
        for method in methods:
            fn = getattr(module, cls_name).__dict__[method]
            while getattr(fn, MARKER_ATTR, "eagle3-profile") != "eagle3-profile":  # another patch's outer wrapper
                fn = fn.__wrapped__  # (draft-token-watch wraps verify around the timer)
            inner = getattr(fn, "__wrapped__", None)
            out["methods"][f"{cls_name}.{method}"] = {
                "marker": getattr(fn, MARKER_ATTR, None), "phase": getattr(fn, "sglang_pcie_phase", None),
                "own_file": fn.__code__.co_filename == module.__file__,
                "inner_own_file": inner is not None and inner.__code__.co_filename == module.__file__}
out["activation"] = {key: r.status for key, r in activate.RESULTS.get("eagle3-profile", {}).items()}
out["switched_off"] = activate.SWITCHED_OFF.get("eagle3-profile")
out["check_runtime"] = PATCH.check_runtime(modules, for_process()).status
out["decorator_is_identity"] = baked.guard(PATCH.id)("draft")(len) is len  # the guard the diffs bind

# The versioned diff's source, executed as a module next to the real one.
for name, path in DIFFED.items():
    spec = importlib.util.spec_from_file_location(name, path)  # same name, not put in sys.modules
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    before = {f"{c}.{m}": getattr(module, c).__dict__[m] for c, ms in TARGETS[name].items() for m in ms}
    result = PATCH.apply(module, for_process()) if PROFILING else None
    out["diffed"][name] = {
        "phases": {k: getattr(f, "sglang_pcie_phase", None) for k, f in before.items()},
        "apply": [result.status, result.detail] if result else None,
        "unchanged_by_apply": all(getattr(module, k.split(".")[0]).__dict__[k.split(".")[1]] is f
                                  for k, f in before.items())}

captured = []
class Capture(logging.Handler):
    def emit(self, record):
        captured.append({"logger": record.name, "level": record.levelname, "message": record.getMessage()})
logging.getLogger("sglang.srt.speculative").addHandler(Capture())  # the worker modules' loggers propagate to it
for name in modules:
    logging.getLogger(name).setLevel(logging.INFO)

def stand_in(phase, returns=None):
    return ep.wrap(lambda self, *args, **kwargs: returns(*args) if returns else None, phase)

def ns(**kw):
    return types.SimpleNamespace(**kw)

def v1_worker(rank, server_args):
    m = modules[V1]
    w = object.__new__(m.EAGLEWorker)
    w.tp_rank = rank
    w.server_args = server_args
    w.draft_tp_context = lambda group: contextlib.nullcontext()
    w._model_runner = ns(tp_group=None)
    verify_output = ns(verified_id=torch.tensor([5, 6, 7]), accept_length_per_req_cpu=[1, 2, 0],
                       num_accepted_drafts_per_req_cpu=[1, 2, 0])
    w.draft = types.MethodType(stand_in("draft"), w)
    w.verify = types.MethodType(stand_in("verify", lambda b, s: (None, verify_output, None, True)), w)
    w.forward_draft_extend_after_decode = types.MethodType(stand_in("draft_extend"), w)
    # (logits, next token ids, seq lens) as in 0.5.9; 0.5.11 added can_run_cuda_graph
    w.forward_target_extend = lambda b: (ns(hidden_states=None, mm_input_embeds=None), torch.tensor([1]), None)
    w.forward_draft_extend = lambda *a: None
    def batch(mode):
        return ns(forward_mode=mode, is_extend_in_batch=False, reqs=[],
                  spec_info=ns(verified_id=torch.tensor([] if mode == ForwardMode.IDLE else [5, 6, 7])))
    return w, batch

def v2_worker(rank, server_args):
    m = modules[V2]
    w = object.__new__(m.EAGLEWorkerV2)
    d = object.__new__(m.EagleDraftWorker)
    if rank is not None:
        w.tp_rank = rank
    w.server_args = server_args
    w._draft_worker = d
    w.adaptive_controller = None
    w.speculative_num_steps = 3
    w.enable_dp_spec_prefill_coordination = False
    w.speculative_algorithm = ns(is_standalone=lambda: False)
    d.draft_tp_context = lambda group: contextlib.nullcontext()
    d.draft_runner = ns(tp_group=None)
    d.parallel_layout = ns(tp_group=None)
    d.draft = types.MethodType(stand_in("draft", lambda b: ns(is_verify_input=lambda: True, kv_loc_plan=None)), d)
    d._draft_extend_for_decode = types.MethodType(stand_in("draft_extend"), d)
    d._draft_extend_for_prefill = lambda *a, **k: None
    w.verify = types.MethodType(stand_in("verify", lambda b: GenerationBatchResult(
        accept_lens=torch.tensor([2, 3, 1], dtype=torch.int32))), w)
    w._target_worker = ns(forward_batch_generation=lambda *a, **k: GenerationBatchResult(
        logits_output=ns(hidden_states=None, mm_input_embeds=None), next_token_ids=torch.tensor([1])))
    def batch(mode):
        return ns(forward_mode=mode, is_extend_in_batch=False, seq_lens=torch.zeros(3), reqs=[],
                  spec_info=ns(is_verify_input=lambda: False))
    return w, batch

try:  # 0.5.16+: the cycle reads the pipeline-parallel size from SGLang's runtime context
    from sglang.srt.runtime_context import get_parallel
    get_parallel().override_permanently(pp_size=1)
except ImportError:
    pass

SCHEDULE = [ForwardMode.EXTEND] + [ForwardMode.DECODE] * 3 + [ForwardMode.IDLE] + [ForwardMode.DECODE] * 5

def drive(make, rank=0, metrics=False, schedule=SCHEDULE, flush=True):
    ep.set_profiler(None)
    profiler = ep.get_profiler()  # made from the environment, as in a server
    profiler.fixed_sample_every = profiler.sample_every = profiler._countdown = 1  # every cycle timed: exact figures
    del captured[:]
    server_args = ns(enable_dp_attention=False, enable_metrics=metrics, served_model_name="m")
    worker, batch = make(rank, server_args)
    results = [type(worker).forward_batch_generation(worker, batch(mode)).__class__.__name__ for mode in schedule]
    flushed = profiler.flush() if profiler.active and flush else None
    return {"results": results, "active": profiler.active, "records": list(profiler.records),
            "flushed": flushed is not None, "log": list(captured), "tp_rank_attr": hasattr(worker, "tp_rank")}

if PROFILING:
    makers = {"v1": v1_worker} if V1 in modules else {}
    makers["v2"] = v2_worker
    out["runs"] = {kind: drive(make) for kind, make in makers.items()}
    out["rank1"] = drive(lambda rank, args: v2_worker(1, args))
    saved = sys.modules.pop("prometheus_client", None)
    sys.modules["prometheus_client"] = None  # as if it were not installed
    out["no_prometheus"] = drive(v2_worker, metrics=True)
    del sys.modules["prometheus_client"]
    if saved is not None:
        sys.modules["prometheus_client"] = saved
    out["prometheus_run"] = drive(v2_worker, metrics=True)
    import prometheus_client
    out["prometheus"] = [line for line in prometheus_client.generate_latest().decode().splitlines()
                         if line.startswith("sglang_pcie_eagle_") and "_count" in line]
    try:  # 0.5.16+: v2 workers have no tp_rank; the rank is SGLang's runtime context's (its launcher publishes it)
        from sglang.srt.runtime_context import get_parallel
    except ImportError:
        get_parallel = None
    if get_parallel is not None:
        out["class_has_tp_rank"] = hasattr(modules[V2].EAGLEWorkerV2, "tp_rank")
        with get_parallel().override(tp_rank=1, tp_size=2):
            out["context_rank1"] = drive(lambda rank, args: v2_worker(None, args))
        with get_parallel().override(tp_rank=0, tp_size=2):
            out["context_rank0"] = drive(lambda rank, args: v2_worker(None, args))

    # EAGLE-family workers whose cycle the patch does not time warn once, naming the class, at their first cycle.
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    out["create_worker_marker"] = getattr(SpeculativeAlgorithm.__dict__["create_worker"], MARKER_ATTR, None)
    out["untimed"] = {}
    if hasattr(SpeculativeAlgorithm, "FROZEN_KV_MTP"):
        for label, algorithm, args in (("multi_layer", SpeculativeAlgorithm.EAGLE3, ns(enable_multi_layer_eagle=True)),
                                       ("frozen_kv_mtp", SpeculativeAlgorithm.FROZEN_KV_MTP, ns()),
                                       ("eagle3", SpeculativeAlgorithm.EAGLE3, ns(enable_multi_layer_eagle=False)),
                                       ("standalone", SpeculativeAlgorithm.STANDALONE, ns())):
            del captured[:]
            cls = algorithm.create_worker(args)
            timed = getattr(cls.forward_batch_generation, MARKER_ATTR, None) == "eagle3-profile"
            if not timed:  # run two cycles on a bare instance: SGLang's own method fails on it, after the flag
                worker = object.__new__(cls)
                for _ in range(2):
                    try:
                        cls.forward_batch_generation(worker, ns(forward_mode=ForwardMode.DECODE,
                                                                is_extend_in_batch=False))
                    except Exception:
                        pass
            function = cls.forward_batch_generation
            out["untimed"][label] = {
                "class": cls.__name__, "timed": timed,
                "warnings": [(e["logger"], e["level"], e["message"]) for e in captured
                             if "is not timed" in e["message"]],
                "own_method_back": function.__code__.co_filename == sys.modules[cls.__module__].__file__}

    # The last run stops mid-interval and is not flushed: the exit flush writes its partial interval.
    out["file_lines_before_exit"] = len(open(os.environ["EAGLE3_PROFILE_FILE"]).read().splitlines())
    out["exit_run"] = drive(v2_worker, schedule=[ForwardMode.DECODE] * 6, flush=False)
print(json.dumps(out))
