"""What the doc-transcript generators share (`gen_operations_doc.py`, `gen_simulate_doc.py`): run
``hami ARGS`` in this process against the in-memory API server (`kubefakes.apiserver`) seeded with the
demo cluster (`kubefakes.demo_cluster`), put each command's output into its example block of a page,
and the ``--check`` entry point that a stale page fails.

An example block is ``<!-- MARKER: ARGS -->`` ... ``<!-- end example -->``; the generator gives the
pattern (group 1 the opening comment, group ``args`` the command line, group 4 the closing comment).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hami import cli  # noqa: E402
from kubefakes.apiserver import FakeApiServer  # noqa: E402
from kubefakes.demo_cluster import DEMO_NOW, demo_objects  # noqa: E402


def example_pattern(marker: str) -> re.Pattern[str]:
    """The example blocks opened by ``<!-- MARKER: ARGS -->``."""
    return re.compile(
        rf"(<!-- {re.escape(marker)}: (?P<args>[^>]*?) -->\n)(?P<body>.*?)(<!-- end example -->)", re.S
    )


def run(args: Sequence[str]) -> tuple[int, str]:
    """`hami ARGS` in this process; (exit status, stdout + stderr)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli.main(list(args))
    return code, out.getvalue()


def render(page: str, pattern: re.Pattern[str], extra_args: Sequence[str] = ()) -> str:
    """`page` with every block of `pattern` replaced by its command line and what ``hami ARGS
    EXTRA_ARGS`` prints against the demo cluster (``$ echo $?`` and the status when it is not 0)."""
    server = FakeApiServer().start()
    old = os.environ.get("KUBECONFIG")
    try:
        for obj in demo_objects(DEMO_NOW):
            server.store.create_any(obj)
        assert server.kubeconfig_path is not None
        os.environ["KUBECONFIG"] = server.kubeconfig_path

        def fill(m: re.Match[str]) -> str:
            code, text = run([*shlex.split(m.group("args")), *extra_args])
            status = "" if code == 0 else f"$ echo $?\n{code}\n"
            return f"{m.group(1)}```console\n$ hami {m.group('args')}\n{text}{status}```\n{m.group(4)}"

        return pattern.sub(fill, page)
    finally:
        if old is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old
        server.stop()


def main(
    argv: list[str] | None, *, page: Path, render_page: Callable[[str], str], script: str, doc: str
) -> int:
    """A generator's command line: rewrite `page`, or with ``--check`` exit 1 when it is stale."""
    name = page.relative_to(ROOT).as_posix()
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--check", action="store_true", help=f"exit 1 when {name} is stale")
    args = parser.parse_args(argv)
    text = page.read_text(encoding="utf-8")
    new = render_page(text)
    if args.check:
        if new != text:
            print(f"{name} is stale: run python {script}", file=sys.stderr)
            return 1
        return 0
    page.write_text(new, encoding="utf-8")
    return 0
