"""``python -m rillet.client.cli``."""

import sys

from rillet.client.cli import main

sys.exit(main())
