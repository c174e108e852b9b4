"""Generic pytest setup shared by every suite (keep component-specific fixtures out)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# tests/helpers.py and the test server scripts import as top-level modules.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # noqa: ANN201
    # Lets fixtures see whether the test body failed (to dump node logs on failure).
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


from browser import browser, page  # noqa: E402,F401  (shared fixtures)
from cluster import cluster, cluster_factory  # noqa: E402,F401  (shared fixtures)
from s3_server import s3, s3_process, s3_server  # noqa: E402,F401  (shared fixtures)
