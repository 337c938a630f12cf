"""Docs stand on their own: no internal issue numbers, reference-section numbers or bug-log ids.

Upstream issues are cited as public URLs instead of short forms such as ``core#319``.
These pages are checked (their authors are done with them); the rule binds every page.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    "README.md",
    "docs/vendors.md",
    "docs/configuration.md",
    "docs/libvgpu.md",
    "docs/server-options.md",
    "docs/webhook.md",
    "docs/install.md",
    "docs/monitoring.md",
]

#: (what, pattern). Bug-log ids are one capital letter and two digits (``D04``, ``L05``); the
#: GPU names that look alike (``H20``) are left out.
CHECKS = [
    ("reference-section number", re.compile(r"§")),
    ("internal issue number", re.compile(r"\bissue\s*#?\d+", re.I)),
    ("short-form upstream issue (link the URL)", re.compile(r"(?<![/\w])[A-Za-z-]+#\d+")),
    ("bug-log id", re.compile(r"\b(?!H20\b)[BDHLMQRSWX]\d{2}\b")),
]


def _hits(text: str) -> list[str]:
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        # a link's address may hold anything (an upstream URL names its issue by number)
        bare = re.sub(r"https?://\S+", "", line)
        for what, pattern in CHECKS:
            for m in pattern.finditer(bare):
                found.append(f"{n}: {what}: {m.group(0)!r}")
    return found


@pytest.mark.parametrize("page", PAGES)
def test_page_cites_no_internal_ids(page):
    assert _hits((ROOT / page).read_text()) == []


@pytest.mark.parametrize(
    "line, expected",
    [
        ("as the spec says (§5.3)", ["1: reference-section number: '§'"]),
        ("fixed in issue 12", ["1: internal issue number: 'issue 12'"]),
        ("charged the wrong card, core#319)", ["1: short-form upstream issue (link the URL): 'core#319'"]),
        ("(user bug D04)", ["1: bug-log id: 'D04'"]),
        ("[HAMi-core](https://github.com/Project-HAMi/HAMi-core/issues/319) on an H20 or H200", []),
    ],
)
def test_checker_finds_each_form(line, expected):
    assert _hits(line) == expected
