"""Which patches act in a real SGLang whose sources carry the versioned diffs (PYTHONPATH: the baked copy), under
the switches of this process. argv[1]: "installed", or "absent" to run as if sglang-pcie were not installed (its
start-up finder taken out, its package unimportable); argv[2]: JSON {patch id: the register's ``marked``, the members
whose mark tells that the patch acts: each one this release defines is read}, handed down by the test (sglang-pcie may be unimportable here). Prints {patch id: acting}, the files
imported and what of sglang-pcie was loaded."""
import importlib, json, sys

MARKER_ATTR = "__sglang_pcie_patch__"  # runtime.results.MARKER_ATTR, spelled out: sglang_pcie may be absent here
if sys.argv[1] == "absent":
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__module__ != "sglang_pcie_startup"]
    sys.modules["sglang_pcie"] = None  # every `import sglang_pcie...` raises ImportError

import sglang  # noqa: E402


def member(spec):
    """The object "module:Class.member" (or "module:function") names, read from the class's or module's own
    namespace (no descriptor bound), or None where the module does not define it."""
    module, _, qualname = spec.partition(":")
    try:
        obj = importlib.import_module(module)
    except ModuleNotFoundError as exc:  # a module of another release (0.5.23 has no layers.communicator)
        if exc.name != module:
            raise
        return None
    for name in qualname.split("."):
        obj = vars(obj).get(name) if hasattr(obj, "__dict__") else None
        if obj is None:
            return None
    return obj


def marked(obj, patch_id):
    """The mark on obj or on what it wraps (two patches may wrap one method)."""
    while obj is not None:
        if getattr(obj, MARKER_ATTR, None) == patch_id:
            return True
        obj = getattr(obj, "__wrapped__", None)
    return False


acting = {}
for patch_id, candidates in json.loads(sys.argv[2]).items():  # the register's ``marked``, per patch id
    found = [obj for obj in map(member, candidates) if obj is not None]  # those this release defines
    if not found:
        raise SystemExit(f"{patch_id}: none of {candidates} is defined: its diff is not baked in")
    marks = {marked(obj, patch_id) for obj in found}  # every hook of a patch acts, or none: one switch
    acting[patch_id] = marks.pop() if len(marks) == 1 else "some of its members only"
print(json.dumps({"acting": acting, "sglang": sglang.__file__,
                  "sglang_pcie_loaded": sorted(n for n, m in sys.modules.items()
                                               if n.split(".")[0] == "sglang_pcie" and m is not None)}))
