"""``pip install .`` builds cleanly: no setuptools warnings (every directory shipped is a
declared package) and the wheel carries the bundled data the demo needs."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_builds_without_warnings_and_ships_the_data(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                           str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Warning" not in out and "absent from" not in out, out
    (wheel,) = tmp_path.glob("ldpstream-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ("adult.csv", "adult-demo.yaml", "ADULT-LICENSE.md", "survey.bif"):
        assert f"ldpstream/data/{f}" in names, f
    assert "ldpstream/agents/app.py" in names and "ldpstream/estimators/kernels/castell.py" in names
    assert "ldpstream/dev/broker.py" in names and "ldpstream/kafka_admin.py" in names
    # the live page's assets, served by every worker (agents/serve/ui.py ASSETS)
    from ldpstream.agents.serve.ui import ASSETS
    for f in ASSETS:
        assert f"ldpstream/agents/serve/static/{f}" in names, f
