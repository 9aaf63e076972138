"""sglang-pcie start-up hook, run in every interpreter through ``sglang_pcie.pth``.

It must stay tiny: it imports nothing (``sys`` and ``os`` are already loaded by ``site``) and only
installs a meta-path finder that waits for ``import sglang``.  Everything else (settings, NCCL profile,
patches) is loaded by ``sglang_pcie.runtime.activate`` when SGLang itself is imported.

The finder is also the overlay's post-import hook mechanism: ``watch(name, callback)`` runs
``callback(module)`` right after ``name`` has been executed (or at once if it already was).
"""
import os
import sys

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def parse_flag(raw):
    """True or False for a boolean setting's value, None when it is neither.

    The one parser of every boolean setting: ``sglang_pcie.runtime.settings`` imports it, so the kill switch reads
    the same here, before anything is loaded, as it does when SGLang is imported.
    """
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    return None


class _PostImportLoader:
    """Runs the real loader, then the callbacks; puts the real loader back on the module."""

    def __init__(self, loader, watcher, name):
        self._loader = loader
        self._watcher = watcher
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._watcher.run_callbacks(self._name, module)

    def __getattr__(self, attr):
        return getattr(self._loader, attr)


class ImportWatcher:
    """Meta-path finder that only ever answers for watched module names."""

    def __init__(self):
        self.callbacks = {}
        self._resolving = set()

    def watch(self, name, callback):
        module = sys.modules.get(name)
        if module is not None:
            self._call(name, callback, module)
            return
        self.callbacks.setdefault(name, []).append(callback)

    def run_callbacks(self, name, module):
        for callback in self.callbacks.pop(name, ()):
            self._call(name, callback, module)

    def _call(self, name, callback, module):
        try:
            callback(module)
        except Exception as exc:
            # A failing hook must not make the import of SGLang's module fail, except where the user
            # asked for that (SGLANG_PCIE_STRICT=1 raises an exception marked fatal).
            if getattr(exc, "sglang_pcie_fatal", False):
                raise
            sys.stderr.write("sglang-pcie: hook for %s failed, module left as shipped: %s: %s\n"
                             % (name, type(exc).__name__, exc))

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.callbacks or fullname in self._resolving:
            return None
        self._resolving.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                find_spec = getattr(finder, "find_spec", None)
                if finder is self or find_spec is None:
                    continue
                spec = find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._resolving.discard(fullname)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PostImportLoader(spec.loader, self, fullname)
        return spec


def _on_sglang_imported(module):
    from sglang_pcie.runtime.activate import activate

    activate()


def get_watcher():
    """The interpreter's one watcher, installed on first use."""
    for finder in sys.meta_path:
        if isinstance(finder, ImportWatcher):
            return finder
    watcher = ImportWatcher()
    sys.meta_path.insert(0, watcher)
    watcher.watch("sglang", _on_sglang_imported)
    return watcher


def install():
    """Run by ``sglang_pcie.pth``: watch for ``import sglang``; None when SGLANG_PCIE_DISABLE is on.

    A value that is not a boolean also ends with the overlay off, but that is decided (and said, once) by
    ``activate`` when SGLang is imported: a warning here would reach every interpreter, SGLang or not.
    """
    if parse_flag(os.environ.get("SGLANG_PCIE_DISABLE", "")):
        return None
    return get_watcher()
