"""One rank's measurement of FlashInfer's PCIe-IPC all-reduce (``PcieIpcAllReduceWorkspace``) in CUDA graphs, sums
checked, after loading its JIT modules one rank at a time and, when asked, running FlashInfer's own ``tune()`` into
the cache file SGLang's adapter reads. Runs in a worker process; FlashInfer is imported only here."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from sglang_pcie.tools.tune_nccl.measure import TIMED_REPLAYS, WARMUP_REPLAYS, pattern, phase, timed_replays


def jit_failure(exc: Exception) -> str:
    """The telling line of a FlashInfer JIT failure (ninja's "missing and no known rule", nvcc's first error), not
    the whole ninja transcript."""
    text = f"{type(exc).__name__}: {exc}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    telling = [line for line in lines if "error" in line.lower() and line != lines[0]]
    return (telling[0] if telling else lines[0] if lines else type(exc).__name__)[:300]


def ipc_jit_modules(tune: bool) -> list:
    """(name, loader) of each FlashInfer JIT module the IPC worker needs: the PCIe-IPC kernels, and for tune() the
    autotuner's delay kernel (module trtllm_utils: FlashInfer 0.7.2's autotuner launches it before timing every
    candidate; a failed load there counts each candidate as failed, so tune() saves nothing)."""
    from flashinfer.comm.pcie_ipc_ar import get_pcie_ipc_comm_module

    modules = [("pcie_ipc_comm", get_pcie_ipc_comm_module)]
    if tune:
        try:
            from flashinfer.tllm_utils import get_trtllm_utils_module
        except ImportError:  # a FlashInfer whose autotuner does not use it
            pass
        else:
            modules.append(("trtllm_utils", get_trtllm_utils_module))
    return modules


def _load_jit_module(name: str, load, rank: int, world: int) -> None:
    phase(f"JIT module {name}: build/load (rank {rank} of {world}, one rank at a time)")
    began = time.monotonic()
    try:
        load()
    except Exception as exc:
        why = jit_failure(exc)
        if name == "trtllm_utils":
            raise RuntimeError(
                f"FlashInfer's autotuner cannot load its JIT module trtllm_utils (the delay kernel it "
                f"launches before timing each candidate), so tune() would count every candidate as "
                f"failed and save nothing: {why}") from exc
        raise RuntimeError(f"FlashInfer's JIT module {name} failed to build/load: {why}") from exc
    phase(f"JIT module {name}: ready in {time.monotonic() - began:.1f} s")


def load_jit_modules_in_turn(dist, modules: list, rank: int, world: int) -> None:
    """Build/load the JIT modules one rank at a time (rank 0 first, a barrier after each turn), before any FlashInfer
    collective. FlashInfer's build_and_load takes a file lock per module and runs ninja in every fresh process (only
    AOT artifacts skip it); done here, no rank waits on that lock inside a collective its peers already entered,
    and only rank 0 ever compiles. A rank that fails raises after its turn; the parent then stops its peers."""
    for turn in range(world):
        if turn == rank:
            for name, load in modules:
                _load_jit_module(name, load, rank, world)
        dist.barrier()


def saved_configs(cache: str) -> int | None:
    """How many tuned configurations FlashInfer's cache file holds (its keys other than _metadata, _generation,
    _records); None when it cannot be read."""
    try:
        data = json.loads(Path(cache).read_text())
    except (OSError, ValueError):
        return None
    return sum(not key.startswith("_") for key in data) if isinstance(data, dict) else None


def _tune(torch, workspace, hidden: int, cache: str, report: dict) -> None:
    phase(f"tune() for hidden {hidden} (collective; FlashInfer builds its gloo group, rank 0 writes the cache)")
    began = time.monotonic()
    tuned = workspace.tune([hidden], dtype=torch.bfloat16)  # collective; rank 0 writes the cache file
    report["tuned_shapes"] = len(tuned)  # the shapes it measured, whether or not any candidate ran
    report["tune_s"] = round(time.monotonic() - began, 1)
    # tune() ends with a barrier after rank 0 wrote the file. It stores a winner per shape whenever one
    # candidate ran (a seed-equal winner too); none means every candidate failed, and the "tuned" figures below
    # would be the seed's.
    report["tune_saved"] = saved_configs(cache)
    phase(f"tune() done: {len(tuned)} shapes in {report['tune_s']} s; the cache holds "
          f"{'?' if report['tune_saved'] is None else report['tune_saved']} configurations")
    if report["tune_saved"] == 0:
        raise RuntimeError(f"tune() saved no configuration to {cache}: every candidate failed at every shape "
                           f"(FlashInfer logs 'Skipped N unsupported tactic(s)'; its debug log says why)")


def _workspace(torch, dist, spec: dict, rank: int, world: int, report: dict):
    """FlashInfer imported, its JIT modules loaded in turn, the workspace built (and tuned when the spec asks)."""
    phase("importing flashinfer")
    import flashinfer
    from flashinfer.comm import PcieIpcAllReduceWorkspace
    from flashinfer.comm.pcie_ipc_tuning import default_cache_path

    cache = str(default_cache_path(world))
    report.update(flashinfer=getattr(flashinfer, "__version__", None), tune_cache=cache)
    phase(f"flashinfer {report['flashinfer']} imported")
    load_jit_modules_in_turn(dist, ipc_jit_modules(bool(spec.get("tune"))), rank, world)
    phase(f"building the workspace (collective: max_numel "
          f"{spec['max_numel']}, tune_batches {spec['tune_batches']}, cache {cache})")
    workspace = PcieIpcAllReduceWorkspace(group=dist.group.WORLD, max_numel=spec["max_numel"],
                                          dtype=torch.bfloat16, tune_batches=spec["tune_batches"],
                                          tune_cache=cache)
    report["fabric"] = f"{workspace.profile} ({workspace.profile_reason})"[:200]
    phase(f"workspace built: {report['fabric']}")
    if spec.get("tune"):
        _tune(torch, workspace, spec["hidden"], cache, report)
    return workspace


class IpcReductions:
    """The out-of-place IPC all-reduces of one graph at one size, and their exact expected sums."""

    def __init__(self, torch, workspace, count: int, tokens: int, hidden: int, rank: int, world: int, device):
        numel = tokens * hidden
        self.torch, self.workspace, self.tokens, self.count = torch, workspace, tokens, count
        self.inputs = [pattern(torch, rank, i, numel, device).to(torch.bfloat16).view(tokens, hidden)
                       for i in range(count)]
        self.expected = [sum(pattern(torch, r, i, numel, device) for r in range(world)).to(torch.bfloat16)
                         .view(tokens, hidden) for i in range(count)]
        self.outputs = [torch.empty_like(x) for x in self.inputs]

    def check(self, stage: str) -> None:
        self.torch.cuda.synchronize()
        wrong = sum(not self.torch.equal(o, e) for o, e in zip(self.outputs, self.expected))
        if wrong:
            raise RuntimeError(f"wrong sums after {stage} at {self.tokens} tokens ({wrong} of {self.count} buffers)")

    def run(self) -> None:
        for x, out in zip(self.inputs, self.outputs):
            self.workspace.all_reduce(x, out=out)

    def clear(self) -> None:
        for out in self.outputs:
            out.zero_()


def _measure_size(torch, reductions: IpcReductions, stream, soak: int) -> float:
    """Microseconds per all-reduce at one size: eager, captured, replayed, timed, sums checked at each step."""
    tokens = reductions.tokens
    torch.cuda.synchronize()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        reductions.workspace.rebind_stream()  # earlier work is synchronised: moving the binding is safe
        reductions.run()
    reductions.check("eager all-reduce")
    phase(f"{tokens} tok: {reductions.count} eager all-reduces summed right; capturing them in a CUDA graph")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        reductions.run()
    phase(f"{tokens} tok: captured; first replay")
    reductions.clear()
    graph.replay()
    reductions.check("graph replay")
    phase(f"{tokens} tok: replay summed right; {WARMUP_REPLAYS} warm-up + {TIMED_REPLAYS} timed replays")
    milliseconds = timed_replays(torch, graph)
    for _ in range(soak):  # a long run of replays: no hang, and the sums still right after it
        graph.replay()
    reductions.clear()
    graph.replay()
    reductions.check("timed replays" + (f" and {soak} more" if soak else ""))
    us = statistics.median(milliseconds) * 1e3 / reductions.count
    phase(f"{tokens} tok: {us:.1f} us per all-reduce, sums right after the timed replays")
    del graph
    return us


def measure_ipc(torch, dist, spec: dict, rank: int, world: int, device, report: dict) -> dict:
    """FlashInfer's PCIe-IPC all-reduce at each size, in CUDA graphs, sums checked; None for a size it refuses.

    The collective contract (PcieIpcAllReduceWorkspace's docstring): every rank makes the same calls in the same
    order; one workspace serves one stream (rebind_stream() only after the previous stream's work is done);
    launch configurations are resolved (prepare) before any capture."""
    hidden, count = spec["hidden"], spec["allreduces"]
    workspace = _workspace(torch, dist, spec, rank, world, report)
    sizes = [t for t in spec["tokens"] if t * hidden <= spec["max_numel"]]
    phase(f"prepare() for {sizes} x {hidden} (collective)")
    workspace.prepare([(t, hidden) for t in sizes], dtype=torch.bfloat16)
    phase("prepared")
    stream = torch.cuda.Stream()
    results = {}
    for tokens in spec["tokens"]:
        probe = torch.empty((tokens, hidden), dtype=torch.bfloat16, device=device)
        if tokens not in sizes or not workspace.supports(probe):
            results[str(tokens)] = None
            continue
        reductions = IpcReductions(torch, workspace, count, tokens, hidden, rank, world, device)
        results[str(tokens)] = _measure_size(torch, reductions, stream, spec.get("soak", 0))
    # destroy() is collective (barriers): reached only on success, by every rank in the same order. A rank that
    # fails raises before it, exits, and the parent kills the group rather than leave a peer in a barrier.
    torch.cuda.synchronize()
    phase("destroy() (collective)")
    workspace.destroy()
    phase("done")
    return results
