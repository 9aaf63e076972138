"""node-agreement: in a server that spans nodes, every node's NCCL and all-reduce-path settings are compared once,
when SGLang's world group exists and before NCCL's first collective; nodes that disagree are named, one line per
differing setting (and with SGLANG_PCIE_STRICT=1 the start stops) instead of hanging at some later message size.

Each node's launcher decides its NCCL settings from its own GPUs, tuned file and shell; NCCL ranks that disagree
on protocol or algorithm can hang at some sizes (NVIDIA/nccl#1136), and NCCL's maintainers ask that the environment
be set consistently on every rank (nccl#626).

The payload of the ``node-agreement`` patch (``sglang_pcie.patching.node_agreement``): ``wrap`` is installed over
SGLang's ``parallel_state.init_distributed_environment`` at import, and by the versioned diffs' guard
(``runtime/baked.py``), each handing it the settings the patch was gated with; ``agreeing`` is the decorator diffs
baked by older versions put on it. After the first call returns, ``check_once`` runs, and only where the launch
spans nodes (``SGLANG_PCIE_NNODES`` above 1, or a world larger than this node's GPUs); a one-node server inherits one
environment in every rank and is left alone (nothing gathered).

The settings travel through the store of torch's default process group (the TCP store every rank reached at
``init_process_group``), not through a collective: a node where this check does not run (no sglang-pcie, switched
off, an older version) leaves no record and is named after a bounded wait, where a collective on SGLang's CPU
group would block the others in a mismatched collective until the group's timeout (120 minutes).
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Iterable, Mapping

from sglang_pcie.runtime import launch as launches
from sglang_pcie.runtime.bounded_read import Unreadable, read_text
from sglang_pcie.runtime.results import StrictModeError, mark
from sglang_pcie.runtime.settings import IPC_VARS

PATCH_ID = "node-agreement"
PREFIX = f"sglang-pcie {PATCH_ID}"
KEY = "sglang-pcie/node-agreement/v2/rank-"  # one key per rank in the default store (v2: values carry digests)
WAIT_S = 60.0  # ranks reach the check within seconds of each other: gloo connected all of them just before
DECIDED_VAR = "SGLANG_PCIE_NCCL_DECIDED"  # runtime.nccl's, written by each node's launcher

# Every NCCL_* variable is compared between nodes (a variable this list does not know is still one the other node's
# NCCL may read), except those that name this host's own devices and files: those may differ from node to node,
# but not between the ranks of one node (NVIDIA/nccl#1478: NCCL_IB_HCA set per rank breaks NCCL's rings).
PER_NODE = {
    "NCCL_SOCKET_IFNAME": "names this host's network interfaces",
    "NCCL_IB_HCA": "names this host's InfiniBand / RoCE adapters and ports",
    "NCCL_IB_GID_INDEX": "indexes this host's RoCE GID table",
    "NCCL_TOPO_FILE": "describes this host's PCI / NIC topology",
    "NCCL_HOSTID": "this host's identity, as NCCL tells hosts apart",
}
# Never compared: outputs and logging, and the config file's path (the values it sets are compared instead).
EXCLUDED = {
    "NCCL_TOPO_DUMP_FILE": "where NCCL writes the topology it found",
    "NCCL_GRAPH_DUMP_FILE": "where NCCL writes the search graph it found",
    "NCCL_RAS_ADDR": "where this process's RAS monitor listens",
    "NCCL_CONF_FILE": "a path; the values the file sets are compared instead",
}
EXCLUDED_PREFIXES = {"NCCL_DEBUG": "logging only (NCCL_DEBUG, NCCL_DEBUG_SUBSYS, NCCL_DEBUG_FILE, ...)"}
# Besides NCCL's: SGLang's PCIe-IPC all-reduce switch and bound, and sglang-pcie's own decision.
ALLREDUCE_VARS = (*IPC_VARS, DECIDED_VAR)
# Names of the compared values that are not variables.
VERSIONS = ("sglang-pcie version", "sglang version", "NCCL version (torch's)")
CONF_PROBLEM = "NCCL config file"
# A record's bounds. Values are compared by a digest of the whole value (the text travels cut, to be shown), so
# equal settings compare equal whatever their length; the values a record cannot hold (past MAX_VALUES, or past
# MAX_RECORD_BYTES) are named as not compared, never as a difference.
MAX_VALUE_CHARS = 256  # of a value's text, a source's path and a name, as sent
MAX_VALUES = 512
MAX_RECORD_BYTES = 256 * 1024
DIGEST_CHARS = 32  # hex characters of sha256 sent (128 bits)
SHOWN_CHARS = 80
SHOWN_DIGEST_CHARS = 12

logger = logging.getLogger(__name__)
_checked = False  # the comparison runs once per process


def excluded(name: str) -> bool:
    return name in EXCLUDED or name.startswith(tuple(EXCLUDED_PREFIXES))


# -- what one rank compares

def conf_files(environ: Mapping[str, str], home: str | None = None) -> list[str]:
    """The files NCCL reads its variables from, in NCCL's order (src/misc/param.cc): ``NCCL_CONF_FILE`` or else
    ``~/.nccl.conf`` (the user's home from the password database, as NCCL finds it), then ``/etc/nccl.conf``."""
    user = environ.get("NCCL_CONF_FILE", "")
    if not user:
        if home is None:
            try:
                import pwd

                home = pwd.getpwuid(os.getuid()).pw_dir
            except (ImportError, KeyError):
                home = None
        user = os.path.join(home, ".nccl.conf") if home else ""
    return [path for path in (user, "/etc/nccl.conf") if path]


def read_conf(text: str) -> dict[str, str]:
    """``NAME=VALUE`` lines as NCCL reads them: '#' lines skipped, the name up to the first '=', the value after it
    with only its line end removed; the first setting of a name wins (NCCL's setenv does not overwrite)."""
    found: dict[str, str] = {}
    for line in text.split("\n"):
        if line.startswith("#") or "=" not in line:
            continue
        name, value = line.split("=", 1)
        found.setdefault(name[:1023], value[:1023])
    return found


def effective_values(environ: Mapping[str, str], files: Iterable[str] = (),
                     read: Callable[[str], str] = read_text) -> dict[str, tuple[str, str | None]]:
    """{name: (value, source)} of what decides NCCL's protocol, algorithm and transport in this process and SGLang's
    all-reduce path: the environment first (source None), then NCCL's config files (source: the file), as NCCL
    resolves them; EXCLUDED names left out (PER_NODE ones kept: they are compared within a node)."""
    values = {name: (value, None) for name, value in environ.items()
              if (name.startswith("NCCL_") and not excluded(name)) or name in ALLREDUCE_VARS}
    for path in files:
        try:
            text = read(path)
        except OSError:  # no such file, or not readable: NCCL's fopen fails alike and reads nothing from it
            continue
        except Unreadable as exc:
            values.setdefault(CONF_PROBLEM, (f"{path} not read: {exc}", None))
            continue
        for name, value in read_conf(text).items():
            if name.startswith("NCCL_") and not excluded(name):
                values.setdefault(name, (value, path))
    # An empty value is NCCL's default, as an unset one is (it still keeps a file's value out, as in NCCL).
    return {name: value for name, value in values.items() if value[0] != ""}


def versions() -> dict[str, tuple[str, None]]:
    """sglang-pcie's, SGLang's and NCCL's versions in this process (those that can be read)."""
    found = {VERSIONS[0]: getattr(sys.modules.get("sglang_pcie"), "__version__", None),
             VERSIONS[1]: getattr(sys.modules.get("sglang"), "__version__", None)}
    try:
        import torch.cuda.nccl

        found[VERSIONS[2]] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # torch built without NCCL: nothing to compare
        pass
    return {name: (str(value), None) for name, value in found.items() if value is not None}


def digest(text: str) -> str:
    """The digest values are compared by (sha256 of the UTF-8 text, as many hex characters as a record sends)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_CHARS]


def sent_name(name: str) -> str:
    """A name as a record holds it: cut past MAX_VALUE_CHARS, with the whole name's digest (equal names stay equal,
    names that differ only past the cut stay apart)."""
    longest = MAX_VALUE_CHARS + len("...(sha256 )") + DIGEST_CHARS  # a cut name's length: cutting it again keeps it
    return name if len(name) <= longest else f"{name[:MAX_VALUE_CHARS]}...(sha256 {digest(name)})"


@dataclass(frozen=True)
class Record:
    """One rank's settings. ``values``: name -> (text, source, length, digest): the value's text (cut where it
    came through a record), the file it came from (None: the environment), the whole value's length and digest.
    A 2-tuple (value, source) is completed from the value. ``cut``: how many of the rank's values its record could
    not hold (those past the last name it holds, in name order)."""
    rank: int
    host: str
    node: int | None  # node rank, where the launch says it
    values: dict
    cut: int = 0

    def __post_init__(self):
        whole = {name: (v if len(v) == 4 else (v[0], v[1], len(v[0]), digest(v[0]))) for name, v in self.values.items()}
        object.__setattr__(self, "values", whole)

    def to_json(self) -> bytes:
        """The record as sent: each text, source and name cut at MAX_VALUE_CHARS; values in name order, as many as
        fit MAX_VALUES and MAX_RECORD_BYTES (the rest counted in ``cut``)."""
        def cut(text):
            return None if text is None else text[:MAX_VALUE_CHARS]

        head = {"rank": self.rank, "host": cut(self.host), "node": self.node}
        budget = MAX_RECORD_BYTES - len(json.dumps({**head, "values": {}, "cut": 2 ** 63}).encode())
        values, size = {}, 0
        entries = sorted((sent_name(name), value) for name, value in self.values.items())
        for name, (text, source, length, hashed) in entries:
            entry = [cut(text), cut(source), length, hashed]
            cost = len(json.dumps({name: entry}).encode())  # a bound on its share: braces stand in for ", "
            if len(values) >= MAX_VALUES or size + cost > budget:
                break
            values[name] = entry
            size += cost
        return json.dumps({**head, "values": values, "cut": self.cut + len(entries) - len(values)},
                          sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> "Record":
        """A record another rank wrote; ValueError naming what is wrong."""
        if len(raw) > MAX_RECORD_BYTES:
            raise ValueError(f"{len(raw)} bytes (at most {MAX_RECORD_BYTES})")
        data = json.loads(raw.decode("utf-8"))

        def is_value(v):
            return (isinstance(v, list) and len(v) == 4 and isinstance(v[0], str) and (v[1] is None or
                    isinstance(v[1], str)) and isinstance(v[2], int) and isinstance(v[3], str))

        ok = (isinstance(data, dict) and isinstance(data.get("rank"), int) and isinstance(data.get("host"), str)
              and (data.get("node") is None or isinstance(data.get("node"), int))
              and isinstance(data.get("cut"), int) and data["cut"] >= 0
              and isinstance(data.get("values"), dict) and len(data["values"]) <= MAX_VALUES
              and all(isinstance(k, str) and is_value(v) for k, v in data["values"].items()))
        if not ok:
            raise ValueError("not a node-agreement record")
        return cls(data["rank"], data["host"], data["node"], {k: tuple(v) for k, v in data["values"].items()},
                   data["cut"])

    @functools.cached_property
    def last(self) -> str | None:
        """The last name (in name order) this record holds; None where it holds none."""
        return max(self.values) if self.values else None

    def holds(self, name: str) -> bool:
        """Whether this record speaks for ``name``: every name, unless values were cut (then those up to the
        last one it holds)."""
        return not self.cut or (self.last is not None and name <= self.last)


def node_rank(rank: int, world_size: int, environ: Mapping[str, str], argv: list[str] | None = None) -> int | None:
    """This node's rank: from the launch (SGLang's --node-rank, torch's GROUP_RANK, SLURM_NODEID), else
    rank // ranks-per-node where SGLANG_PCIE_NNODES divides the world."""
    others = {k: v for k, v in environ.items() if k != launches.NODES_VAR}
    found = launches.detect(sys.argv[1:] if argv is None else argv, others).node_rank
    if found is not None:
        return found
    try:
        nodes = int(environ.get(launches.NODES_VAR, ""))
    except ValueError:
        return None
    return rank // (world_size // nodes) if nodes > 0 and world_size % nodes == 0 else None


def own_record(rank: int, world_size: int, environ: Mapping[str, str]) -> Record:
    values = effective_values(environ, conf_files(environ))
    values.update(versions())
    return Record(rank, socket.gethostname(), node_rank(rank, world_size, environ), values)


# -- the comparison, on records

def ranks_text(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``ranks 0-2, 5``."""
    ordered, spans = sorted(ranks), []
    for r in ordered:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)
    return f"rank{'s' if len(ordered) > 1 else ''} {text}"


def node_of(record: Record) -> tuple:
    return (record.node if record.node is not None else -1, record.host)


def node_label(record: Record, ranks: Iterable[int]) -> str:
    name = f"node {record.node} ({record.host}, " if record.node is not None else f"{record.host} ("
    return f"{name}{ranks_text(ranks)})"


def shown(value: tuple | None) -> str:
    """A value as a line shows it: its text, cut past SHOWN_CHARS with its length and digest (two long values that
    differ only past the cut read apart), and the file it came from."""
    if value is None:
        return "unset"
    text, source, length, hashed = value
    if length <= SHOWN_CHARS:
        text = repr(text)
    else:
        text = f"{text[:SHOWN_CHARS]!r}... ({length} chars, sha256 {hashed[:SHOWN_DIGEST_CHARS]})"
        text = text.replace("'... (", "...' (", 1)
    return f"{text} from {source}" if source else text


def compared(records: list[Record]) -> list[str]:
    """The names every record speaks for (all of them, unless a record was cut: then those up to the first name
    past which some record holds nothing)."""
    names = {name for record in records for name in record.values}
    cut = [record for record in records if record.cut]
    if any(record.last is None for record in cut):
        return []
    horizon = min((record.last for record in cut), default=None)
    return sorted(name for name in names if horizon is None or name <= horizon)


def differences(records: list[Record]) -> dict[str, str]:
    """{name: its line} for each setting whose value is not the same on every rank (for PER_NODE names: on every
    rank of one node), the line naming each node (and its ranks) with its value; {} where all agree. Values are
    compared whole (by digest); sources (which file) are shown but are not a difference. Names some record could
    not hold are not compared (``cut_line`` says so)."""
    lines = {}
    for name in compared(records):
        def distinct(group):
            return len({(record.values.get(name) or (None,) * 4)[3] for record in group}) > 1

        if name in PER_NODE:
            by_node: dict[tuple, list[Record]] = {}
            for record in records:
                by_node.setdefault(node_of(record), []).append(record)
            shown_records = [r for group in by_node.values() if distinct(group) for r in group]
            where = "within a node (it may differ between nodes, not between the ranks of one)"
        else:
            shown_records = records if distinct(records) else []
            where = "between nodes"
        if not shown_records:
            continue
        groups: dict[tuple, list[Record]] = {}
        for record in sorted(shown_records, key=lambda r: (node_of(r), r.rank)):
            value = record.values.get(name)
            key = None if value is None else (value[1], value[3])  # the source and the whole value's digest
            groups.setdefault((node_of(record), key), []).append(record)
        parts = [f"{node_label(members[0], [m.rank for m in members])} {shown(members[0].values.get(name))}"
                 for members in groups.values()]
        lines[name] = f"{PREFIX}: {name} differs {where}: " + "; ".join(parts)
    return lines


def cut_line(records: list[Record]) -> str | None:
    """The line saying which settings were not compared because some record could not hold them; None where every
    record held all of its values."""
    cut = [r for r in records if r.cut]
    if not cut:
        return None
    counts = sorted({len(r.values) + r.cut for r in cut})
    held = sorted({len(r.values) for r in cut})
    last = min((r.last for r in cut if r.last is not None), default=None)
    total = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    first = f"{held[0]}" if len(held) == 1 else f"{held[0]}-{held[-1]}"
    after = f"settings after {last} were not compared" if last is not None else "none of their settings was compared"
    return (f"{PREFIX}: {ranks_text(r.rank for r in cut)} sent only their first {first} settings (by name) of {total} "
            f"(a record holds at most {MAX_VALUES} values and {MAX_RECORD_BYTES} bytes): {after}")


@dataclass(frozen=True)
class Verdict:
    lines: list  # the error lines (empty: every node agrees)
    differing: list  # the names of the settings that differ
    unknown: list  # ranks whose settings could not be compared (sent none, or nothing readable)
    nodes: int  # nodes that reported
    speaks: bool  # whether this rank logs the lines (the first rank of each node does)
    notes: list = ()  # warning lines: what could not be compared, never a difference (nor a reason to stop)


def verdict(own: Record, records: list[Record], missing: list[int], unreadable: dict[int, str], strict: bool,
            wait_s: float) -> Verdict:
    """The error lines for what the ranks reported: one per differing setting, one for ranks that sent nothing
    (or nothing readable), then one saying what it means."""
    found = differences(records)
    lines = list(found.values())
    if missing:
        lines.append(f"{PREFIX}: {ranks_text(missing)} sent no settings within {wait_s:g} s (sglang-pcie not active "
                     "there, node-agreement switched off, or an older sglang-pcie): their NCCL settings are unknown")
    lines += [f"{PREFIX}: rank {rank} sent an unreadable record ({problem})"
              for rank, problem in sorted(unreadable.items())]
    nodes = len({node_of(r) for r in records})
    unknown = sorted([*missing, *unreadable])
    if lines:
        what = [f"{len(found)} setting(s) differ between the {nodes} node(s) "
                f"{'that sent theirs' if unknown else 'of this server'}"] if found else []
        what += [f"the settings of {ranks_text(unknown)} could not be compared"] if unknown else []
        action = ("the start stops (SGLANG_PCIE_STRICT=1)" if strict else
                  "set the same values on every node (SGLANG_PCIE_STRICT=1 stops the start instead)")
        lines.append(f"{PREFIX}: {' and '.join(what)}; NCCL ranks that disagree on protocol, algorithm or transport "
                     f"can hang at some message sizes: {action}")
    first_of_node = min(r.rank for r in records if node_of(r) == node_of(own))
    notes = [line for line in [cut_line(records)] if line]
    return Verdict(lines, list(found), unknown, nodes, speaks=own.rank == first_of_node, notes=notes)


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
