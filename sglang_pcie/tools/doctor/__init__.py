"""``sglang-pcie doctor``: what on this box will hang, corrupt or slow a multi-GPU server, found before the first
start (report.py runs the probes; world.py is where they read the machine from)."""
from sglang_pcie.tools.doctor.report import COMMAND

__all__ = ["COMMAND"]
