"""``kubectl-hami``: the kubectl plugin (``kubectl hami inspect``, ``kubectl hami explain POD -n NS``).

kubectl runs any ``kubectl-<name>`` executable on the PATH for ``kubectl <name> ...`` and passes the rest
of the command line through, so the plugin is the `hami` command with a different name in its messages.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kubectl-hami`` console script; returns the exit status."""
    from hami import cli

    return cli.main(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
