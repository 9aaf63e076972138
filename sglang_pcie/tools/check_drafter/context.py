"""What the checks share while they run: the folders given, the SGLang facts, and what one check learns for the
next (the loader's behaviour, the draft vocabulary's target ids, the launch arguments)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sglang_pcie.tools.check_drafter.checkpoint import Checkpoint
from sglang_pcie.tools.check_drafter.sglang_facts import SglangFacts


@dataclass
class Context:
    draft: Checkpoint
    target: Checkpoint | None
    other: Checkpoint | None
    facts: SglangFacts | None
    text_path: Path
    launch_args: list | None = None  # what followed `--`: the server's launch arguments
    loader_reads_num_aux: bool = True
    loader_single_layer: bool = False
    draft_ids: list | None = None  # target ids of the draft vocabulary (i + d2t[i]), once read
    map_valid: bool = False  # the d2t map read and every check of it passed
