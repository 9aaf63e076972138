# Sourced by the GPU scripts whose work outlasts one device call (gpu_draft_watch.sh, gpu_evidence_round3.sh,
# gpu_profile_host_cost.sh, gpu_tune_spec.sh), from the checkout root, once they have set NAME (their folder is
# /tmp/NAME, their log /tmp/NAME.log, their pack $OUT/NAME.tgz) and defined work() (which touches /tmp/NAME/DONE at
# its end) and progress() (what collect prints before packing).  Then `detached "${1:-collect}"`:
#   start    checks that python3 imports SGLang and the installed overlay (gpu_env.sh; SGLANG_PCIE_WHEELS=DIR
#            installs an offline wheel set first; on a failure it starts nothing), then the work under setsid in the
#            background; returns at once
#   work     (what start runs)
#   collect  waits up to WAIT s (default 500) for DONE, prints progress, packs the folder and the log (model weights
#            and bench's outputs.json left out), says FINISHED or RUNNING (then call collect again WITHIN 30 SECONDS:
#            the device machine is given back after 30 s idle)
W=/tmp/$NAME
OUT=${OUT:-/tmp/$NAME-out}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"

detached() {
  case "$1" in
    start)
      gpu_env --in /tmp python3 sglang sglang_pcie || return 1
      rm -rf "$W"; mkdir -p "$W" "$OUT"
      setsid nohup bash "$0" work > "/tmp/$NAME.log" 2>&1 < /dev/null &
      sleep 2; echo "started (log /tmp/$NAME.log)";;
    work) work;;
    collect)
      mkdir -p "$W" "$OUT"
      local t=$(date +%s)
      while [ ! -f "$W/DONE" ] && [ $(( $(date +%s) - t )) -lt "${WAIT:-500}" ]; do sleep 5; done
      progress
      tar czf "$OUT/$NAME.tgz" --exclude='*.safetensors' --exclude='outputs.json' -C /tmp "$NAME" "$NAME.log" \
        2>/dev/null
      [ -f "$W/DONE" ] && echo FINISHED || echo "RUNNING: collect again within 30 s";;
    *) echo "usage: bash $0 start|collect" >&2; return 2;;
  esac
}
