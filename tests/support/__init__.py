"""What the tests share, and the benchmarks reuse: the fakes that stand in for a server, an NCCL worker and the CUDA
driver, throw-away environments, and the paths of this checkout."""
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
REPO = TESTS.parent


def _register_ids() -> list[str]:
    from sglang_pcie.patching import register  # data: imports nothing

    return register.ids()


# the register's patches in order, from the register: a sixth patch needs no edit here
PATCH_IDS = _register_ids()
