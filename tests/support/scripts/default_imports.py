"""A server's imports with the defaults on (or the opt-ins the environment gives): import sglang and every default patch's target module (those this
release has), then report which sglang_pcie modules were loaded and what each patch recorded."""
import importlib, json, sys
import sglang
from sglang_pcie.runtime import activate, patch_table

for row in patch_table.TABLE:
    for name in row.targets:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not (exc.name and (name == exc.name or name.startswith(exc.name + "."))):
                raise
print(json.dumps({
    "loaded": sorted(m for m in sys.modules if m.startswith("sglang_pcie.")),
    "switched_off": sorted(activate.SWITCHED_OFF),
    "results": {i: {m: r.status for m, r in rs.items()} for i, rs in activate.RESULTS.items()},
    "details": {i: {m: r.detail for m, r in rs.items()} for i, rs in activate.RESULTS.items()},
}))
