"""Child process of ``verify-patches --runtime``: imports SGLang's real target modules with the overlay active
and prints one JSON line with each patch's status in this process."""
from __future__ import annotations

import importlib
import json

from sglang_pcie.patching.engine import DISABLED, ERROR, FAILING_STATUSES, Result


def _import_target(name):
    """(module, None), (None, None) when the release lacks it, or (None, error text)."""
    try:
        return importlib.import_module(name), None
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            return None, None
        return None, f"importing {name}: {type(exc).__name__}: {exc}"
    except Exception as exc:
        return None, f"importing {name}: {type(exc).__name__}: {exc}"


def probe() -> dict:
    import sglang

    from sglang_pcie.patching.engine import all_patches
    from sglang_pcie.runtime import activate as activation

    active = activation.activate()  # no-op when the start-up hook already activated the overlay
    RESULTS, SWITCHED_OFF = activation.RESULTS, activation.SWITCHED_OFF
    settings = activation.SETTINGS  # those the patches were gated and applied with
    rows = []
    for patch in all_patches():
        modules, errors = {}, []
        for target in patch.targets:
            module, error = _import_target(target)
            if module is not None:
                modules[target] = module
            if error:
                errors.append(error)
        recorded = RESULTS.get(patch.id, {})
        failed = [r for r in recorded.values() if r.status in FAILING_STATUSES]
        if not active:
            result = Result(DISABLED, "SGLANG_PCIE_DISABLE is set")
        elif patch.id in SWITCHED_OFF:
            result = Result(DISABLED, SWITCHED_OFF[patch.id])
        elif failed:
            result = failed[0]
        elif errors and not patch.targets_may_fail_to_import:
            result = Result(ERROR, "; ".join(errors))
        else:
            try:
                result = patch.check_runtime(modules, settings)
            except Exception as exc:
                result = Result(ERROR, f"runtime check failed: {type(exc).__name__}: {exc}")
            if errors:
                result = Result(result.status, f"{result.detail} ({len(errors)} target module(s) do not import"
                                               f" here, as for SGLang: {errors[0]}{' ...' if len(errors) > 1 else ''})")
        rows.append({"id": patch.id, "status": result.status, "detail": result.detail})
    return {"sglang_version": getattr(sglang, "__version__", "unknown"), "patches": rows}


if __name__ == "__main__":
    print(json.dumps(probe()))
