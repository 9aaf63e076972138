"""node-agreement's record: what one rank compares (its NCCL variables, from the environment and NCCL's config
files as NCCL resolves them, SGLang's all-reduce switches, the versions) and the record that carries them to the
other ranks, bounded in values and bytes, each value compared by a digest of the whole of it.

``agreement`` exchanges the records and ``agreement_verdict`` compares them.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import sys
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from sglang_pcie.runtime import launch as launches
from sglang_pcie.runtime.bounded_read import Unreadable, read_text
from sglang_pcie.runtime.settings import IPC_VARS

PATCH_ID = "node-agreement"
PREFIX = f"sglang-pcie {PATCH_ID}"  # every line the comparison logs starts so
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
