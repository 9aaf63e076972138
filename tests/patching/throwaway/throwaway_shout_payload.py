"""The throw-away patch's payload (it would be ``sglang_pcie/runtime/<payload>.py``): what runs inside SGLang, the
same function for the runtime install and the baked diff's guard, with the settings the patch was gated with."""
from __future__ import annotations

import functools


def wrap(greet, settings=None):
    """``greet`` shouting; with ``SGLANG_PCIE_STRICT=1`` (read from the settings handed down) it also exclaims."""
    exclaim = "!" if getattr(settings, "strict", False) else ""

    @functools.wraps(greet)
    def shouting(*args, **kwargs):
        return greet(*args, **kwargs).upper() + exclaim
    return shouting
