"""``ldpstream bench sdk [--json] [--quick]``: reports randomized per second on one core by the
C, TypeScript (Node) and Python device SDKs in one run, on the conformance cases
(sdk/conformance/randomize.json: rr-ind, a user matrix, a 300-value attribute, rr-joint,
rr-clusters, spl, smp), each with its production generator (getrandom, crypto.getRandomValues,
``secrets``); and the C library's size: ``size`` of the ``-Os`` static library (text, data,
bss) and the bytes of the structures a device keeps (docs/device-protocol.md, "C library").

Needs a source checkout (sdk/), cmake and a C compiler, Node with ``npm ci`` done in sdk/ts.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ldpstream.errors import CliError

SDK = Path(__file__).resolve().parent.parent / "sdk"


def _run(cmd: list[str], **kw) -> str:
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout
    except subprocess.CalledProcessError as exc:
        err = f"{exc.stderr}{exc.stdout}"
    except OSError as exc:
        err = str(exc)
    raise CliError(f"bench sdk: {' '.join(cmd[:3])}: {err.strip()[-500:]}")


def compile_ts() -> Path:
    """Compile sdk/ts with its pinned ``tsc`` (under a file lock: tests on two processes may
    compile at once); returns its ``dist`` directory."""
    import fcntl

    ts = SDK / "ts"
    if not (ts / "node_modules").is_dir():
        raise CliError("sdk/ts/node_modules is missing: run `make install` (npm ci)")
    with open(ts / ".tsc.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _run(["npx", "--no-install", "tsc", "-p", "."], cwd=ts)
    return ts / "dist"


def _lines(text: str) -> dict[str, float]:
    return {d["case"]: float(d["reports_per_s"]) for d in map(json.loads, text.splitlines())}


def _python(vectors: dict, seconds: float) -> dict[str, float]:
    from ldpstream.producers.program import OsRandom, Program

    out, rng = {}, OsRandom()
    for case in vectors["cases"]:
        prog = Program(case["device"])
        xs = [prog.encode(r) for r in case["records"]]
        done, t0 = 0, time.perf_counter()
        while (t := time.perf_counter()) - t0 < seconds:
            for x in xs:
                prog.randomize(x, rng)
            done += len(xs)
        out[case["name"]] = done / (t - t0)
    return out


def _c_size(tmp: Path) -> dict[str, int]:
    build = tmp / "c-os"
    _run(["cmake", "-S", str(SDK / "c"), "-B", str(build), "-DCMAKE_BUILD_TYPE=MinSizeRel",
          "-DLDP_EXAMPLES=OFF"])
    _run(["cmake", "--build", str(build), "-j2", "--target", "ldp", "ldp_sample"])
    totals = {"text": 0, "data": 0, "bss": 0}
    for line in _run(["size", str(build / "libldp.a")]).splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 3 and parts[0].isdigit():
            for k, v in zip(("text", "data", "bss"), parts[:3]):
                totals[k] += int(v)
    totals.update(json.loads(_run([str(build / "ldp_sample"), "sizes"])))
    return totals


def main(args) -> int:
    seconds = 0.3 if args.quick else 1.0
    vectors_path = SDK / "conformance" / "randomize.json"
    if not vectors_path.exists():
        raise CliError("bench sdk needs a source checkout (sdk/ is missing)")
    vectors = json.loads(vectors_path.read_text())
    with tempfile.TemporaryDirectory(prefix="ldp-bench-sdk-") as tmp:
        build = Path(tmp) / "c"
        _run(["cmake", "-S", str(SDK / "c"), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
              "-DLDP_EXAMPLES=OFF"])
        _run(["cmake", "--build", str(build), "-j2", "--target", "ldp_sample"])
        c = _lines(_run([str(build / "ldp_sample"), "bench", str(vectors_path), str(seconds)]))
        size = _c_size(Path(tmp))
    ts = _lines(_run(["node", str(compile_ts() / "tools" / "sample.js"), "bench",
                      str(vectors_path), str(seconds)]))
    py = _python(vectors, seconds)
    rows = [{"case": k, "c": c[k], "ts": ts[k], "python": py[k]} for k in c]
    if args.json:
        print(json.dumps({"seconds_per_case": seconds, "reports_per_s": rows, "c_size": size}))
        return 0
    print(f"reports randomized per second, one core ({seconds:g} s per case and SDK)")
    print(f"{'case':<15}{'C':>13}{'TypeScript':>13}{'Python':>13}")
    for r in rows:
        print(f"{r['case']:<15}{r['c']:>13,.0f}{r['ts']:>13,.0f}{r['python']:>13,.0f}")
    print(f"C -Os static library: text {size['text']} B, data {size['data']} B, bss "
          f"{size['bss']} B; per device: ldp_state {size['ldp_state']} B (two while a state is "
          f"verified), ldp_ledger {size['ldp_ledger']} B, ldp_trust {size['ldp_trust']} B, "
          f"ldp_os_rng {size['ldp_os_rng']} B")
    sys.stdout.flush()
    return 0
