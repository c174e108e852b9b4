"""Generic pytest setup shared by every suite (keep component-specific fixtures out)."""

from __future__ import annotations

import sys
from pathlib import Path

# tests/helpers.py and the test server scripts import as top-level modules.
sys.path.insert(0, str(Path(__file__).parent))
