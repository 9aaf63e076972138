"""The patches' results after import sglang on a tree with a drifted target."""
import json, sys
out = {}
try:
    import sglang.srt.layers.layer_boundary.residual.add_norm
    import sglang.srt.speculative.eagle_worker_v2 as v2
    from sglang_pcie.runtime.activate import RESULTS
    out["imported"] = True
    out["eagle"] = {m: r.status for m, r in RESULTS["eagle3-profile"].items()}
    out["sm120"] = sorted({r.status for r in RESULTS["sm120-allreduce-fusion"].values()})
except Exception as exc:
    out["imported"] = False
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
