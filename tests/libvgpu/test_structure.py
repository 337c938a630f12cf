"""libvgpu's source structure: the call graph among src/*.c is a DAG (read from the object files:
each object's undefined symbols against the others' definitions), only *hooks.c files export
entry points, one fork-handler registry, one call-the-real-function macro, no catch-all header."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import BUILD, LIBVGPU

SRC = LIBVGPU / "src"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        pytest.skip(f"{name} not installed (binutils)")
    return path


@pytest.fixture(scope="module")
def objects(built) -> dict[str, Path]:
    """src file name -> its object file (only the sources that exist now)."""
    objs = {c.name: BUILD / "obj" / (c.stem + ".o") for c in sorted(SRC.glob("*.c"))}
    assert all(o.exists() for o in objs.values()), objs
    return objs


def symbols(obj: Path) -> tuple[set[str], set[str], set[str]]:
    """(defined globals, undefined, exported = defined with default visibility) of one object."""
    out = subprocess.run(
        [_tool("readelf"), "-sW", str(obj)], check=True, capture_output=True, text=True
    ).stdout
    defined, undefined, exported = set(), set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) < 8 or not f[0].rstrip(":").isdigit():
            continue
        _, _, _, typ, bind, vis, ndx, name = f[:8]
        if bind not in ("GLOBAL", "WEAK") or not name:
            continue
        if ndx == "UND":
            undefined.add(name)
        else:
            defined.add(name)
            if vis == "DEFAULT":
                exported.add(name)
    return defined, undefined, exported


def call_graph(objects: dict[str, Path]) -> dict[str, set[str]]:
    syms = {src: symbols(o) for src, o in objects.items()}
    owner = {}
    for src, (defined, _, _) in syms.items():
        for name in defined:
            assert name not in owner, f"{name} defined in {owner.get(name)} and {src}"
            owner[name] = src
    return {
        src: {owner[u] for u in und if u in owner and owner[u] != src} for src, (_, und, _) in syms.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state and (c := visit(m)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_find_cycle_detects_a_cycle():
    assert find_cycle({"a.c": {"b.c"}, "b.c": {"c.c"}, "c.c": {"a.c"}}) == ["a.c", "b.c", "c.c", "a.c"]
    assert find_cycle({"a.c": {"b.c"}, "b.c": set()}) is None


def test_call_graph_among_sources_is_a_dag(objects):
    graph = call_graph(objects)
    assert find_cycle(graph) is None, find_cycle(graph)
    # the graph is real: the hooks reach the region and the real driver through these edges
    assert "region.c" in graph["memhooks.c"] and "real.c" in graph["memhooks.c"]
    assert {"memhooks.c", "ctxhooks.c", "launchhooks.c", "nvmlhooks.c"} <= graph["doorhooks.c"]


def test_only_hooks_files_export_entry_points(objects):
    for src, obj in objects.items():
        exported = symbols(obj)[2]
        if src.endswith("hooks.c"):
            assert exported, f"{src} is named *hooks.c but exports nothing"
            assert all(re.match(r"(cu|nvml|dl)", n) for n in exported), (src, exported)
        else:
            assert exported == set(), f"{src} exports {sorted(exported)}: entry points belong in *hooks.c"


def test_one_fork_registry_one_real_call_macro_no_common_header():
    texts = {p.name: p.read_text() for p in SRC.glob("*.[ch]")}
    assert "common.h" not in texts
    assert [n for n, t in texts.items() if "pthread_atfork(" in t] == ["forkreg.c"]
    assert [n for n, t in texts.items() if re.search(r"#define CALL_REAL\b", t)] == ["real.h"]
    assert not [n for n, t in texts.items() if '#include "common.h"' in t]
