"""node-agreement: in a server that spans nodes, every node's NCCL and all-reduce-path settings are compared once,
when SGLang's world group exists and before NCCL's first collective; nodes that disagree are named, one line per
differing setting (and with SGLANG_PCIE_STRICT=1 the start stops) instead of hanging at some later message size.

Each node's launcher decides its NCCL settings from its own GPUs, tuned file and shell; NCCL ranks that disagree
on protocol or algorithm can hang at some sizes (NVIDIA/nccl#1136), and NCCL's maintainers ask that the environment
be set consistently on every rank (nccl#626).

The payload of the ``node-agreement`` patch (``sglang_pcie.patches.node_agreement.check``): ``wrap`` is installed over
SGLang's ``parallel_state.init_distributed_environment`` at import, and by the versioned diffs' guard
(``runtime/baked.py``), each handing it the settings the patch was gated with; ``agreeing`` is the decorator diffs
baked by older versions put on it. After the first call returns, ``check_once`` runs, and only where the launch
spans nodes (``SGLANG_PCIE_NNODES`` above 1, or a world larger than this node's GPUs); a one-node server inherits one
environment in every rank and is left alone (nothing gathered).

The settings travel through the store of torch's default process group (the TCP store every rank reached at
``init_process_group``), not through a collective: a node where this check does not run (no sglang-pcie, switched
off, an older version) leaves no record and is named after a bounded wait, where a collective on SGLang's CPU
group would block the others in a mismatched collective until the group's timeout (120 minutes). What a rank
sends is ``agreement_record``'s; how the records are compared, ``agreement_verdict``'s.
"""
from __future__ import annotations

import functools
import logging
import os
import sys
from datetime import timedelta
from typing import Callable, Mapping

from sglang_pcie.runtime import launch as launches
from sglang_pcie.patches.node_agreement.record import PATCH_ID, PREFIX, Record, own_record
from sglang_pcie.patches.node_agreement.verdict import SHOWN_CHARS, Verdict, ranks_text, verdict
from sglang_pcie.runtime.results import StrictModeError, mark

# The logger's name from before the patch had its own folder: log filters and handlers keep working.
LOGGER = "sglang_pcie.runtime.agreement"

PACKAGE = "sglang.srt.distributed"  # star-imports parallel_state: callers import the hook from there
HOOK = "init_distributed_environment"
KEY = "sglang-pcie/node-agreement/v2/rank-"  # one key per rank in the default store (v2: values carry digests)
WAIT_S = 60.0  # ranks reach the check within seconds of each other: gloo connected all of them just before

logger = logging.getLogger(LOGGER)
_checked = False  # the comparison runs once per process


# -- the exchange, through the default process group's store

def exchange(store, rank: int, world_size: int, payload: bytes, wait_s: float) -> tuple[dict[int, bytes], list[int]]:
    """Write this rank's record and read every rank's, waiting at most ``wait_s`` for them: ({rank: record},
    ranks that wrote none). Never blocks another rank: a rank that never writes only delays the others by
    ``wait_s``. Returns once every rank that wrote has read (bounded alike): the store lives in rank 0's process,
    which may stop right after (SGLANG_PCIE_STRICT=1)."""
    keys = [f"{KEY}{r}" for r in range(world_size)]
    store.set(keys[rank], payload)
    _wait(store, keys, wait_s)
    present = [r for r in range(world_size) if r == rank or store.check([keys[r]])]
    try:
        values = store.multi_get([keys[r] for r in present])
    except (AttributeError, RuntimeError, NotImplementedError):  # a store without the extended API
        values = [store.get(keys[r]) for r in present]
    store.set(f"{KEY}read-{rank}", b"1")
    _wait(store, [f"{KEY}read-{r}" for r in present], wait_s)
    return dict(zip(present, values)), [r for r in range(world_size) if r not in present]


def _wait(store, keys: list[str], wait_s: float) -> None:
    try:
        store.wait(keys, timedelta(seconds=wait_s))
    except RuntimeError:  # torch's DistStoreError on timeout: the caller sees which keys are there
        pass


def agree(store, rank: int, world_size: int, environ: Mapping[str, str], strict: bool,
          wait_s: float | None = None) -> Verdict:
    """Compare this rank's settings with every other rank's; log the lines (the first rank of each node), and
    raise StrictModeError on every rank where they differ and ``strict``. Every rank compares the records as sent,
    its own included (read back as the others read it): every rank sees the same records and says the same."""
    wait_s = WAIT_S if wait_s is None else wait_s
    payload = own_record(rank, world_size, environ).to_json()
    own = Record.from_json(payload)  # within bounds by construction
    raw, missing = exchange(store, rank, world_size, payload, wait_s)
    records, unreadable = [], {}
    for other, sent in sorted(raw.items()):
        try:
            records.append(own if other == rank else Record.from_json(bytes(sent)))
        except ValueError as exc:  # json's errors are ValueErrors too
            unreadable[other] = str(exc)[:SHOWN_CHARS]
    result = verdict(own, records, missing, unreadable, strict, wait_s)
    if result.speaks:
        for line in result.lines:
            logger.error(line)
        for line in result.notes:
            logger.warning(line)
    if result.lines and strict:
        what = [", ".join(result.differing)] if result.differing else []
        what += [f"the settings of {ranks_text(result.unknown)} unknown"] if result.unknown else []
        raise StrictModeError(f"sglang-pcie: SGLANG_PCIE_STRICT=1 and the nodes of this server disagree: "
                              f"{'; '.join(what)} (the {PATCH_ID} lines name each node's value)")
    return result


# -- when: once, after SGLang's world group exists, where the launch spans nodes

def spans_nodes(world_size: int, environ: Mapping[str, str], local_gpus: int | None) -> str | None:
    """Why this world spans nodes, or None: the launcher's SGLANG_PCIE_NNODES, or more ranks than GPUs here."""
    try:
        nodes = int(environ.get(launches.NODES_VAR, "").strip())
    except ValueError:
        nodes = 0
    if nodes > 1:
        return f"{launches.NODES_VAR}={nodes}"
    if local_gpus and world_size > local_gpus:
        return f"a world of {world_size} ranks and {local_gpus} GPU(s) on this node"
    return None


def local_gpu_count(environ: Mapping[str, str]) -> int | None:
    """GPUs this process sees; None where that does not count the node's (one visible device per process)."""
    if environ.get("SGLANG_ONE_VISIBLE_DEVICE_PER_PROCESS", "").strip().lower() in ("1", "true", "yes", "on"):
        return None
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else None
    except Exception:
        return None


def check_once(environ: Mapping[str, str] | None = None, settings=None) -> Verdict | None:
    """The comparison, the first time SGLang's world group is set up in this process; None where it did not run.
    ``settings``: those the patch was gated with (``SGLANG_PCIE_STRICT``); None (a direct call): the process's."""
    global _checked
    if _checked:
        return None
    _checked = True
    import torch.distributed as dist

    env = os.environ if environ is None else environ
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    world_size = dist.get_world_size()
    if spans_nodes(world_size, env, local_gpu_count(env)) is None:
        return None
    if settings is None:
        from sglang_pcie.runtime.settings import for_process

        settings = for_process()
    strict = settings.strict
    try:
        return agree(dist.distributed_c10d._get_default_store(), dist.get_rank(), world_size, env, strict)
    except StrictModeError:
        raise
    except Exception as exc:  # the comparison itself failed: said once, never a reason to stop unless strict
        message = f"{PREFIX}: NCCL settings of the nodes not compared: {type(exc).__name__}: {exc}"
        if strict:
            raise StrictModeError(f"sglang-pcie: SGLANG_PCIE_STRICT=1 and {message}") from exc
        logger.warning(message)
        return None


def runtime_problem() -> str | None:
    """Why the comparison cannot run with this torch, or None."""
    try:
        from torch.distributed import distributed_c10d
    except ImportError as exc:
        return f"torch.distributed does not import: {exc}"
    if not callable(getattr(distributed_c10d, "_get_default_store", None)):
        return "torch.distributed has no _get_default_store (the store the nodes' settings travel through)"
    return None


def hook_problem(parallel_state) -> str | None:
    """Why the hook (``runtime/patch_table.py``) would not be in effect: a torch without the store the nodes'
    settings travel through, or ``sglang.srt.distributed`` (which star-imports ``parallel_state``, callers import
    the hook from there) holding another function than ``parallel_state`` does (bound before the hook ran)."""
    problem = runtime_problem()
    if problem:
        return problem
    package = sys.modules.get(PACKAGE)
    function = getattr(parallel_state, HOOK, None)
    if package is not None and getattr(package, HOOK, function) is not function:
        return f"{PACKAGE}.{HOOK} was bound before the hook ran: its callers get the unwrapped function"
    return None


def wrap(init_distributed_environment: Callable, settings=None) -> Callable:
    """SGLang's init_distributed_environment, followed (the first time) by the comparison, under ``settings`` (those
    the patch was gated with; None: the process's)."""
    @functools.wraps(init_distributed_environment)
    def init_distributed_environment_then_agree(*args, **kwargs):
        result = init_distributed_environment(*args, **kwargs)
        if not kwargs.get("recovered_rank"):  # an elastic-EP joiner: the others compared at their own start
            check_once(settings=settings)
        return result
    return mark(init_distributed_environment_then_agree, PATCH_ID)


def agreeing(init_distributed_environment: Callable) -> Callable:
    """The decorator diffs baked by older versions put on init_distributed_environment: what the one guard of the
    baked diffs gives (``wrap`` unless the patch is switched off: the gate activation asks)."""
    from sglang_pcie.runtime import baked

    return baked.guarded(PATCH_ID, init_distributed_environment)
