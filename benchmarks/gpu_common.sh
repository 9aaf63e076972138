# Sourced by the GPU-machine scripts that run this checkout uninstalled (gpu_doctor.sh, gpu_nccl_ipc.sh,
# gpu_tune_nccl_two_nodes.sh, ipc_smoke.sh), from the checkout root, once they have set OUT (results folder), BUDGET
# (seconds for the whole run) and LOG (file name under OUT). It logs everything to $OUT/$LOG, keeps NVLink multicast
# off, honours TP=N (the first N GPUs), checks that PYTHON (default python3) imports torch and this checkout's
# sglang_pcie (gpu_env.sh; SGLANG_PCIE_WHEELS=DIR installs an offline wheel set first) and gives the scripts left()
# and step().
# The checkout runs uninstalled: settings.py imports the start-up hook's module, which only an install puts on sys.path.
export PYTHONPATH=$PWD/sitecustomize${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/$LOG") 2>&1
START=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# TP=N: use the first N GPUs (e.g. TP=2 on a 4-GPU machine, to compare with TP4 there)
if [ -n "${TP:-}" ]; then export CUDA_VISIBLE_DEVICES=$(seq -s, 0 $(( TP - 1 ))); fi
PY=${PYTHON:-python3}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
gpu_env "$PY" torch sglang_pcie || exit 1
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
step() { echo; echo "=== $1 (at $(( $(date +%s) - START )) s, $(left) s left)"; }
