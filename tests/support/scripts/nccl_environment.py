"""The NCCL_* variables after import sglang."""
import json, os
import sglang
print(json.dumps({k: v for k, v in os.environ.items() if k.startswith("NCCL_")}))
