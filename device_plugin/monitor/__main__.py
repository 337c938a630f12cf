"""``python -m device_plugin.monitor``: the same as the ``hami-vgpu-monitor`` console script."""

import sys

from device_plugin.monitor.cli import main

sys.exit(main())
