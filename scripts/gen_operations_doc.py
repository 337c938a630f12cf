"""Fill the example outputs of docs/operations.md by running the commands it shows.

Each example in the page sits between ``<!-- example: ARGS -->`` and ``<!-- end example -->``; this script
starts the in-memory API server (`kubefakes.apiserver`) seeded with the demo cluster
(`kubefakes.demo_cluster`), runs ``hami ARGS --now 2026-05-04T10:00:00Z`` for every example (the `hami`
entry point, in this process, with ``KUBECONFIG`` pointing at the server) and writes the output into the
page, so every transcript there is real and reproducible. `tests/integration/test_tools_cli.py` fails when
the committed page differs from what this script writes.

    python scripts/gen_operations_doc.py            # rewrite docs/operations.md
    python scripts/gen_operations_doc.py --check    # exit 1 when the committed page is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import doc_examples  # noqa: E402
from doc_examples import ROOT  # noqa: E402

from kubefakes.demo_cluster import DEMO_NOW  # noqa: E402

NOW = DEMO_NOW.strftime("%Y-%m-%dT%H:%M:%SZ")

PAGE = ROOT / "docs" / "operations.md"
EXAMPLE = doc_examples.example_pattern("example")


def render(page: str) -> str:
    """`page` with every example's block replaced by the command line and its output."""
    return doc_examples.render(page, EXAMPLE, ["--now", NOW])


def main(argv: list[str] | None = None) -> int:
    return doc_examples.main(
        argv, page=PAGE, render_page=render, script="scripts/gen_operations_doc.py", doc=__doc__
    )


if __name__ == "__main__":
    sys.exit(main())
