"""The layering of docs/architecture.md, enforced: the import-linter contracts in ``.importlinter`` hold,
their module lists are current, and our packages' import graph has no cycle."""

from __future__ import annotations

import pkgutil
from pathlib import Path

import grimp
import pytest
from importlinter import api
from importlinter.application import use_cases

import hami

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / ".importlinter"
PACKAGES = ("hami", "scheduler_extender", "webhook", "device_plugin", "kubefakes")


def contract(name: str) -> dict:
    for options in api.read_configuration(str(CONFIG))["contracts_options"]:
        if options["id"] == name:
            return options
    raise AssertionError(f"contract {name} not in {CONFIG}")


def test_import_contracts_are_kept(capsys: pytest.CaptureFixture[str]) -> None:
    kept = use_cases.lint_imports(config_filename=str(CONFIG), no_logo=True, cache_dir=None)
    report = capsys.readouterr().out
    assert kept, report
    assert "0 broken" in report


def test_a_broken_contract_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The machinery can fail: hami.kube does import hami.errors, so forbidding it must break.
    config = tmp_path / "broken.ini"
    config.write_text(
        "[importlinter]\nroot_packages =\n    hami\n\n"
        "[importlinter:contract:probe]\nname = probe\ntype = forbidden\n"
        "source_modules =\n    hami.kube\nforbidden_modules =\n    hami.errors\n"
    )
    assert use_cases.lint_imports(config_filename=str(config), no_logo=True, cache_dir=None) is False
    assert "probe BROKEN" in capsys.readouterr().out


def test_the_alias_contract_names_every_product_module_of_hami() -> None:
    # A new module in hami/ must be added to the contract's list, or it could import the test kits.
    listed = set(contract("product-imports-no-alias")["source_modules"])
    modules = {f"hami.{m.name}" for m in pkgutil.iter_modules(hami.__path__)}
    assert sorted(modules - listed) == []


def test_the_architecture_page_lists_every_contract() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    ids = [c["id"] for c in api.read_configuration(str(CONFIG))["contracts_options"]]
    assert [i for i in ids if f"| {i} |" not in page] == []


def all_imports(*packages: str) -> dict[str, list[str]]:
    """module -> the modules of ours it imports, those under ``if TYPE_CHECKING:`` too: a type named
    back and forth is a circle of meaning even where it never runs."""
    graph = grimp.build_graph(*packages, exclude_type_checking_imports=False, cache_dir=None)
    return {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}


def cycles(edges: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each sorted), in discovery order."""
    # Tarjan's strongly connected components, iteratively (the graph has hundreds of modules).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_on_a_known_graph() -> None:
    edges = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": ["e"], "e": ["d"], "f": ["a"]}
    assert sorted(cycles(edges)) == [["a", "b", "c"], ["d", "e"]]
    assert cycles({"a": ["b"], "b": [], "c": ["a"]}) == []


def test_no_import_cycles_among_our_modules() -> None:
    # Imports under `if TYPE_CHECKING:` count: a type named back and forth means one of the two
    # modules holds it in the wrong room; it belongs one floor below both users.
    assert cycles(all_imports(*PACKAGES)) == []
