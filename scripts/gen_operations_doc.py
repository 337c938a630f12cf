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

PAGE = ROOT / "docs" / "operations.md"
NOW = DEMO_NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
EXAMPLE = re.compile(r"(<!-- example: (?P<args>[^>]*?) -->\n)(?P<body>.*?)(<!-- end example -->)", re.S)


def run(args: list[str]) -> tuple[int, str]:
    """`hami ARGS --now NOW` in this process; (exit status, stdout + stderr)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli.main([*args, "--now", NOW])
    return code, out.getvalue()


def render(page: str) -> str:
    """`page` with every example's block replaced by the command line and its output."""
    server = FakeApiServer().start()
    old = os.environ.get("KUBECONFIG")
    try:
        for obj in demo_objects(DEMO_NOW):
            server.store.create_any(obj)
        assert server.kubeconfig_path is not None
        os.environ["KUBECONFIG"] = server.kubeconfig_path

        def fill(m: re.Match[str]) -> str:
            args = shlex.split(m.group("args"))
            code, text = run(args)
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
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/operations.md is stale")
    args = parser.parse_args(argv)
    page = PAGE.read_text(encoding="utf-8")
    new = render(page)
    if args.check:
        if new != page:
            print("docs/operations.md is stale: run python scripts/gen_operations_doc.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
