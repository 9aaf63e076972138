"""Pages generated from the patch register: docs/patches.md and README.md's patch table (``ci/generate-docs``), and
the register's table at the top of COMPATIBILITY.md (``ci/check-sglang-releases``). Tests fail when a committed page
is not what this renders."""
from __future__ import annotations

from sglang_pcie.patching import register
from sglang_pcie.patching.register import Entry

PATCHES_PAGE = "docs/patches.md"
README = "README.md"
# README.md's patch table lies between these two lines; ci/generate-docs rewrites what is between them.
README_BEGIN = "<!-- the patch table: generated from the register by ci/generate-docs, do not edit by hand -->"
README_END = "<!-- end of the patch table -->"


def register_table() -> str:
    """One row per patch: what it does, the releases it covers, how it is switched on, when it can go."""
    lines = ["| patch | what | releases | switched on by | remove when |", "|---|---|---|---|---|"]
    for e in register.REGISTER:
        switch = f"`{e.opt_in.variable}=1`" if e.opt_in else "default (off: `SGLANG_PCIE_DISABLE_PATCHES`)"
        lines.append(f"| `{e.id}` | {_cell(e.summary)} | {_range(e)} | {switch} | {_cell(e.remove_when)} |")
    return "\n".join(lines) + "\n"


def patches_page() -> str:
    parts = ["# The patches\n",
             "Generated from `sglang_pcie/patching/register.py` by `ci/generate-docs`; do not edit by hand. Each "
             "patch's own page (linked) explains it in depth; `sglang-pcie verify-patches --metadata` prints the "
             "same record.\n", register_table()]
    for e in register.REGISTER:
        parts.append(_section(e))
    return "\n".join(parts)


def readme_table() -> str:
    """README.md's short table: per patch its summary, a link to its page and its switch, in the register's order."""
    lines = ["| id | what it does | switch |", "|---|---|---|"]
    for e in register.REGISTER:
        switch = f"`{e.opt_in.variable}=1`" if e.opt_in else "default"
        lines.append(f"| `{e.id}` | {_cell(e.summary)} ([page](docs/{e.id}.md)) | {switch} |")
    return "\n".join(lines) + "\n"


def with_readme_table(readme: str) -> str:
    """``readme`` (README.md's text) with what lies between its two table markers replaced by ``readme_table()``."""
    head, begin, rest = readme.partition(README_BEGIN + "\n")
    _, end, tail = rest.partition(README_END)
    if not begin or not end:
        raise ValueError(f"{README} lacks the patch table's markers ({README_BEGIN} ... {README_END})")
    return head + begin + readme_table() + end + tail


def _section(e: Entry) -> str:
    refs = [f"- [{r.name}]({r.url}) ({r.state}, checked {e.checked}): {r.note}" for r in e.upstream]
    if e.upstream_note:
        refs.append(f"- {e.upstream_note}")
    switch = (f"opt-in: `{e.opt_in.variable}=1`; until then the patch is not even registered" if e.opt_in
              else "on by default where it applies; off with `SGLANG_PCIE_DISABLE_PATCHES=" + e.id + "`")
    return "\n".join([
        f"## `{e.id}`", "", e.summary, "", f"**Why.** {e.why}", "",
        f"**Releases.** {_range(e)} (`{e.releases}`). **Switch.** {switch}.", "",
        f"**Targets.** {', '.join(f'`{t}`' for t in e.targets)}.", "",
        "**Upstream.**", *refs, "", f"**Remove when.** {e.remove_when}.", "",
        f"**How upstream is detected.** {e.upstream_check}.", "",
        f"**At runtime.** {e.runtime_method}.", "", f"**Static check.** {e.static_method}.", "",
        f"Page: [docs/{e.id}.md]({e.id}.md).", ""])


def _range(e: Entry) -> str:
    bounds = [part.strip().lstrip("<>=") for part in e.releases.split(",")]
    return " to ".join(bounds)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
