"""`python -m scheduler_extender` = `hami-scheduler-extender` (local runs without installing the script)."""

import sys

from scheduler_extender.cli import main

sys.exit(main())
