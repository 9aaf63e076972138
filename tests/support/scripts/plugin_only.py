"""SGLang's plugin loader alone (python -S: no start-up hook) activates the overlay."""
import json, os, sys
hooked = any(type(f).__name__ == "ImportWatcher" for f in sys.meta_path)
import sglang
import sglang_pcie.runtime.activate as act
before = act._activated
from sglang_pcie.runtime.plugin import load
load()
print(json.dumps({"hooked": hooked, "before": before, "after": act._activated,
                  "proto": os.environ.get("NCCL_PROTO")}))
