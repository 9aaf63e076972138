"""What the tests share, and the benchmarks reuse: the fakes that stand in for a server, an NCCL worker and the CUDA
driver, throw-away environments, and the paths of this checkout."""
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
REPO = TESTS.parent
# the register's patches in order: one list, so a patch added or lost is one edit here and a failure everywhere else
PATCH_IDS = ["sm120-allreduce-fusion", "eagle3-profile", "drafter-delegation", "accept-length-alarm", "node-agreement"]
