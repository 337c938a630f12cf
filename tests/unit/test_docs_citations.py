"""Docs stand on their own: no internal issue numbers, reference-section numbers or bug-log ids.

Upstream issues are cited as public URLs instead of short forms such as ``core#319``.
Every page in ``docs/`` and the README is checked, except the pages in ``NOT_YET`` whose authors
are still writing them; the rule binds those too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: pages still being written by their authors; remove each once its author is done.
#: (docs/benchmarks.md: its simulator and extender sections still cite "issue 2"/"issue 3".)
NOT_YET: set[str] = set()
PAGES = ["README.md"] + sorted(
    p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")
    if p.relative_to(ROOT).as_posix() not in NOT_YET
)

#: (what, pattern). Bug-log ids are one capital letter and two digits (``D04``, ``L05``); the
#: GPU names that look alike (``H20``) are left out.
CHECKS = [
    ("reference-section number", re.compile(r"§")),
    ("internal issue number", re.compile(r"\bissue\s*#?\d+", re.I)),
    ("short-form upstream issue (link the URL)", re.compile(r"(?<![/\w])[A-Za-z-]+#\d+")),
    # a bare "#812"; a page anchor such as "(#2026-12-01-where...)" is not one
    ("bare issue number", re.compile(r"(?<![\w/&])#\d+(?![\w-])")),
    ("bug-log id", re.compile(r"\b(?!H20\b)[BDHLMQRSWX]\d{2}\b")),
    # the project's reference notes are not published: a user cannot follow a pointer into them
    ("pointer into unpublished reference notes",
     re.compile(r"\b(?:hami-legacy-spec|hami-core-spec|k8s-protocols|user[- ]bug[- ]log)\b", re.I)),
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
        ("nodes stuck unregistered (#812)", ["1: bare issue number: '#812'"]),
        ("profile in [here](#2026-12-01-where-each-millisecond-goes)", []),
        ("(user bug D04)", ["1: bug-log id: 'D04'"]),
        ("see the user bug log", ["1: pointer into unpublished reference notes: 'user bug log'"]),
        ("exactly as k8s-protocols.md says", ["1: pointer into unpublished reference notes: 'k8s-protocols'"]),
        ("the `nvidia:` section (hami-legacy-spec)", ["1: pointer into unpublished reference notes: 'hami-legacy-spec'"]),
        ("[HAMi-core](https://github.com/Project-HAMi/HAMi-core/issues/319) on an H20 or H200", []),
    ],
)
def test_checker_finds_each_form(line, expected):
    assert _hits(line) == expected
