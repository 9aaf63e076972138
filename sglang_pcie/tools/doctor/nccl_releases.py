"""NCCL releases reported bad on PCIe boxes: one typed row per report, with its source, the releases and GPUs it
names (as reported, nothing widened), what it does and the way out. ``doctor`` compares the NCCL a server would load
(``host.versions``: the copy check's torch, else the nvidia-nccl-cu* distribution) and the GPUs of the TP group
(nvidia-smi's product names) with every row: ``host.nccl-release``. docs/doctor.md's table of these rows is
generated from ``KNOWN_BAD`` by ci/generate-docs.

A row goes in only with a source that says all of it: a report that compared releases on one box (failing in one,
fine in another) or a maintainer naming the releases. What a source does not say is not written here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple


class Release(NamedTuple):
    """An NCCL release, ordered as PEP 440 orders them: 2.26.2 < 2.26.2.post1 < 2.26.5."""
    major: int
    minor: int
    patch: int
    post: int = 0  # nvidia-nccl-cu12 2.26.2.post1: a rebuild, another release than 2.26.2

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}" + (f".post{self.post}" if self.post else "")


# 2.26.2, 2.26.2.post1, nvidia-nccl-cu12's wheel version; NCCL's own 2.26.2-1 and 2.26.2+cuda12.2 (its package
# revision and build tag: the same release). Nothing else is guessed at: an int from an old torch is not parsed.
_RELEASE = re.compile(r"(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?(?:-\d+)?(?:\+[0-9A-Za-z.]+)?")


def parse(text: str) -> Release | None:
    """``text`` as doctor reads it ("2.26.2" from torch, "nvidia-nccl-cu12==2.26.2" from a dist-info folder) as a
    Release; None where it is not one."""
    found = _RELEASE.fullmatch(text.strip().rpartition("==")[2].strip())
    return Release(*(int(g) if g else 0 for g in found.groups())) if found else None


@dataclass(frozen=True)
class Releases:
    """The releases a report names: from ``first`` to ``last``, both included (one release: first == last)."""
    first: Release
    last: Release

    def __contains__(self, release: Release) -> bool:
        return self.first <= release <= self.last

    def __str__(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first} to {self.last}"


@dataclass(frozen=True)
class KnownBad:
    source: str  # the report's address
    name: str  # how lines and docs name it: "NVIDIA/nccl #2418"
    checked: str  # the date the source was read for this row
    releases: Releases  # the releases it reports bad, exactly as it states them
    gpus: tuple[str, ...]  # the GPUs it was seen on, as nvidia-smi -q names them (Product Name)
    symptom: str  # what it does, in the report's terms
    reported: str  # how it was shown: the box, what failed, what did not
    fixed_in: Release | None = None  # a release the source found working
    avoid_with: str = ""  # a variable that avoids it on the release itself, where the source names one

    @property
    def fix(self) -> str:
        ways = []
        if self.fixed_in:
            ways.append(f"install NCCL {self.fixed_in} (found working in {self.name}) into the server's Python: pip "
                        f"install nvidia-nccl-cu12=={self.fixed_in} (-cu13 for a CUDA 13 torch; pip warns that torch "
                        "pins another release, torch loads the installed one)")
        if self.avoid_with:
            ways.append(f"{'until then, ' if ways else ''}serve with {self.avoid_with}")
        return "; ".join(ways)


KNOWN_BAD: tuple[KnownBad, ...] = (
    KnownBad(
        source="https://github.com/NVIDIA/nccl/issues/2418",
        name="NVIDIA/nccl #2418",
        checked="2026-12-05",
        releases=Releases(Release(2, 26, 2), Release(2, 26, 2)),
        gpus=("NVIDIA RTX PRO 6000 Blackwell Workstation Edition",),
        symptom="CUDA illegal memory access in collectives of 512 KiB and more (all_reduce_perf fails from 524288 "
                "bytes; smaller messages pass)",
        reported="one bare-metal workstation, 2 GPUs without NVLink (topo -m NODE), PyTorch 2.7.0+cu128: fails with "
                 "NCCL 2.26.2+cuda12.2, not reproducible with 2.31.2+cuda12.9",
        fixed_in=Release(2, 31, 2),
    ),
)


def _same_gpu(a: str, b: str) -> bool:
    return " ".join(a.split()).casefold() == " ".join(b.split()).casefold()


def match(release: Release, gpu_names: list[str]) -> list[tuple[KnownBad, list[str]]]:
    """Every row whose releases hold ``release``, with the names in ``gpu_names`` it reports (empty: the release is
    reported bad, but on other GPUs)."""
    return [(row, [n for n in gpu_names if any(_same_gpu(n, g) for g in row.gpus)])
            for row in KNOWN_BAD if release in row.releases]


# docs/doctor.md's table lies between these two lines; ci/generate-docs rewrites what is between them.
DOCS_PAGE = "docs/doctor.md"
DOCS_BEGIN = "<!-- the known-bad NCCL releases: generated from sglang_pcie/tools/doctor/nccl_releases.py by " \
             "ci/generate-docs, do not edit by hand -->"
DOCS_END = "<!-- end of the known-bad NCCL releases -->"


def markdown_table() -> str:
    lines = ["| source (read) | NCCL | GPUs (as reported) | symptom | how it was shown | the way out |",
             "|---|---|---|---|---|---|"]
    for row in KNOWN_BAD:
        lines.append(f"| [{row.name}]({row.source}) ({row.checked}) | {row.releases} | {', '.join(row.gpus)} | "
                     f"{_cell(row.symptom)} | {_cell(row.reported)} | {_cell(row.fix)} |")
    return "\n".join(lines) + "\n"


def with_docs_table(page: str) -> str:
    """``page`` (docs/doctor.md's text) with what lies between its two markers replaced by ``markdown_table()``."""
    head, begin, rest = page.partition(DOCS_BEGIN + "\n")
    _, end, tail = rest.partition(DOCS_END)
    if not begin or not end:
        raise ValueError(f"{DOCS_PAGE} lacks the known-bad table's markers ({DOCS_BEGIN} ... {DOCS_END})")
    return head + begin + markdown_table() + end + tail


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
