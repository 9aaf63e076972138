"""The one way a patch edits source text: insertions by (1-based) line and column, an indented block, applied
bottom-up so that every position given refers to the original text. A patch's ``rewrite`` builds its new source with
it; the versioned diffs and the runtime patches are made from that text."""
from __future__ import annotations

import ast


class SourceEdits:
    def __init__(self, text: str):
        self.lines = text.splitlines(keepends=True)
        self._edits = []  # (line, order, column, sequence, kind, payload); order: same-line edits before new lines

    @property
    def changed(self) -> bool:
        return bool(self._edits)

    def insert_at(self, line: int, column: int, text: str) -> None:
        """Insert ``text`` at an ast position (``column`` counts UTF-8 bytes, as ast does)."""
        self._add(line, 1, column, "at", text)

    def insert_lines(self, before: int, text: str, indent: str | None = None) -> None:
        """Insert lines before line ``before`` (``len(lines) + 1``: at the end). They are indented as that line is
        now, or by ``indent`` where given; ``text`` is written unindented. Lines inserted before the same line keep
        the order they were inserted in."""
        if indent is None:
            target = self.lines[before - 1] if before <= len(self.lines) else ""
            indent = target[:len(target) - len(target.lstrip())] if target.strip() else ""
        lines = [indent + line if line.strip() else line for line in text.splitlines(keepends=True)]
        self._add(before, 0, 0, "lines", lines)

    def indent(self, first: int, last: int) -> None:
        """Indent lines ``first`` to ``last`` (inclusive) by one level."""
        self._add(first, 1, -1, "indent", last)

    def first_definition_line(self, tree: ast.Module) -> int:
        """The line before which new definitions go: the module's first top-level def or class, moved up over its
        decorators and the comments above it (``tree``: the original text's)."""
        first = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)))
        line = min([first.lineno] + [d.lineno for d in first.decorator_list])
        while line > 1 and self.lines[line - 2].lstrip().startswith("#"):
            line -= 1
        return line

    def text(self) -> str:
        lines = list(self.lines)
        for line, _, column, _, kind, payload in sorted(self._edits, reverse=True):
            i = line - 1
            if kind == "at":
                raw = lines[i].encode()
                lines[i] = (raw[:column] + payload.encode() + raw[column:]).decode()
            elif kind == "indent":
                for j in range(i, payload):
                    lines[j] = "    " + lines[j] if lines[j].strip() else lines[j]
            else:
                lines[i:i] = payload
        return "".join(lines)

    def _add(self, line: int, order: int, column: int, kind: str, payload) -> None:
        # The sequence number breaks ties so that payloads are never compared; reversed (bottom-up), the earlier
        # insertion before a line is applied last and so stands first.
        self._edits.append((line, order, column, len(self._edits), kind, payload))
