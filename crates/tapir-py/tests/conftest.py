"""Shared pytest set-up.

Under CI (the environment variable CI set and non-empty) a skipped test is a failure: a
suite that silently skips is not a suite that passed. The one exception is a test marked
`@pytest.mark.plot`, which needs matplotlib, an optional dependency. A run that collects no
test at all already exits with status 5 (pytest's own rule), which CI treats as a failure.
"""

import os
import sys
from pathlib import Path

import pytest

# The tests import each other's helpers (`_reference`) and the examples by module name.
HERE = Path(__file__).resolve().parent
for p in (HERE, HERE.parent / "examples"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


def in_ci():
    return bool(os.environ.get("CI", ""))


def pytest_configure(config):
    config.addinivalue_line("markers", "plot: needs matplotlib (optional); may be skipped even under CI")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not in_ci() or not report.skipped or item.get_closest_marker("plot") is not None:
        return
    if hasattr(report, "wasxfail"):
        # xfail is reported as skipped too; it is just as silent, so it fails under CI.
        reason = f"xfail: {report.wasxfail}"
    else:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped under CI (CI={os.environ.get('CI')!r}), which counts as a failure: {reason}"
