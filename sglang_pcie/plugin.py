"""Entry point in SGLang's ``sglang.srt.plugins`` group (SGLang 0.5.11 and later lists and calls it).

The start-up hook has normally activated the overlay already; calling ``activate`` again is a no-op, so
nothing is applied twice.  Where the start-up hook did not run (``python -S``, an embedded interpreter),
this is the path that activates it.
"""


def load():
    from sglang_pcie.activate import activate

    activate()
