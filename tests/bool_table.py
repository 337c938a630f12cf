"""Rows of the shared boolean truth table file (libvgpu/include/vgpu_bool_table.txt) for the
Python and C tests."""

from __future__ import annotations

from pathlib import Path

TABLE = Path(__file__).resolve().parents[1] / "libvgpu" / "include" / "vgpu_bool_table.txt"


def read_table(path: Path = TABLE) -> list[tuple[str, str]]:
    """(value, reading) rows of the table file; reading is 'true', 'false' or 'invalid'."""
    rows = []
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        assert line.startswith('"'), line
        i, out = 1, []
        while line[i] != '"':
            c = line[i]
            if c == "\\":
                i += 1
                c = {"t": "\t", '"': '"', "\\": "\\"}[line[i]]
            out.append(c)
            i += 1
        reading = line[i + 1 :].split()[0]
        assert reading in ("true", "false", "invalid"), line
        rows.append(("".join(out), reading))
    return rows


ROWS = read_table()
