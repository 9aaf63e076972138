"""How SGLANG_PCIE_DISABLE reads in the start-up hook, on import sglang, in the settings and in the plugin loader."""
import json, os, sys
hooked = any(type(f).__name__ == "ImportWatcher" for f in sys.meta_path)
import sglang
import sglang_pcie.runtime.activate as act
after_import = act._activated
from sglang_pcie.runtime.plugin import load
load()  # what SGLang's plugin loader (0.5.11+) calls, after import sglang
from sglang_pcie.runtime.settings import load_settings
print(json.dumps({"hooked": hooked, "after_import": after_import, "active": act._activated,
                  "settings_disabled": load_settings().disabled,
                  "written": sorted(k for k in os.environ if k.startswith(("NCCL_", "SGLANG_PCIE_NCCL_D")))}))
