"""The helpers several commands share (sglang_pcie/tools/common.py)."""
from sglang_pcie.tools.common import summed_counts


def test_summed_counts_adds_histograms_of_different_lengths_position_by_position():
    assert summed_counts([[1, 2], [3, 4, 5], [0]]) == [4, 6, 5]
    assert summed_counts([[7]]) == [7]
    assert summed_counts([]) is None
