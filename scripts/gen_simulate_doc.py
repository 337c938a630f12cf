"""Fill the example outputs of docs/simulate.md that run against a cluster, by running the commands it shows.

Each such example sits between ``<!-- simulate-example: ARGS -->`` and ``<!-- end example -->``; this script
starts the in-memory API server (`kubefakes.apiserver`) seeded with the demo cluster of docs/operations.md
(`kubefakes.demo_cluster`), runs ``hami ARGS`` for every example (the `hami` entry point, in this process,
with ``KUBECONFIG`` pointing at the server) and writes the output into the page, so the transcripts are
real and reproducible. Only commands whose output has no timings belong here (``--what-if-shape``,
``snapshot``). `tests/integration/test_whatif.py` fails when the committed page differs from what this
script writes.

    python scripts/gen_simulate_doc.py            # rewrite the examples of docs/simulate.md
    python scripts/gen_simulate_doc.py --check    # exit 1 when the committed page is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import doc_examples  # noqa: E402
from doc_examples import ROOT  # noqa: E402

PAGE = ROOT / "docs" / "simulate.md"
EXAMPLE = doc_examples.example_pattern("simulate-example")


def render(page: str) -> str:
    """`page` with every example's block replaced by the command line and its output."""
    return doc_examples.render(page, EXAMPLE, ())


def main(argv: list[str] | None = None) -> int:
    return doc_examples.main(
        argv, page=PAGE, render_page=render, script="scripts/gen_simulate_doc.py", doc=__doc__
    )


if __name__ == "__main__":
    sys.exit(main())
