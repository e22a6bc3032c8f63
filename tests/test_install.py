"""The install and the Makefile as a newcomer meets them: ``make up ARGS=...`` reaches
``ldpstream up``, and scripts/bootstrap.sh says what it is doing."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]


def test_make_up_passes_args():
    out = subprocess.run(["make", "-n", "up", "ARGS=--web-port 6067 --rate 500"], cwd=ROOT,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert ".venv/bin/ldpstream up --web-port 6067 --rate 500" in out.stdout, out.stdout


def test_the_install_says_what_it_is_doing():
    """bootstrap.sh on an installed tree: quick, and every step it takes is announced."""
    if not os.access(ROOT / ".venv/bin/python", os.X_OK):
        pytest.fail("no .venv: run scripts/bootstrap.sh")
    out = subprocess.run([str(ROOT / "scripts/bootstrap.sh")], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(l.startswith("bootstrap: Debian packages") for l in lines), out.stdout
    assert any(l.startswith("bootstrap: ") and ".venv" in l for l in lines), out.stdout
