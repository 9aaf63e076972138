"""A module's text cut at its top-level statements, for SourceTree's cheap reading (see source.py).

Parsing all of ``srt/models`` takes more than a second; cutting its text takes a tenth of that. A line at column 0
(outside a triple-quoted string, not a comment or a closing bracket) starts a statement; ``else``/``except``/
``finally`` and the definition a decorator belongs to continue one. Each ``def`` and ``class`` statement is kept as
text (a Definition), parsed only when asked for; the other statements are parsed one at a time, when a name they
mention is asked for. A cut that turns out wrong (a statement that does not parse, a definition whose triple
quotes do not pair up) gives way to parsing the whole module.
"""
from __future__ import annotations

import ast
import bisect
import itertools
import re
import textwrap
from dataclasses import dataclass, field

# A line that starts a top-level statement (not indented, not a comment, not closing a bracket). Patterns start
# with a literal (not ^) so that re can skip ahead quickly.
_TOP_LEVEL_LINE = re.compile(r"\n[^\s#)\]}]")
_CONTINUATION = re.compile(r"(?:else|elif|except|finally)\b")  # the rest of the statement above
_DEFINITION = re.compile(r"^(?:async\s+)?(def|class)\s+(\w+)\s*(?:\(([^)]*)\))?(\s*:)?", re.M)
_METHOD_LINE = re.compile(r"\n(?:    )?(?:async\s+)?def\s")  # a top-level function or a method
_OUTER_LINE = re.compile(r"\n(?:    )?[^\s#)\]}]")  # a line at indentation 0 or 4


@dataclass
class Definition:
    """A top-level ``def`` or ``class`` statement, cut from the module's text; parsed only when asked for."""

    kind: str  # "def" or "class"
    name: str
    text: str  # the statement's source, decorators included
    line: int  # its first line in the module
    bases: tuple[str, ...] = ()  # a class's bases as written (a text filter: not resolved, subscripts dropped)
    header: str | None = None  # "class Name(bases):" where the bases hold no parenthesis (else None)
    node: ast.AST | None = field(default=None, repr=False)
    base_nodes: list | None = field(default=None, repr=False)


@dataclass
class Piece:
    """A top-level statement other than a def or class at column 0 (imports, assignments, if/try blocks)."""

    text: str
    line: int  # its first line in the module
    body: list | None = None  # its statements, parsed when a name it mentions is asked for


@dataclass
class Cut:
    """A module cut at its top-level statements, nothing parsed yet."""

    pieces: list  # each statement, in order: a Definition or a Piece
    classes: dict  # name -> Definition, for the class statements
    _index: tuple | None = field(default=None, repr=False)

    def mentioning(self, name: str) -> list:
        """The statements that could bind ``name``, in order: its definitions, and the other statements whose text
        mentions it (found with str.find in their joined text: thousands of names are asked for)."""
        if self._index is None:
            texts = [(i, p.text) for i, p in enumerate(self.pieces) if isinstance(p, Piece)]
            starts = list(itertools.accumulate([len(text) + 1 for _, text in texts], initial=0))
            defined: dict = {}
            for i, piece in enumerate(self.pieces):
                if isinstance(piece, Definition):
                    defined.setdefault(piece.name, []).append(i)
            self._index = ("\0".join(text for _, text in texts), starts, [i for i, _ in texts], defined)
        joined, starts, where, defined = self._index
        found, position = list(defined.get(name, ())), joined.find(name)
        while position >= 0:
            at = bisect.bisect_right(starts, position) - 1
            found.append(where[at])
            position = joined.find(name, starts[at + 1])
        return [self.pieces[i] for i in sorted(found)]


@dataclass
class Whole:
    """A module parsed whole, where the cut does not work."""

    names: dict  # name -> the statement binding it last
    statements: list
    classes: dict  # name -> Definition (with its node) of each class statement at column 0


def executed_top_level(body: list[ast.stmt]):
    """The statements of a module body that run at import, looking into ``if``/``try``/``with`` blocks."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            if ast.unparse(stmt.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):  # the body never runs
                yield from executed_top_level(stmt.orelse)
                continue
            if ast.unparse(stmt.test) in ("not TYPE_CHECKING", "not typing.TYPE_CHECKING"):  # only the body runs
                yield from executed_top_level(stmt.body)
                continue
            yield from executed_top_level(stmt.body)
            yield from executed_top_level(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                yield from executed_top_level(block)
        elif isinstance(stmt, ast.With):
            yield from executed_top_level(stmt.body)
        else:
            yield stmt


def bound_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, ast.Import):
        return [a.asname or a.name.split(".")[0] for a in stmt.names]
    if isinstance(stmt, ast.ImportFrom):
        return [a.asname or a.name for a in stmt.names if a.name != "*"]
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
        stmt, (ast.AnnAssign, ast.AugAssign)) and (not isinstance(stmt, ast.AnnAssign) or stmt.value) else []
    return [name for t in targets for name in _target_names(t)]


def attribute_and_keyword_names(module_tree: ast.Module | None) -> set[str]:
    """Attribute names, keyword-argument names and annotated (dataclass field) names anywhere in a module: where a
    patch reads a field of SGLang's objects, whether the release still spells it so."""
    names = set()
    for node in ast.walk(module_tree) if module_tree is not None else ():
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def in_release_span(version: str, first: str, last: str | None) -> bool:
    """Whether ``version`` lies in [first, last] (last None: no end); False where the version is unknown."""
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(version)
    except InvalidVersion:
        return False
    return release >= Version(first) and (last is None or release <= Version(last))


def _target_names(target: ast.expr) -> list[str]:
    """The names an assignment target binds: ``a``, ``a, (b, *c)``; ``A.b = ...`` and ``a[i] = ...`` bind none."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _target_names(element)]
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    return []


def without_mark(source: str) -> str:
    return source[1:] if source.startswith("\ufeff") else source  # a byte-order mark (some model files have one)


def cut_module(text: str) -> Cut | None:
    """The module cut at the lines that start a top-level statement (outside triple-quoted strings), in order:
    a Definition for each def and class, a Piece for each other statement. None when a string is not closed or
    a definition's triple quotes do not pair up (a line at column 0 inside a string: the cut is wrong)."""
    strings = triple_quoted(text)
    if strings is None:
        return None
    starts = [0] if text[:1].strip() and text[0] not in "#)]}" else []
    inside, string = iter(strings), (strings[0] if strings else None)
    for match in _TOP_LEVEL_LINE.finditer(text):
        start = match.start() + 1
        while string and string[1] <= start:
            string = next(inside, None)
        if string and string[0] < start:
            continue
        if starts and (_CONTINUATION.match(text, start) or text[starts[-1]] == "@"
                       and not _DEFINITION.search(text, starts[-1], start)):
            continue  # else/except/finally, or the def a decorator belongs to: one statement
        starts.append(start)
    cut, line = Cut([], {}), 1 + text.count("\n", 0, starts[0] if starts else 0)
    for start, end in zip(starts, starts[1:] + [len(text)]):
        header = _DEFINITION.match(text, start, end)
        if header is None and text[start] == "@":
            header = _DEFINITION.search(text, start, end)
        piece = text[start:end]
        if header is None:
            cut.pieces.append(Piece(piece, line))
        elif piece.count('"""') % 2 or piece.count("'''") % 2:
            return None
        else:
            kind, name, bases, colon = header.groups()
            exact = kind == "class" and colon  # the bases end where the header does
            cut.pieces.append(Definition(kind, name, piece, line, tuple(
                b.split("[")[0].strip() for b in (bases or "").split(",") if b.strip() and "=" not in b),
                header.group(0) if exact else None))
            if kind == "class":
                cut.classes[name] = cut.pieces[-1]
        line += piece.count("\n")
    return cut


def defines_in_body(definition: Definition, member: str) -> bool:
    """Whether a class's text has ``def member(`` or ``member = ...`` at the indentation of its body (the first
    line after its header), outside triple-quoted strings: a cheap yes; a no is left to the parsed class."""
    text = definition.text
    start = text.find(definition.header) + len(definition.header)
    body = re.compile(r"\n([ \t]+)[^\s#]").search(text, start)
    if body is None:
        return False
    strings = triple_quoted(text)
    if strings is None:
        return False
    name = re.escape(member)
    pattern = re.compile(rf"\n{body.group(1)}(?:(?:async\s+)?def\s+{name}\s*\(|{name}\s*(?::[^=\n]*)?=(?!=))")
    return any(not any(a < m.start() < b for a, b in strings) for m in pattern.finditer(text, start))


def parsed(piece: Piece) -> list[ast.stmt]:
    """A cut statement's ast (SyntaxError when the cut was wrong); a def or class in it keeps the module's line
    numbers (class_node hands it out)."""
    if piece.body is None:
        body = ast.parse(piece.text).body
        if "def " in piece.text or "class " in piece.text:
            for stmt in body:
                ast.increment_lineno(stmt, piece.line - 1)
        piece.body = body
    return piece.body


def triple_quoted(text: str) -> list[tuple[int, int]] | None:
    """(start, end) of each triple-quoted string, in order (str.find, much faster than a regular expression);
    None when one is not closed."""
    spans, position = [], 0
    double, single = text.find('"""'), text.find("'''")
    while double >= 0 or single >= 0:
        start = double if single < 0 or 0 <= double < single else single
        end = text.find(text[start:start + 3], start + 3)
        if end < 0:
            return None
        spans.append((start, end + 3))
        position = end + 3
        if 0 <= double < position:
            double = text.find('"""', position)
        if 0 <= single < position:
            single = text.find("'''", position)
    return spans


def parse_whole(text: str) -> Whole:
    """A module parsed whole (where the cut does not work)."""
    try:
        body = ast.parse(text).body
    except SyntaxError:  # no module Python could import: it binds nothing
        body = []
    whole = Whole({}, body, {})
    for stmt in executed_top_level(body):
        for name in bound_names(stmt):
            whole.names[name] = stmt
    lines = text.splitlines(keepends=True)
    for node in body:
        if isinstance(node, ast.ClassDef):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            bases = tuple(ast.unparse(b).split("[")[0] for b in node.bases)
            whole.classes[node.name] = Definition("class", node.name, "".join(lines[first - 1:node.end_lineno]),
                                                  first, bases, node=node)
    return whole


def functions_mentioning(text: str, words) -> list[ast.AST]:
    """The ast of each top-level function, and each method of a top-level class, whose text mentions one of
    ``words``, each parsed alone (the whole module, as one ast, where a cut does not parse)."""
    text = "\n" + text  # so that the first line matches the patterns too
    found = []
    for start in [m.start() + 1 for m in _METHOD_LINE.finditer(text)]:
        following = _OUTER_LINE.search(text, text.index("\n", start))
        segment = text[start:following.start() if following else len(text)]
        if any(word in segment for word in words):
            try:
                found.append(ast.parse(textwrap.dedent(segment)).body[0])
            except SyntaxError:  # the segment was cut short: take the whole module
                return [ast.parse(text)]
    return found
