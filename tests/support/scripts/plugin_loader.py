"""SGLang's plugin loader alone (the start-up hook may not have run): does the overlay activate?"""
import json, os, sys
hooked = any(type(f).__name__ == "ImportWatcher" for f in sys.meta_path)
import sglang
import sglang_pcie.runtime.activate as act
after_import = act._activated
from sglang.srt.plugins import load_plugins
load_plugins()
print(json.dumps({"hooked": hooked, "after_import": after_import, "after_plugins": act._activated,
                  "written": sorted(k for k in os.environ if k.startswith(("NCCL_", "SGLANG_PCIE_NCCL_D")))}))
