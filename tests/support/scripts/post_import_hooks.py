"""Post-import hooks of the start-up hook on two modules in the folder sys.argv[1]: a recording hook, a broken one, a fatal one."""
import sys
sys.path.insert(0, sys.argv[1])
import sglang_pcie_startup
watcher = sglang_pcie_startup.install()
seen = []
def record(module):
    seen.append(module.VALUE)
def broken(module):
    raise ValueError("boom")
watcher.watch("watched_mod", record)
watcher.watch("watched_mod", broken)
import watched_mod
print(seen, type(watched_mod.__loader__).__name__, watched_mod.__spec__.loader is watched_mod.__loader__)
watcher.watch("watched_mod", record)  # already imported: runs at once
print(seen)
class Fatal(Exception):
    sglang_pcie_fatal = True
def fatal(module):
    raise Fatal("stop")
watcher.watch("other_mod", fatal)
try:
    import other_mod
except Fatal as exc:
    print("fatal propagated", "other_mod" in sys.modules)
