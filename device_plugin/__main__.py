"""``python -m device_plugin`` = the ``hami-device-plugin`` console script."""

import sys

from device_plugin.cli import main

sys.exit(main())
