"""Write the values reference of docs/install.md from helm/hami/values.yaml's "# --" comments.

    python scripts/gen_values_reference.py          # rewrite the table between the markers
    python scripts/gen_values_reference.py --check  # exit 1 when the table is out of date (the test runs this)

Each key documented with a "# -- text" comment line right above it becomes one row: the dotted key, its
default (as JSON, from values.yaml itself) and the text. The table sits between
``<!-- values-reference:start -->`` and ``<!-- values-reference:end -->`` in docs/install.md.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
VALUES = ROOT / "helm" / "hami" / "values.yaml"
DOC = ROOT / "docs" / "install.md"
START, END = "<!-- values-reference:start -->", "<!-- values-reference:end -->"
_KEY = re.compile(r"^(\s*)([A-Za-z0-9_.-]+):(.*)$")


def documented_keys(text: str) -> list[tuple[str, str]]:
    """[(dotted key, description)] in file order, for every key under a "# --" comment."""
    out: list[tuple[str, str]] = []
    stack: list[tuple[int, str]] = []
    pending: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = stripped[4:].strip()
            continue
        if stripped.startswith("#") or not stripped or stripped.startswith("- "):
            if not stripped.startswith("#"):
                pending = pending if not stripped else None
            continue
        m = _KEY.match(line)
        if not m:
            pending = None
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group(2)))
        if pending is not None:
            out.append((".".join(k for _, k in stack), pending))
            pending = None
    return out


def lookup(values: dict[str, Any], dotted: str) -> Any:
    node: Any = values
    for part in dotted.split("."):
        node = node[part]
    return node


def table() -> str:
    text = VALUES.read_text()
    values = yaml.safe_load(text)
    rows = ["| Key | Default | Description |", "|---|---|---|"]
    for key, desc in documented_keys(text):
        default = json.dumps(lookup(values, key))
        cell = desc.replace("|", "\\|")
        rows.append(f"| `{key}` | `{default}` | {cell} |")
    return "\n".join(rows)


def updated(doc: str) -> str:
    if START not in doc or END not in doc:
        raise SystemExit(f"{DOC.relative_to(ROOT)}: markers {START} / {END} not found")
    head, rest = doc.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 when the table is out of date")
    args = p.parse_args(argv)
    doc = DOC.read_text()
    new = updated(doc)
    if args.check:
        if new != doc:
            print(
                f"{DOC.relative_to(ROOT)}: values reference out of date: run python scripts/gen_values_reference.py",
                file=sys.stderr,
            )
            return 1
        return 0
    DOC.write_text(new)
    print(f"updated {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
