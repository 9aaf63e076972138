"""Pages generated from the patch register stay current, and the register's records are complete."""
from __future__ import annotations

import subprocess
import sys

from sglang_pcie.patching import pages, register
from support import REPO


def test_docs_patches_md_is_what_the_register_renders():
    committed = (REPO / pages.PATCHES_PAGE).read_text()
    assert committed == pages.patches_page(), "docs/patches.md is stale: run ci/generate-docs"


def test_readme_patch_table_is_what_the_register_renders():
    committed = (REPO / pages.README).read_text()
    assert committed == pages.with_readme_table(committed), "README.md's patch table is stale: run ci/generate-docs"
    assert committed.count(pages.README_BEGIN) == committed.count(pages.README_END) == 1
    for entry in register.REGISTER:
        assert f"| `{entry.id}` | " in committed and f"([page](docs/{entry.id}.md))" in committed, entry.id


def test_generate_docs_check_agrees():
    done = subprocess.run([sys.executable, str(REPO / "ci" / "generate-docs"), "--check"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "is current" in done.stdout, done.stdout + done.stderr


def test_every_patch_has_its_page_and_complete_upstream_references():
    states = {register.OPEN, register.MERGED, register.CLOSED, register.RELEASED, register.FIXED}
    for entry in register.REGISTER:
        assert (REPO / "docs" / f"{entry.id}.md").is_file(), entry.id
        assert entry.upstream or entry.upstream_note, entry.id
        for ref in entry.upstream:
            assert ref.url.startswith("https://") and ref.state in states and ref.note, (entry.id, ref)
        assert entry.why and entry.remove_when and entry.checked


def test_the_register_table_heads_compatibility_md():
    assert pages.register_table() in (REPO / "COMPATIBILITY.md").read_text()
