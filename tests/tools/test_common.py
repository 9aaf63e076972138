"""The helpers several commands share (sglang_pcie/tools/common.py)."""
import pytest

from sglang_pcie.tools.common import USAGE_ERROR, settings_or_errors, summed_counts, tail_lines


def test_summed_counts_adds_histograms_of_different_lengths_position_by_position():
    assert summed_counts([[1, 2], [3, 4, 5], [0]]) == [4, 6, 5]
    assert summed_counts([[7]]) == [7]
    assert summed_counts([]) is None


def test_tail_lines_reads_the_last_bytes_of_a_log_leniently(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(b"first\nsecond\n\xff bad byte\nlast")
    assert tail_lines(log) == ["first", "second", "\ufffd bad byte", "last"]  # the whole file, under the bound
    assert tail_lines(log, max_bytes=15) == ["\ufffd bad byte", "last"]  # exactly the last 15 bytes
    assert tail_lines(log, max_bytes=14) == [" bad byte", "last"]  # the first line may be cut
    assert tail_lines(tmp_path / "missing.log") == [] and tail_lines(tmp_path) == []  # unreadable: nothing


def test_tail_lines_bounds_what_it_reads_by_default_to_64_kib(tmp_path):
    log = tmp_path / "big.log"
    log.write_text("x" * 100 + "\n" + "y" * (64 * 1024 - 1) + "\n")
    assert tail_lines(log) == ["y" * (64 * 1024 - 1)]  # the 64 KiB end exactly: not a byte of the line before


def test_settings_or_errors_prints_each_error_as_a_usage_error_line(capsys, monkeypatch):
    assert USAGE_ERROR == 2
    monkeypatch.setenv("EAGLE3_PROFILE_INTERVAL", "0")
    monkeypatch.setenv("SGLANG_PCIE_DISABLE_PATCHES", "no-such-patch")
    settings, errors = settings_or_errors()
    err = capsys.readouterr().err
    assert len(errors) == 2 and err == "".join(f"sglang-pcie: error: {e}\n" for e in errors)
    assert "EAGLE3_PROFILE_INTERVAL='0'" in errors[0] and "names no patch 'no-such-patch'" in errors[1]
    monkeypatch.delenv("EAGLE3_PROFILE_INTERVAL")
    monkeypatch.setenv("SGLANG_PCIE_DISABLE_PATCHES", "eagle3-profile")
    settings, errors = settings_or_errors()
    assert errors == [] and capsys.readouterr().err == "" and settings.disabled_patches == {"eagle3-profile"}


@pytest.mark.parametrize("value", ["", "accept-length-alarm"])
def test_settings_or_errors_without_errors_says_nothing(capsys, monkeypatch, value):
    monkeypatch.setenv("SGLANG_PCIE_DISABLE_PATCHES", value)
    assert settings_or_errors()[1] == [] and capsys.readouterr().err == ""


def test_variable_lines_list_every_row_with_its_value_here_or_its_default_and_its_owner():
    from sglang_pcie.runtime.settings import VARIABLES
    from sglang_pcie.tools.common import variable_lines

    lines = variable_lines({"SGLANG_PCIE_NCCL_PROFILE": "pcie", "EAGLE3_PROFILE": "\udcff"})
    assert lines[0].startswith("Variables (") and len(lines) == 1 + len(VARIABLES)
    rows = {line.split()[0]: line for line in lines[1:]}
    assert list(rows) == [v.name for v in VARIABLES]
    assert rows["SGLANG_PCIE_NCCL_PROFILE"].split()[1] == "'pcie'"  # as set here, quoted
    assert rows["EAGLE3_PROFILE"].split()[1] == "b'\\xff'"  # bytes that are not UTF-8, as bytes
    assert rows["EAGLE3_PROFILE_INTERVAL"].split()[1:3] == ["1000", "(default)"]
    assert rows["EAGLE3_PROFILE_FILE"].split()[1] == "unset"
    for v in VARIABLES:
        assert rows[v.name].endswith(f"  {v.owner}")
    assert len({line.index(v.owner) for line, v in zip(lines[1:], VARIABLES) if len(line) < 100}) == 1  # one column
