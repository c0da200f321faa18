"""Where a quoted number sits in a Markdown page: its anchor. Plain Python, no delaylab.

A number a page quotes is checked at its place, not anywhere in the file (a short quote such as
"censored" or "6/6" is found somewhere in any long page). An anchor is a dict of one of three kinds:

- ``{"claim": ID}``: the text between ``<!-- claim:ID -->`` and its ``<!-- /claim -->``;
- ``{"section": S, "row": R, "column": C}``: one table cell. ``S`` is the start of the heading the
  table sits under (its section runs to the next heading of the same or a higher level); ``R`` is
  the row's first cell, or ``{column header: cell}`` for a row that only several cells name; ``C``
  is the column's header. Exactly one row of one table of the section must match;
- ``{"table": ID, "row": R, "column": C}``: the same, in the table between
  ``<!-- table:ID -->`` and ``<!-- /table -->``;
- ``{"section": S, "paragraph": P}``: the one paragraph (or list item) of section ``S`` that
  contains ``P``.

:func:`region` returns the anchored text with its whitespace collapsed (a quote may wrap a line);
:func:`quotes` is the test: the value occurs in the region as a whole token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")
_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+")
_OPEN = re.compile(r"<!--\s*claim:([\w.:-]+)\s*-->")
_CLOSE = re.compile(r"<!--\s*/claim\s*-->")
_TABLE = re.compile(r"<!--\s*table:([\w.:-]+)\s*-->(.*?)<!--\s*/table\s*-->", re.S)


class AnchorError(AssertionError):
    """An anchor that names no place, or more than one."""


@dataclass
class Block:
    """A paragraph, a list item or a table of one section (``rows``: the table's cells, header first)."""

    lines: list[str]
    rows: list[list[str]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return " ".join(" ".join(line.split()) for line in self.lines)


def _cells(line: str) -> list[str]:
    """The cells of a table row; ``\\|`` is a pipe inside a cell."""
    parts = re.split(r"(?<!\\)\|", line.strip())
    return [p.strip().replace("\\|", "|") for p in parts[1:-1]]


def sections(text: str) -> list[tuple[int, str, list[str]]]:
    """``(level, title, lines)`` of every heading, its lines running to the next heading of the same
    or a higher level (fenced code is not searched for headings)."""
    lines = text.splitlines()
    heads, fenced = [], False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        m = None if fenced else _HEADING.match(line)
        if m:
            heads.append((i, len(m.group(1)), m.group(2)))
    out = []
    for k, (i, level, title) in enumerate(heads):
        end = next((j for j, lv, _ in heads[k + 1:] if lv <= level), len(lines))
        out.append((level, title, lines[i + 1:end]))
    return out


def section(text: str, start: str) -> list[str]:
    """The lines of the one section whose heading starts with ``start``."""
    found = [lines for _, title, lines in sections(text) if title.startswith(start)]
    if len(found) != 1:
        raise AnchorError(f"{len(found)} headings start with {start!r}")
    return found[0]


def blocks(lines: list[str]) -> list[Block]:
    """The paragraphs, list items and tables of ``lines`` (headings and fenced code left out)."""
    out: list[Block] = []
    cur: Block | None = None
    fenced = False
    for line in lines:
        if line.lstrip().startswith("```"):
            fenced, cur = not fenced, None
            continue
        if fenced or not line.strip() or _HEADING.match(line):
            cur = None
            continue
        is_row = line.lstrip().startswith("|")
        if is_row:
            if cur is None or not cur.rows:
                cur = Block([])
                out.append(cur)
            cur.lines.append(line)
            if not re.fullmatch(r"\|?[\s:|-]+\|?", line.strip()):  # not the header's rule
                cur.rows.append(_cells(line))
            continue
        if cur is None or cur.rows or _ITEM.match(line):
            cur = Block([])
            out.append(cur)
        cur.lines.append(line)
    return out


def claim(text: str, ident: str) -> str:
    """The text between ``<!-- claim:ident -->`` and its closing marker (claims may nest)."""
    opens = [m for m in _OPEN.finditer(text) if m.group(1) == ident]
    if len(opens) != 1:
        raise AnchorError(f"{len(opens)} markers open claim {ident!r}")
    depth, pos = 1, opens[0].end()
    for m in sorted([*_OPEN.finditer(text, pos), *_CLOSE.finditer(text, pos)], key=lambda m: m.start()):
        depth += 1 if m.re is _OPEN else -1
        if depth == 0:
            return " ".join(text[pos:m.start()].split())
    raise AnchorError(f"claim {ident!r} is never closed")


def table(text: str, ident: str) -> list[str]:
    """The lines between ``<!-- table:ident -->`` and its ``<!-- /table -->``."""
    found = [m.group(2) for m in _TABLE.finditer(text) if m.group(1) == ident]
    if len(found) != 1:
        raise AnchorError(f"{len(found)} markers open table {ident!r}")
    return found[0].splitlines()


def cell(text: str, start: str, row, column: str, lines: list[str] | None = None) -> str:
    """The cell of ``row`` under ``column`` in the tables of the section starting ``start`` (or in
    ``lines``)."""
    found = []
    for b in blocks(section(text, start) if lines is None else lines):
        if not b.rows or column not in b.rows[0]:
            continue
        head = b.rows[0]
        want = {head[0]: row} if isinstance(row, str) else row
        if not set(want) <= set(head):
            continue
        found += [r[head.index(column)] for r in b.rows[1:] if len(r) == len(head)
                  and all(r[head.index(h)] == v for h, v in want.items())]
    if len(found) != 1:
        raise AnchorError(f"{len(found)} cells at row {row!r}, column {column!r} in {start!r}")
    return " ".join(found[0].split())


def paragraph(text: str, start: str, phrase: str) -> str:
    """The one paragraph or list item of the section starting ``start`` that contains ``phrase``."""
    found = [b.text for b in blocks(section(text, start)) if not b.rows and phrase in b.text]
    if len(found) != 1:
        raise AnchorError(f"{len(found)} paragraphs under {start!r} contain {phrase!r}")
    return found[0]


def region(text: str, anchor: dict) -> str:
    """The text an anchor names (see the module's docstring)."""
    if set(anchor) == {"claim"}:
        return claim(text, anchor["claim"])
    if set(anchor) == {"section", "row", "column"}:
        return cell(text, anchor["section"], anchor["row"], anchor["column"])
    if set(anchor) == {"table", "row", "column"}:
        return cell(text, anchor["table"], anchor["row"], anchor["column"], table(text, anchor["table"]))
    if set(anchor) == {"section", "paragraph"}:
        return paragraph(text, anchor["section"], anchor["paragraph"])
    raise AnchorError(f"not an anchor: {anchor!r}")


def quotes(region_text: str, value: str) -> bool:
    """``value`` occurs in ``region_text`` as a whole token: not inside a longer number or word
    (``16 [6.3, 30]`` is not quoted by ``116 [6.3, 30]``, nor ``0.4`` by ``0.41``)."""
    value = " ".join(value.split())
    for m in re.finditer(re.escape(value), region_text):
        before = region_text[m.start() - 1] if m.start() else " "
        after = region_text[m.end():m.end() + 2]
        if (before.isalnum() or before in "._") and (value[0].isalnum() or value[0] in "._"):
            continue
        if after[:1].isalnum() and value[-1].isalnum() or re.match(r"\.\d", after) and value[-1].isdigit():
            continue
        return True
    return False

