"""verify-patches --runtime --json in this SGLang install, summarised."""
import json, subprocess, sys
proc = subprocess.run([sys.executable, "-m", "sglang_pcie", "verify-patches", "--runtime", "--json"],
                      capture_output=True, text=True)
report = json.loads(proc.stdout)
print(json.dumps({"rc": proc.returncode, "version": report["sglang_version"],
                  "statuses": {row["id"]: row["status"] for row in report["patches"]},
                  "stderr": proc.stderr[-2000:]}))
