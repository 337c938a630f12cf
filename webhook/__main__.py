"""`python -m webhook`: the same as the `hami-webhook` console script, for local runs."""

from webhook.cli import main

raise SystemExit(main())
