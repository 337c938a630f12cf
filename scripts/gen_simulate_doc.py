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

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hami import cli  # noqa: E402
from kubefakes.apiserver import FakeApiServer  # noqa: E402
from kubefakes.demo_cluster import DEMO_NOW, demo_objects  # noqa: E402

PAGE = ROOT / "docs" / "simulate.md"
EXAMPLE = re.compile(
    r"(<!-- simulate-example: (?P<args>[^>]*?) -->\n)(?P<body>.*?)(<!-- end example -->)", re.S
)


def run(args: list[str]) -> tuple[int, str]:
    """`hami ARGS` in this process; (exit status, stdout + stderr)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli.main(args)
    return code, out.getvalue()


def render(page: str) -> str:
    """`page` with every cluster example's block replaced by the command line and its output."""
    server = FakeApiServer().start()
    old = os.environ.get("KUBECONFIG")
    try:
        for obj in demo_objects(DEMO_NOW):
            server.store.create_any(obj)
        assert server.kubeconfig_path is not None
        os.environ["KUBECONFIG"] = server.kubeconfig_path

        def fill(m: re.Match[str]) -> str:
            code, text = run(shlex.split(m.group("args")))
            status = "" if code == 0 else f"$ echo $?\n{code}\n"
            return f"{m.group(1)}```console\n$ hami {m.group('args')}\n{text}{status}```\n{m.group(4)}"

        return EXAMPLE.sub(fill, page)
    finally:
        if old is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/simulate.md is stale")
    args = parser.parse_args(argv)
    page = PAGE.read_text(encoding="utf-8")
    new = render(page)
    if args.check:
        if new != page:
            print("docs/simulate.md is stale: run python scripts/gen_simulate_doc.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
