"""node-agreement's comparison of the ranks' records (``agreement_record``): one line per setting that differs
between nodes (or, for the settings that name a host's own devices, between the ranks of one node), naming each
node and its ranks with its value; what could not be compared said apart, never as a difference."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

# its bounds read at each use (a test sets them)
from sglang_pcie.patches.node_agreement import record as agreement_record
from sglang_pcie.patches.node_agreement.record import PER_NODE, PREFIX, Record

# A long value is shown cut, with its length and the start of its digest (two that differ only past the cut read
# apart).
SHOWN_CHARS = 80
SHOWN_DIGEST_CHARS = 12


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
    values, size = agreement_record.MAX_VALUES, agreement_record.MAX_RECORD_BYTES
    return (f"{PREFIX}: {ranks_text(r.rank for r in cut)} sent only their first {first} settings (by name) of {total} "
            f"(a record holds at most {values} values and {size} bytes): {after}")


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
