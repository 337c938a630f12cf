"""Write the values reference of docs/install.md from helm/hami/values.yaml's "# --" comments, and the
table of HAMi's keys this chart does not honour from helm/hami/files/hami-keys.yaml.

    python scripts/gen_values_reference.py          # rewrite the table between the markers
    python scripts/gen_values_reference.py --check  # exit 1 when the table is out of date (the test runs this)

Each key documented with a "# -- text" comment line right above it becomes one row: the dotted key, its
default (as JSON, from values.yaml itself) and the text. The table sits between
``<!-- values-reference:start -->`` and ``<!-- values-reference:end -->`` in docs/install.md; the HAMi keys
between ``<!-- hami-keys:start -->`` and ``<!-- hami-keys:end -->``.
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
HAMI_KEYS = ROOT / "helm" / "hami" / "files" / "hami-keys.yaml"
KEYS_START, KEYS_END = "<!-- hami-keys:start -->", "<!-- hami-keys:end -->"
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


#: A default longer than this (as JSON) is not spelled out in the table, where it would fill a screen.
LONG_DEFAULT = 200


def default_cell(value: Any) -> str:
    """The Default column: the value as JSON, or for a long list or map how many entries it has and
    where it is written in full."""
    text = json.dumps(value)
    if len(text) <= LONG_DEFAULT:
        return f"`{text}`"
    what = "a list of" if isinstance(value, list) else "a map of"
    return f"{what} {len(value)} entries (in full in [values.yaml](../helm/hami/values.yaml))"


def table() -> str:
    text = VALUES.read_text()
    values = yaml.safe_load(text)
    rows = ["| Key | Default | Description |", "|---|---|---|"]
    for key, desc in documented_keys(text):
        cell = desc.replace("|", "\\|")
        rows.append(f"| `{key}` | {default_cell(lookup(values, key))} | {cell} |")
    return "\n".join(rows)


def hami_keys_table() -> str:
    """One row per key of files/hami-keys.yaml: the key, what is accepted, what to do instead."""
    rows = ["| HAMi key | Accepted here | Instead |", "|---|---|---|"]
    for entry in yaml.safe_load(HAMI_KEYS.read_text())["keys"]:
        accept = entry["accept"]
        if accept == "any":
            shown = "any value (not read)"
        elif not accept:
            shown = "unset (null)"
        else:
            shown = ", ".join("HAMi's default" if isinstance(v, str) and "\n" in v else f"`{json.dumps(v)}`"
                              for v in accept)  # fmt: skip
        why = entry["why"].replace("|", "\\|")
        rows.append(f"| `{entry['key']}` | {shown} | {why} |")
    return "\n".join(rows)


def _between(doc: str, start: str, end: str, body: str) -> str:
    if start not in doc or end not in doc:
        raise SystemExit(f"{DOC.relative_to(ROOT)}: markers {start} / {end} not found")
    head, rest = doc.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def updated(doc: str) -> str:
    return _between(_between(doc, START, END, table()), KEYS_START, KEYS_END, hami_keys_table())


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
