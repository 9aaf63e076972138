"""A worker rank: ``python -m sglang_pcie.tools.tune_nccl --worker SPEC`` (the parent starts it; users run
``sglang-pcie tune-nccl``)."""
import json
import sys

from sglang_pcie.tools.tune_nccl.worker import run_worker

if sys.argv[1:2] != ["--worker"] or len(sys.argv) != 3:
    sys.exit("usage: python -m sglang_pcie.tools.tune_nccl --worker SPEC (run `sglang-pcie tune-nccl` instead)")
sys.exit(run_worker(json.loads(sys.argv[2])))
