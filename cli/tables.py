"""Width-aware text and tables for the terminal.

Every table the CLI prints goes through `table_lines`: rich lays it out to the
output's width, numbers right-aligned, and the columns that hold ids, errors and
skill text are cut with an ellipsis instead of wrapping the row. Off a terminal
(a pipe, a file, CI, CliRunner) the width is $COLUMNS when it is set; without it
nothing is cut or folded (each row and sentence on one line, whole), and there
is no colour.
"""

from __future__ import annotations

import io
import os
import sys
import textwrap
from dataclasses import dataclass
from typing import Any

from rich.box import Box
from rich.cells import cell_len, set_cell_size
from rich.console import Console
from rich.table import Table
from rich.text import Text

# A rule under the header and nothing else, in ASCII: "-----  ---  ----".
RULE_BOX = Box("    \n    \n -  \n    \n    \n    \n    \n    \n", ascii=True)
ELLIPSIS = "…"
DEFAULT_WIDTH = 80
# Off a terminal without $COLUMNS: no width to fit, so nothing is cut (a pipe or a file gets the whole text).
UNBOUNDED = 100_000
MIN_SHRUNK = 8  # a cut column keeps at least this many cells (7 characters and the ellipsis)


def _stdout_is_tty() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def output_width() -> int:
    """The width to render to: $COLUMNS when set (as rich does), else the
    terminal's width when stdout is one (80 when it cannot be read), else
    UNBOUNDED: what goes to a pipe or a file is not cut."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if _stdout_is_tty():
        try:
            return os.get_terminal_size(sys.stdout.fileno()).columns or DEFAULT_WIDTH
        except (AttributeError, ValueError, OSError):
            return DEFAULT_WIDTH
    return UNBOUNDED


def _console(width: int, out: io.StringIO) -> Console:
    # Colour (bold headers) only on a terminal; force_terminal=False also overrides FORCE_COLOR,
    # so piped and captured output never holds an escape sequence. markup=False: text such as
    # "[applied]" is shown as it is.
    return Console(file=out, width=width, force_terminal=_stdout_is_tty(), highlight=False,
                   markup=False, emoji=False, legacy_windows=False)


def one_line(value: Any) -> str:
    """A cell's text on one line (an error text may hold newlines)."""
    return " ".join(str(value).split())


def clip(text: str, width: int) -> str:
    """`text` cut to `width` cells, ending in an ellipsis when cut."""
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    return set_cell_size(text, width - 1) + ELLIPSIS


def shorten(text: str, limit: int) -> str:
    """`text` on one line, cut at a word to at most `limit` characters, ending in an ellipsis when cut."""
    text = one_line(text)
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    if " " in cut[limit // 2:]:  # end at a word, unless that leaves less than half
        cut = cut[:cut.rindex(" ")]
    return cut.rstrip(" ,;:") + ELLIPSIS


def text_block(head: str, text: str, width: int, indent: str = "      ", max_lines: int = 12) -> list[str]:
    """`head` then a text that may hold several lines (an edit's content): one line goes after `head`; several
    go below it, each at `indent`, folded at the width rather than cut; after `max_lines` of the text, one line
    says how many more it has."""
    body = text.strip("\n").splitlines() or [""]
    if len(body) == 1:
        return wrapped(head + body[0], width, indent)
    lines = wrapped(head.rstrip(), width, indent)
    for line in body[:max_lines]:
        lines.extend(wrapped(indent + line, width, indent + "  ") if line.strip() else [""])
    if len(body) > max_lines:
        left = len(body) - max_lines
        lines.append(f"{indent}{ELLIPSIS} {left} more line{'s' * (left != 1)}")
    return lines


def wrapped(text: str, width: int, indent: str = "    ") -> list[str]:
    """A sentence folded at spaces into lines of at most `width` cells; the
    lines after the first are indented."""
    return textwrap.wrap(text.rstrip(), width=max(width, len(indent) + 8), subsequent_indent=indent,
                         break_on_hyphens=False) or [""]


@dataclass(frozen=True)
class Col:
    """A table column: numbers are right-aligned; a `shrink` column (ids, errors,
    skill text) is the one cut with an ellipsis when the table is too wide."""

    header: str
    num: bool = False
    shrink: bool = False


def _fit(natural: list[int], shrink: list[bool], room: int) -> list[int]:
    """Column widths that fit `room`: the widest shrinkable column loses a cell
    at a time, down to MIN_SHRUNK."""
    widths = list(natural)
    floor = [min(n, MIN_SHRUNK) if s else n for n, s in zip(natural, shrink, strict=True)]
    excess = sum(widths) - room
    while excess > 0:
        candidates = [i for i, w in enumerate(widths) if w > floor[i]]
        if not candidates:
            break  # only fixed columns left: rich reduces them all evenly, still one line per row
        i = max(candidates, key=lambda k: widths[k])
        widths[i] -= 1
        excess -= 1
    return widths


def table_lines(cols: list[Col], rows: list[list[Any]], width: int | None = None, indent: int = 0) -> list[str]:
    """The table as lines of at most `width` cells (default: the output's
    width), one line per row; `indent` spaces before each line."""
    width = output_width() if width is None else width
    room = max(width - indent, 10)
    cells = [[one_line(c) for c in row] for row in rows]
    natural = [max([cell_len(col.header)] + [cell_len(r[i]) for r in cells]) for i, col in enumerate(cols)]
    gaps = 2 * (len(cols) - 1)  # a separator and one cell of padding between columns
    widths = _fit(natural, [c.shrink for c in cols], room - gaps)
    table = Table(box=RULE_BOX, safe_box=True, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0),
                  header_style="bold")
    for col, w in zip(cols, widths, strict=True):
        table.add_column(col.header, justify="right" if col.num else "left", no_wrap=True, overflow="ellipsis",
                         max_width=w)
    for row in cells:
        table.add_row(*(Text(c) for c in row))
    out = io.StringIO()
    _console(room, out).print(table)
    pad = " " * indent
    return [pad + line.rstrip() for line in out.getvalue().splitlines()]


def fmt(value: float | None) -> str:
    """A score with three decimals; `-` when there is none."""
    return "-" if value is None else f"{value:.3f}"
