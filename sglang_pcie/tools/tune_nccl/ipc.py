"""The PCIe-IPC all-reduce (FlashInfer), measured in the sweep's workers at the decode sizes and judged against the
NCCL the server would run: where it is measured, its two runs (the first runs FlashInfer's tune()), its verdict, and
a last tune() for the workspace the server will build."""
from __future__ import annotations

from sglang_pcie.runtime import allreduce
from sglang_pcie.tools.tune_nccl import verdict as rule
from sglang_pcie.tools.tune_nccl.launch import format_run, format_tails, progress, run_profile
from sglang_pcie.tools.tune_nccl.measure import IPC_NAME
from sglang_pcie.tools.tune_nccl.sweep import later_timeout

# What a run's workers report about FlashInfer, copied into the tuned file's ipc section.
REPORTED = ("flashinfer", "tune_cache", "fabric", "tuned_shapes", "tune_s", "tune_saved")


def ipc_unavailable(world: int, args, install=None) -> str | None:
    """Why the IPC path is not measured here; None when it is."""
    if args.ipc == "off":
        return "--ipc off"
    if args.nnodes > 1:
        return f"SGLang's adapter serves the GPUs of one node (--nnodes {args.nnodes})"
    if args.dtype != "bf16":
        return f"SGLang's adapter serves bf16 only (--dtype {args.dtype})"
    if world not in allreduce.IPC_WORLD_SIZES:
        return f"its kernels support {allreduce.IPC_WORLD_SIZES} ranks, not {world}"
    if args.backend != "nccl" and args.ipc != "on":
        return "--backend gloo has no CUDA"
    install = install or allreduce.flashinfer_install()
    if not install.has_kernels and args.ipc != "on":
        return (f"FlashInfer {install.version} has no PCIe-IPC all-reduce (needs >= {allreduce.FLASHINFER_MIN})"
                if install.where else "FlashInfer is not installed here")
    return None


def sglang_tune_ladder(max_rows: int) -> list[int]:
    """The row counts SGLang's adapter (0.5.21-0.5.23) asks FlashInfer to tune for a workspace of ``max_rows``:
    powers of two up to 512 that fit, plus ``max_rows`` itself. The tuner uses the same ladder and workspace size
    so that the cache entries it writes are the ones the server looks up (FlashInfer keys them by max_numel)."""
    rows = [r for r in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if r <= max_rows]
    return rows + ([max_rows] if max_rows not in rows else [])


class _IpcRuns:
    """Runs of the IPC path's workers, each reported on stderr; what they say about FlashInfer (and the stderr of
    the first that failed) lands in ``result``."""

    def __init__(self, spec: dict, world: int, command: list[str], result: dict):
        self.spec, self.world, self.command, self.result = spec, world, command, result

    def run(self, tune: bool, max_rows: int, tokens: list[int], label: str, bound: float):
        hidden = self.spec["hidden"]
        ipc_spec = dict(self.spec, path=IPC_NAME, tokens=tokens, dtype="bf16", tune=tune,
                        max_numel=max_rows * hidden, tune_batches=sglang_tune_ladder(max_rows))
        progress(f"[{IPC_NAME}] {label}")
        outcome = run_profile({}, ipc_spec, self.world, bound, self.command)
        progress(f"[{IPC_NAME}] {label}: {format_run(outcome)}")
        if outcome.stderr_tails:  # a failure or hang: what the ranks wrote last, here and in the tuned file
            progress(f"[{IPC_NAME}] the ranks' stderr ends:\n{format_tails(outcome.stderr_tails)}")
            self.result.setdefault("stderr_tails", {str(r): lines for r, lines in outcome.stderr_tails.items()})
        for key in REPORTED:
            if key in outcome.info:
                self.result[key] = outcome.info[key]
        return outcome


def _rounded(run: dict | None) -> dict | None:
    return None if run is None else {str(t): (None if v is None else round(v, 2)) for t, v in run.items()}


def run_ipc(spec: dict, world: int, decode: list[int], nccl_us: dict, noise: dict, timeout: float,
            worker_command: list[str]) -> dict:
    """Measure the IPC path twice (the first run JIT-builds the kernels and runs FlashInfer's tune(); the second
    reads the tuned cache), judge it per size against ``nccl_us``, and when it wins only up to a smaller size,
    tune once more for the workspace the server will build (FlashInfer keys its cache by workspace size)."""
    hidden, top = spec["hidden"], max(decode)
    result = {"hidden": hidden, "dtype": "bf16", "tokens": decode, "runs": [], "max_tokens": None,
              "max_numel": None}
    runs = _IpcRuns(spec, world, worker_command, result)
    first = runs.run(True, top, decode, f"run 1: JIT build + FlashInfer tune() for {top} x {hidden}, then measure",
                     timeout)
    measured = [first.us]
    if first.us is not None:
        second = runs.run(False, top, decode, "run 2: tuned launch configurations from the cache",
                          later_timeout(timeout, first.wall_s))
        measured.append(second.us)
        if second.error:
            result.setdefault("error", second.error)
    else:
        result["error"] = first.error
    result["runs"] = [_rounded(run) for run in measured]
    reference = {t: nccl_us.get(t) for t in decode}
    judged = rule.ipc_verdict(reference, noise, measured)
    result["nccl_us"] = _rounded(reference)  # what it had to beat: the winning NCCL profile's fastest run
    result["wins"] = {str(t): won for t, won in judged["wins"].items()}
    result["worst"] = _rounded(judged["worst"])
    result["too_noisy"] = judged["undecided"]
    best = judged["max_tokens"]

    def why_not(size):
        return (f"NCCL's noise at {size} tok is unknown or above {rule.MAX_NOISE:.0%}" if size in judged["undecided"]
                else f"not faster than NCCL beyond the noise at {size} tok")

    if result.get("error"):
        result["verdict"] = f"the PCIe-IPC all-reduce failed here ({result['error']})"
    elif best is None:
        result["verdict"] = f"the PCIe-IPC all-reduce does not win here: {why_not(min(decode))}"
    else:
        result["max_tokens"], result["max_numel"] = best, best * hidden
        result["verdict"] = (f"the PCIe-IPC all-reduce beats NCCL at every measured size up to {best} tok"
                             + ("" if best == top else f" ({why_not(min(t for t in decode if t > best))})"))
        result["tuned_max_numel"] = top * hidden if first.us is not None else None
        if best != top:
            again = runs.run(True, best, [best], f"tune() again for the server's workspace ({best} x {hidden})",
                             timeout)
            result["tuned_max_numel"] = best * hidden if again.us is not None else result["tuned_max_numel"]
    return result
