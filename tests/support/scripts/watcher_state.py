"""The start-up hook's watchers in this interpreter: how many, what they watch, which modules are loaded."""
import json, sys
watchers = [f for f in sys.meta_path if type(f).__name__ == "ImportWatcher"]
print(json.dumps({"watchers": len(watchers),
                  "watched": sorted(watchers[0].callbacks) if watchers else [],
                  "modules": sorted(sys.modules)}))
