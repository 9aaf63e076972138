"""The settings' check of EAGLE3_PROFILE_FILE as an ordinary user (root writes anywhere): argv[1] is a JSON object
with "paths" (put first on sys.path), "files" (the values to check) and "scratch" (XDG_CONFIG_HOME)."""
import json, os, sys
args = json.loads(sys.argv[1])
sys.path[:0] = args["paths"]
from sglang_pcie.runtime.settings import load_settings
load_settings({})  # every import done while the interpreter's own files are still readable
if os.geteuid() == 0:  # ask as an ordinary user, as a server would run
    os.setgid(65534); os.setuid(65534)
print(json.dumps([load_settings({"EAGLE3_PROFILE_FILE": p, "XDG_CONFIG_HOME": args["scratch"]}).errors
                  for p in args["files"]]))
