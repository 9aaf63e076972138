"""The lines every baked diff adds to gate itself, generated the same way for every patch.

A diff adds ``guard_block(id)`` once to each module it decorates something in, and ``decorator(id, *args)`` above
each function it changes; ``sglang_pcie.runtime.baked.guard`` decides, in the process, whether the decorated
function becomes the patch's payload (the runtime's gate) or stays SGLang's own. Without sglang-pcie installed,
the block's ``except ImportError`` branch makes every decorator the identity.
"""
from __future__ import annotations

from sglang_pcie.patching.edits import SourceEdits
from sglang_pcie.runtime.baked import guard_name  # noqa: F401  (the name the guard checks, re-exported)
from sglang_pcie.runtime.results import DIFF_MARKER

GUARD_FACTORY = "_sglang_pcie_guard"


def guard_block(patch_id: str) -> str:
    """The lines binding the guard (unindented, every one carrying the patch's marker)."""
    marker = f"# {DIFF_MARKER} {patch_id}"
    return (f"{marker}: acts where sglang-pcie's switches let it; SGLang's own code otherwise or without sglang-pcie\n"
            f"try:  {marker}\n"
            f"    from sglang_pcie.runtime.baked import guard as {GUARD_FACTORY}  {marker}\n"
            f"except ImportError:  {marker}\n"
            f"    def {GUARD_FACTORY}(patch_id):  {marker}\n"
            f"        return lambda *args: lambda original: original  {marker}\n"
            f"{guard_name(patch_id)} = {GUARD_FACTORY}({patch_id!r})  {marker}\n")


def decorator(patch_id: str, *args) -> str:
    """The decorator line (unindented, with its newline) a diff puts above a function it changes."""
    return f"@{decorator_call(patch_id, *args)}  # {DIFF_MARKER} {patch_id}\n"


def rebinding(patch_id: str, target: str, *args) -> str:
    """The line applying the guard to ``target`` (a dotted name) after its definition, where a decorator would sit
    in a hunk whose context changes more often (unindented, with its newline)."""
    return f"{target} = {decorator_call(patch_id, *args)}({target})  # {DIFF_MARKER} {patch_id}\n"


def decorator_call(patch_id: str, *args) -> str:
    """The decorator expression as ``ast.unparse`` writes it: ``_sglang_pcie_<id>(*args)``."""
    return f"{guard_name(patch_id)}({', '.join(repr(a) for a in args)})"


def hook_diffs(row, tree) -> dict[str, str]:
    """The baked diff of a wrap patch, derived from its hooks (``runtime/patch_table.py``): {module: new source}
    for each hook module the tree has whose source does not carry the patch's lines yet. Where each hook's guard
    goes (``Hook.diff``):

    * ``decorate``: the guard block before the hook's class (or function), once per module, and the decorator above
      the member (the class's own method: an inherited one has nothing to decorate, a patch of its own writes that);
    * ``after-class``: the guard block and a rebinding line after the class, a hunk whose context is the class's
      last lines rather than the method's, which changes more often;
    * ``at-end``: a rebinding line appended to the module, after the guard block (appended with the first such
      line where no hook before it in the module wrote one).
    """
    marker = f"{DIFF_MARKER} {row.id}"
    out = {}
    for module in dict.fromkeys(hook.module for hook in row.hooks):
        source = tree.source(module)
        if source is None or marker in source:
            continue
        edits, guarded = SourceEdits(source), False
        for hook in (h for h in row.hooks if h.module == module):
            owner = tree.find_class(module, hook.cls)[1] if hook.cls else tree.function(module, hook.name)
            if hook.diff == "after-class":
                edits.insert_lines(owner.end_lineno + 1, "\n\n" + guard_block(row.id) + "\n\n"
                                   + rebinding(row.id, hook.member, *hook.args), indent="")
            elif hook.diff == "at-end":  # the module's guard block once: above, or with its first at-end line
                guard = "" if guarded else "\n\n" + guard_block(row.id)
                edits.insert_lines(len(source.splitlines()) + 1, guard + rebinding(row.id, hook.member, *hook.args),
                                   indent="")
            else:
                member = tree.function(module, hook.member)
                first = min([owner.lineno] + [d.lineno for d in owner.decorator_list])
                guard = "" if guarded else guard_block(row.id) + "\n\n"
                if owner is member:  # a module-level function: the guard and the decorator in one block
                    edits.insert_lines(first, guard + decorator(row.id, *hook.args), indent="")
                else:
                    if guard:
                        edits.insert_lines(first, guard, indent="")
                    edits.insert_lines(min([member.lineno] + [d.lineno for d in member.decorator_list]),
                                       decorator(row.id, *hook.args))
            guarded = True
        out[module] = edits.text()
    return out
