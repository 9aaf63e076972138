"""The worker's ranks (sglang_pcie.patches.eagle3_profile.ranks), read where each SGLang release keeps them."""
from __future__ import annotations

import types

import pytest

from sglang_pcie.patches.eagle3_profile import payload as ep


@pytest.mark.parametrize("holder, expected", [
    (types.SimpleNamespace(tp_rank=1, pp_rank=0, dp_rank=2), {"tp_rank": 1, "pp_rank": 0, "dp_rank": 2}),
    (types.SimpleNamespace(ps=types.SimpleNamespace(tp_rank=3, pp_rank=1, dp_rank=None)),  # 0.5.16's ParallelState
     {"tp_rank": 3, "pp_rank": 1, "dp_rank": None}),
    (types.SimpleNamespace(tp_rank=0, _target_worker=types.SimpleNamespace(pp_rank=2, dp_rank=1)),
     {"tp_rank": 0, "pp_rank": 2, "dp_rank": 1}),
    (types.SimpleNamespace(tp_rank=True), {"tp_rank": None, "pp_rank": None, "dp_rank": None}),
])
def test_worker_ranks_from_the_worker_its_parallel_state_or_target_worker(holder, expected):
    assert ep.worker_ranks(holder) == expected
