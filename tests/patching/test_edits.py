"""SourceEdits, the one way patches edit source text: positions refer to the original text whatever the order."""
from __future__ import annotations

import ast

from sglang_pcie.patching.edits import SourceEdits

TEXT = "def f():\n    if a or b:\n        return 1\n    return 2\n"


def test_insertions_refer_to_the_original_positions_in_any_order():
    edits = SourceEdits(TEXT)
    edits.insert_at(2, 13, " or c")  # after "a or b" (0-based byte column, as ast gives)
    edits.insert_lines(2, "# before the if\n")  # indented as the if is
    edits.insert_lines(1, "# first\n")
    assert edits.changed
    assert edits.text() == ("# first\ndef f():\n    # before the if\n    if a or b or c:\n        return 1\n"
                            "    return 2\n")


def test_lines_inserted_before_one_line_keep_their_order_and_an_explicit_indent_wins():
    edits = SourceEdits(TEXT)
    edits.insert_lines(5, "one()\n", indent="    ")
    edits.insert_lines(5, "\ntwo()\n", indent="    ")
    assert edits.text().endswith("    return 2\n    one()\n\n    two()\n")


def test_indent_a_block_and_columns_count_bytes():
    edits = SourceEdits("x = 'é'\nif y:\n    pass\n")
    edits.insert_at(1, 8, "  # après")  # the byte column after the closing quote (é is two bytes)
    edits.indent(2, 3)
    assert edits.text() == "x = 'é'  # après\n    if y:\n        pass\n"


def test_no_edit_is_the_same_text():
    edits = SourceEdits(TEXT)
    assert not edits.changed and edits.text() == TEXT


def test_new_definitions_go_above_the_first_definitions_decorators_and_comments():
    text = "import x\n\nY = 1\n# about f\n# more\n@dec\ndef f():\n    pass\n"
    edits = SourceEdits(text)
    assert edits.first_definition_line(ast.parse(text)) == 4


def test_lines_inserted_before_a_blank_line_are_not_indented_and_blank_lines_are_not_indented_by_a_block():
    edits = SourceEdits("def f():\n    x = 1\n    \n    return x\n")
    edits.insert_lines(3, "y = 2\n")  # before a line of spaces only: no indent taken from it
    assert edits.text() == "def f():\n    x = 1\ny = 2\n    \n    return x\n"
    edits = SourceEdits("if a:\n    b()\n\n    c()\n")
    edits.indent(2, 4)
    assert edits.text() == "if a:\n        b()\n\n        c()\n"


def test_a_comment_on_the_first_line_goes_with_the_definition_below_it():
    text = "# about f\ndef f():\n    pass\n"
    assert SourceEdits(text).first_definition_line(ast.parse(text)) == 1
