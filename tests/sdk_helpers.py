"""Builds of the C and TypeScript device SDKs for the tests that run them (privacy audit, end to
end, bench): the C library and its tools in Release mode under a temporary directory, the
TypeScript package compiled with its pinned ``tsc`` (``make install`` ran ``npm ci``)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
C_DIR = ROOT / "sdk" / "c"
TS_DIR = ROOT / "sdk" / "ts"
VECTORS = ROOT / "sdk" / "conformance" / "randomize.json"


def build_c(build_dir: Path) -> Path:
    """Configure and build sdk/c (Release, examples on); returns the build directory."""
    subprocess.run(["cmake", "-S", str(C_DIR), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                    "-DLDP_SANITIZE=OFF"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build_dir), "-j2"], check=True, capture_output=True)
    return build_dir


def build_ts() -> Path:
    """Compile sdk/ts (``tsc``, locked against a concurrent compile); returns ``dist``."""
    from ldpstream.bench.sdk import compile_ts

    return compile_ts()


@pytest.fixture(scope="session")
def c_sdk(tmp_path_factory) -> Path:
    return build_c(tmp_path_factory.mktemp("sdk-c") / "build")


@pytest.fixture(scope="session")
def ts_sdk() -> Path:
    return build_ts()
