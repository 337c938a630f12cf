"""The one printer of aligned text tables, and the colours their cells may carry.

Used by `hami inspect` and `hami explain` (`hami.tools.render`) and by `hami simulate`'s summary and
what-if (`hami.simulate.report`, `hami.simulate.whatif`). A table is a header and rows of strings:
columns are padded to their widest cell and joined by two spaces, optionally under a rule of dashes as
wide as each column; trailing blanks are stripped from every line.

Colour only when the output is a terminal and ``NO_COLOR`` is not set (https://no-color.org); a pipe or a
file gets plain text, so golden outputs and `grep` see the same bytes.

Why not a library (tabulate, rich): tabulate widens every column to its header plus two (a module-wide
``MIN_PADDING``), pads the last column with blanks and cannot wrap the header line in one colour code;
getting today's bytes from it takes more code than this printer.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping, Sequence
from typing import IO

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Style:
    """ANSI colours, or nothing when `enabled` is False."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def _wrap(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.enabled and text else text

    def bad(self, text: str) -> str:
        return self._wrap("31", text)

    def warn(self, text: str) -> str:
        return self._wrap("33", text)

    def good(self, text: str) -> str:
        return self._wrap("32", text)

    def head(self, text: str) -> str:
        return self._wrap("1", text)


def use_color(stream: IO[str], env: Mapping[str, str] | None = None) -> bool:
    """Colour for `stream`: a terminal, ``NO_COLOR`` unset (any value, even empty, turns it off), TERM not dumb."""
    env = os.environ if env is None else env
    if "NO_COLOR" in env or env.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def visible_len(text: str) -> int:
    """Columns `text` takes on a terminal: its length without ANSI colour codes."""
    return len(_ANSI.sub("", text))


def table(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    left: Collection[int] | None = None,
    rule: bool = False,
    indent: str = "",
    style: Style | None = None,
) -> list[str]:
    """The lines of one table: `header`, with `rule` a line of dashes under it, then `rows` (each as
    long as `header`).

    `left`: the columns aligned left, by index (negative counts from the end); the others are aligned
    right. None: every column left. `indent` starts every line. With a `style`, the header line is
    its `head` colour and cells may carry its colour codes, which take no width; without one every
    character counts (the simulator's tables have no colour).
    """
    width = len if style is None else visible_len
    n = len(header)
    lefts = None if left is None else {i % n for i in left}
    widths = [width(h) for h in header]
    for r in rows:
        for i, cell in enumerate(r):
            widths[i] = max(widths[i], width(cell))

    def line(cells: Sequence[str]) -> str:
        parts = []
        for i, c in enumerate(cells):
            pad = " " * (widths[i] - width(c))
            parts.append(c + pad if lefts is None or i in lefts else pad + c)
        return (indent + "  ".join(parts)).rstrip()

    top = line(header)
    out = [top if style is None else style.head(top)]
    if rule:
        out.append(line(["-" * w for w in widths]))
    out.extend(line(r) for r in rows)
    return out


__all__ = ("Style", "table", "use_color", "visible_len")
