"""The start-up hook's import watcher and flag parser in this process, loaded from the checkout's
``sitecustomize/sglang_pcie_startup.py`` (the real interpreters with the wheel installed:
test_sglang_pcie_startup.py): a callback runs once, right after its module has run, in the order given; a failing
one leaves the import intact unless marked fatal; the watcher answers for watched names only."""
from __future__ import annotations

import importlib.util
import sys

import pytest

from support import REPO


@pytest.fixture
def startup():
    spec = importlib.util.spec_from_file_location("checkout_startup", REPO / "sitecustomize" / "sglang_pcie_startup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def watcher(startup, tmp_path, monkeypatch):
    (tmp_path / "watched_target.py").write_text("VALUE = 41\n")
    (tmp_path / "unwatched_target.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("watched_target", "unwatched_target"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    watcher = startup.ImportWatcher()
    sys.meta_path.insert(0, watcher)
    yield watcher
    sys.meta_path.remove(watcher)
    for name in ("watched_target", "unwatched_target"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("raw, flag", [("1", True), (" TRUE ", True), ("yes", True), ("on", True), ("0", False),
                                       ("False", False), ("no", False), ("off", False), ("", False),
                                       ("maybe", None), ("2", None)])
def test_parse_flag(startup, raw, flag):
    assert startup.parse_flag(raw) is flag


def test_callbacks_run_once_after_the_module_ran_in_order_and_the_real_loader_is_put_back(watcher):
    seen = []
    watcher.watch("watched_target", lambda m: seen.append(("first", m.VALUE)))
    watcher.watch("watched_target", lambda m: seen.append(("second", m.VALUE)))
    import watched_target
    assert seen == [("first", 41), ("second", 41)] and "watched_target" not in watcher.callbacks
    assert type(watched_target.__loader__).__name__ == "SourceFileLoader"
    assert type(watched_target.__spec__.loader).__name__ == "SourceFileLoader"
    watcher.watch("watched_target", lambda m: seen.append(("late", m.VALUE)))  # imported already: at once
    assert seen[-1] == ("late", 41) and "watched_target" not in watcher.callbacks


def test_the_watcher_answers_for_watched_names_only(watcher):
    watcher.watch("watched_target", lambda m: None)
    assert watcher.find_spec("unwatched_target") is None
    spec = watcher.find_spec("watched_target")
    assert spec is not None and type(spec.loader).__name__ == "_PostImportLoader"
    assert watcher.find_spec("no_such_module_anywhere") is None


def test_a_failing_callback_leaves_the_import_intact_and_says_so_and_a_fatal_one_stops_it(watcher, capsys):
    def broken(module):
        raise ValueError("bad hook")
    seen = []
    watcher.watch("watched_target", broken)
    watcher.watch("watched_target", seen.append)
    import watched_target
    assert watched_target.VALUE == 41 and seen == [watched_target]  # the next callback still runs
    assert capsys.readouterr().err == ("sglang-pcie: hook for watched_target failed, module left as shipped: "
                                       "ValueError: bad hook\n")

    class Fatal(RuntimeError):
        sglang_pcie_fatal = True

    def fatal(module):
        raise Fatal("strict")
    watcher.watch("unwatched_target", fatal)
    with pytest.raises(Fatal, match="strict"):
        import unwatched_target  # noqa: F401


def test_install_is_off_with_the_kill_switch_and_installs_one_watcher(startup, monkeypatch):
    monkeypatch.setenv("SGLANG_PCIE_DISABLE", "yes")
    assert startup.install() is None
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setenv("SGLANG_PCIE_DISABLE", "0")
    watcher = startup.install()
    assert watcher is startup.install() is startup.get_watcher() and sys.meta_path[0] is watcher
    assert sum(isinstance(f, startup.ImportWatcher) for f in sys.meta_path) == 1
    assert list(watcher.callbacks) == ["sglang"] or "sglang" in sys.modules


def test_two_watchers_of_one_name_both_run_without_asking_each_other_forever(watcher, startup):
    other = startup.ImportWatcher()  # another copy of the hook (a second install, a vendored one)
    sys.meta_path.insert(0, other)
    try:
        seen = []
        watcher.watch("watched_target", lambda m: seen.append("first"))
        other.watch("watched_target", lambda m: seen.append("other"))
        import watched_target
        assert watched_target.VALUE == 41 and sorted(seen) == ["first", "other"]
        assert type(watched_target.__loader__).__name__ == "SourceFileLoader"
    finally:
        sys.meta_path.remove(other)
