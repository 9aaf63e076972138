"""Whether the overlay activated on import sglang, what it watches, and the NCCL_* variables it wrote."""
import json, os, sys
import sglang
import sglang_pcie.runtime.activate as act
watcher = next(f for f in sys.meta_path if type(f).__name__ == "ImportWatcher")
print(json.dumps({"activated": act._activated, "watched": sorted(watcher.callbacks),
                  "nccl": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}}))
