# The GPU scripts' one install-and-check step. Every GPU script (ipc_smoke.sh and each benchmarks/gpu_*.sh but
# gpu_fi_wheels.sh, which builds a wheel set where there is a package index) goes through it: gpu_common.sh and
# gpu_detached.sh call it, the others source this file and call it themselves, from the checkout root, before they
# do anything else. It reaches for no folder outside the checkout.
#
#   gpu_env [--in DIR] PYTHON MODULE...
#     1. Only where SGLANG_PCIE_WHEELS=DIR is set (a path relative to the checkout root, or absolute): installs the
#        offline wheel set in DIR into PYTHON: every DIR/*.whl and DIR/*/*.whl (so a set split into parts, e.g.
#        chunk1/ chunk2/ overlay/, is named by its parent folder), with `pip install --no-index --no-deps`: nothing is
#        downloaded and nothing resolved (the set was resolved when it was built); a wheel whose version is already
#        installed is left as it is, and sglang-pcie's own wheel is reinstalled every time (a rebuilt checkout keeps
#        its version number). Unset: nothing is installed; PYTHON is used as it is.
#     2. Imports each MODULE in PYTHON, started in DIR of --in (default: here; the scripts that use the installed
#        overlay say /tmp, where they run, so that the checkout's own sglang_pcie is not the one found).
#   One line: what was imported (version and folder) or what is missing and the two ways out. Returns 0, or 1.
#
# By itself, to install a wheel set (or a part of one, when a transfer limit splits it) and check the python:
#   SGLANG_PCIE_WHEELS=DIR bash benchmarks/gpu_env.sh [PYTHON]      (PYTHON: default python3; checks sglang and
#                                                                    sglang_pcie as the installed-overlay scripts do)
# After a part of a split set the check names what is still missing; the next part's install completes it.
GPU_ENV_ROOT=${GPU_ENV_ROOT:-$PWD}

gpu_env_install() {  # $1: python. Installs the wheels of $SGLANG_PCIE_WHEELS into it, offline.
  local dir=$SGLANG_PCIE_WHEELS
  case $dir in /*) ;; *) dir=$GPU_ENV_ROOT/$dir;; esac
  if [ ! -d "$dir" ]; then
    echo "gpu_env: SGLANG_PCIE_WHEELS=$SGLANG_PCIE_WHEELS: no such folder ($dir)" >&2; return 1
  fi
  local wheels=() overlay=() w
  for w in "$dir"/*.whl "$dir"/*/*.whl; do
    [ -f "$w" ] || continue
    case ${w##*/} in sglang_pcie-*) overlay+=("$w");; *) wheels+=("$w");; esac
  done
  if [ $(( ${#wheels[@]} + ${#overlay[@]} )) = 0 ]; then
    echo "gpu_env: SGLANG_PCIE_WHEELS=$SGLANG_PCIE_WHEELS: no *.whl in $dir or its subfolders" >&2; return 1
  fi
  local pip=("$1" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check)
  if [ ${#wheels[@]} -gt 0 ] && ! "${pip[@]}" --upgrade "${wheels[@]}"; then
    echo "gpu_env: pip could not install the ${#wheels[@]} wheels of $dir into $1 (above)" >&2; return 1
  fi
  if [ ${#overlay[@]} -gt 0 ] && ! "${pip[@]}" --force-reinstall "${overlay[@]}"; then
    echo "gpu_env: pip could not install ${overlay[*]##*/} into $1 (above)" >&2; return 1
  fi
  local also=" (no sglang-pcie wheel among them)"
  [ ${#overlay[@]} = 0 ] || also=" and ${overlay[*]##*/} (reinstalled)"
  echo "gpu_env: installed from $dir into $1, offline: ${#wheels[@]} wheel(s)$also"
}

gpu_env() {  # [--in DIR] PYTHON MODULE...
  local where=.
  if [ "${1:-}" = --in ]; then where=$2; shift 2; fi
  local python=$1; shift
  case $python in */*) python=$(cd "${python%/*}" 2>/dev/null && pwd)/${python##*/};; esac  # --in moves the cwd
  if ! command -v "$python" > /dev/null; then
    echo "gpu_env: no python '$python' here: install SGLang and the overlay into a python (pip install" \
         "sglang==0.5.16, then pip install . in this checkout) and name it (PYTHON=... where the script takes one)" >&2
    return 1
  fi
  if [ -n "${SGLANG_PCIE_WHEELS:-}" ]; then gpu_env_install "$python" || return 1; fi
  ( cd "$where" && "$python" - "$python" "$@" ) <<'PY'
import contextlib, importlib, io, os, sys

python, names = sys.argv[1], sys.argv[2:]
found, missing = [], []
for name in names:
    try:  # the import's own output (the overlay's notes, SGLang's warnings) is not this check's
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            module = importlib.import_module(name)
    except BaseException as error:  # a broken install may raise anything, SystemExit included
        why = (str(error).splitlines() or [""])[0]
        missing.append(f"{name} ({type(error).__name__}{': ' + why if why else ''})")
    else:
        where = os.path.dirname(getattr(module, "__file__", None) or "?")
        found.append(f"{name} {getattr(module, '__version__', '?')} ({where})")
who = f"{python} ({sys.executable}, Python {sys.version.split()[0]})"
if missing:
    print(f"gpu_env: {who} cannot import {', '.join(missing)}: install with a package index (pip install"
          f" sglang==0.5.16, which brings torch, then pip install . in this checkout), or name an offline wheel set:"
          f" SGLANG_PCIE_WHEELS=DIR (benchmarks/README.md, 'GPU scripts from a clone')", file=sys.stderr)
    sys.exit(1)
print(f"gpu_env: {who}: {', '.join(found)}")
PY
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then  # run, not sourced
  gpu_env --in /tmp "${1:-python3}" sglang sglang_pcie
fi
