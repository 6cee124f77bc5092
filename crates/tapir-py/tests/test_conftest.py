"""conftest.py's CI rule, checked on a throwaway suite run by a child pytest: under CI a
skip (or xfail) fails, except for a test marked `plot`; outside CI a skip is a skip."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SUITE = textwrap.dedent(
    """
    import pytest

    def test_passes():
        pass

    @pytest.mark.skip(reason="marker skip")
    def test_marker_skip():
        pass

    def test_runtime_skip():
        pytest.skip("runtime skip")

    def test_importorskip():
        pytest.importorskip("no_such_module_xyz")

    @pytest.mark.xfail(reason="expected")
    def test_xfail():
        assert False

    @pytest.mark.plot
    def test_plot_skip():
        pytest.skip("no matplotlib")
    """
)


def run_suite(tmp_path, ci, suite=SUITE):
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_suite.py").write_text(suite)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )
    outcomes = {}
    for line in p.stdout.splitlines():
        for word in ("PASSED", "FAILED", "SKIPPED", "XFAIL", "ERROR"):  # -rA's short summary
            if line.startswith(word):
                for name in ("passes", "marker_skip", "runtime_skip", "importorskip", "xfail", "plot_skip"):
                    if f"test_{name}" in line:
                        outcomes[name] = word
    return p.returncode, outcomes, p.stdout


def test_under_ci_a_skip_is_a_failure_except_plot(tmp_path):
    rc, outcomes, out = run_suite(tmp_path, "true")
    assert rc == 1, out
    assert outcomes.get("passes") == "PASSED", out
    for name in ("runtime_skip", "importorskip", "xfail"):
        assert outcomes.get(name) == "FAILED", f"{name}: {outcomes.get(name)}\n{out}"
    assert outcomes.get("marker_skip") == "ERROR", out  # a skip marker acts at setup: an error
    assert "3 failed" in out and "1 error" in out, out
    assert "1 skipped" in out, out  # the plot test


def test_outside_ci_a_skip_is_a_skip(tmp_path):
    rc, outcomes, out = run_suite(tmp_path, None)
    assert rc == 0, out
    assert " failed" not in out.splitlines()[-1], out
    assert "4 skipped" in out and "1 xfailed" in out, out


def test_an_empty_ci_variable_is_not_ci(tmp_path):
    rc, _, out = run_suite(tmp_path, "")
    assert rc == 0, out


def test_no_tests_collected_exits_non_zero(tmp_path):
    rc, _, out = run_suite(tmp_path, "true", suite="x = 1\n")
    assert rc == 5, out
