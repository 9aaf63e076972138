"""Entry point in SGLang's ``sglang.srt.plugins`` group (SGLang 0.5.11 and later call it from ``load_plugins()``).

The start-up hook has normally activated the overlay already (or decided it stays off); calling ``activate``
again is a no-op, so nothing is applied or said twice. Where the start-up hook did not run (``python -S``, an
embedded interpreter), this is the path that activates it.
"""


def load():
    try:
        from sglang_pcie.runtime.activate import activate

        activate()
    except Exception as exc:
        # SGLang would log the traceback and go on; one line says the same. SGLANG_PCIE_STRICT=1 still stops.
        if getattr(exc, "sglang_pcie_fatal", False):
            raise
        import sys

        sys.stderr.write(f"sglang-pcie: activation from SGLang's plugin loader failed: {type(exc).__name__}: {exc}\n")
