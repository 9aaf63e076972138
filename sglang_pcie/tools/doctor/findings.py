"""One finding: what was found and what it will cause, how to fix it, where the fact comes from; and how a list of
them becomes a table, JSON and an exit status."""
from __future__ import annotations

from dataclasses import asdict, dataclass

# In rising order of what they cost: ok and info change nothing; not-visible is a fact this process could not read
# (no root, no tool, a virtual machine), said as such; a warning slows or risks a server; a failure hangs it or
# corrupts its results.
SEVERITIES = ("ok", "info", "not-visible", "warning", "failure")
OK, INFO, NOT_VISIBLE, WARNING, FAILURE = SEVERITIES
EXIT_OK, EXIT_WARNING, EXIT_USAGE, EXIT_FAILURE = 0, 1, 2, 3
SECTIONS = {"gpu": "GPUs", "p2p": "peer-to-peer", "host": "host", "plan": "the plan for this box",
            "net": "network (multi-node)"}


@dataclass
class Finding:
    id: str  # "<section>.<check>", e.g. p2p.corrupt; docs/doctor.md lists every one
    severity: str
    what: str  # the fact, and what it will cause
    fix: str = ""  # how to fix it; empty where there is nothing to do
    source: str = ""  # where the fact comes from (a file, a command, a measurement)

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    @property
    def section(self) -> str:
        return self.id.split(".", 1)[0]

    def line(self) -> str:
        fix = f" Fix: {self.fix}" if self.fix else ""
        source = f" [{self.source}]" if self.source else ""
        return f"{self.severity:<11} {self.id:<24} {self.what}{fix}{source}"


def exit_code(findings: list[Finding]) -> int:
    severities = {f.severity for f in findings}
    if FAILURE in severities:
        return EXIT_FAILURE
    return EXIT_WARNING if WARNING in severities else EXIT_OK


def counts(findings: list[Finding]) -> dict:
    return {severity: sum(f.severity == severity for f in findings) for severity in SEVERITIES}


def summary(findings: list[Finding]) -> str:
    shown = ", ".join(f"{n} {severity}" for severity, n in counts(findings).items() if n)
    return f"doctor: {shown or 'nothing checked'}; exit {exit_code(findings)}"


def table(findings: list[Finding]) -> list[str]:
    """One line per finding, under a heading per section, in the order they were found."""
    lines, section = [], None
    for finding in findings:
        if finding.section != section:
            section = finding.section
            lines.append(f"== {SECTIONS.get(section, section)}")
        lines.append(finding.line())
    lines.append(summary(findings))
    return lines


def as_dicts(findings: list[Finding]) -> list[dict]:
    return [asdict(f) for f in findings]
