"""``ldpstream bench sdk [--json] [--quick]``: reports randomized per second on one core by the
C, TypeScript (Node) and Python device SDKs in one run, on the conformance cases
(sdk/conformance/randomize.json: rr-ind, a user matrix, a 300-value attribute, rr-joint,
rr-clusters, spl, smp), each with its production generator (getrandom, crypto.getRandomValues,
``secrets``), the C library in its default and its firmware profile side by side (the report
path's speed in both, case by case alternating, with the geometric mean of their ratio); and
per C profile (default and firmware on this host, firmware for 32 bits with ``-m32``) the
flash (text + data of the ``-Os`` static library, without libsodium and jansson) and the RAM
a device keeps: ``ldp_state`` twice (the second is scratch while a state is verified),
``ldp_ledger``, ``ldp_trust``, ``ldp_os_rng`` and the library's static data and bss, the
parse arena apart (docs/device-protocol.md, "Firmware profile").

Needs a source checkout (sdk/), cmake and a C compiler, Node with ``npm ci`` done in sdk/ts.
"""
from __future__ import annotations

import json
import math
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


#: the C profiles whose size is reported: name, CMake options
PROFILES = (("default", []), ("firmware", ["-DLDP_FIRMWARE=ON"]),
            ("firmware-m32", ["-DLDP_FIRMWARE=ON", "-DLDP_M32=ON"]))


def _c_build(build: Path, kind: str, options: list[str], target: str) -> Path:
    _run(["cmake", "-S", str(SDK / "c"), "-B", str(build), f"-DCMAKE_BUILD_TYPE={kind}",
          "-DLDP_EXAMPLES=OFF", *options])
    _run(["cmake", "--build", str(build), "-j2", "--target", target, "ldp_sample"])
    return build


def _c_size(build: Path) -> dict[str, int]:
    """Flash and kept RAM of one ``-Os`` build (see the module docstring)."""
    totals = {"text": 0, "data": 0, "bss": 0}
    for line in _run(["size", str(build / "libldp.a")]).splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 3 and parts[0].isdigit():
            for k, v in zip(("text", "data", "bss"), parts[:3]):
                totals[k] += int(v)
    totals.update(json.loads(_run([str(build / "ldp_sample"), "sizes"])))
    totals["flash"] = totals["text"] + totals["data"]
    totals["ram"] = (2 * totals["ldp_state"] + totals["ldp_ledger"] + totals["ldp_trust"]
                     + totals["ldp_os_rng"] + totals["data"] + totals["bss"]
                     - totals["parse_arena"])
    return totals


def _c_speed(builds: dict[str, Path], vectors: dict, tmp: Path, seconds: float,
             rounds: int = 2) -> dict[str, dict[str, float]]:
    """Reports per second of each C profile: case by case, the profiles alternating ``rounds``
    times (so that the machine's load drifts alike for both), the best of each."""
    best: dict[str, dict[str, float]] = {name: {} for name in builds}
    for case in vectors["cases"]:
        path = tmp / "case.json"
        path.write_text(json.dumps({"cases": [case]}))
        for _ in range(rounds):
            for name, build in builds.items():
                for got, rate in _lines(_run([str(build / "ldp_sample"), "bench", str(path),
                                              str(seconds / rounds)])).items():
                    best[name][got] = max(rate, best[name].get(got, 0.0))
    return best


def main(args) -> int:
    seconds = 0.3 if args.quick else 1.0
    vectors_path = SDK / "conformance" / "randomize.json"
    if not vectors_path.exists():
        raise CliError("bench sdk needs a source checkout (sdk/ is missing)")
    vectors = json.loads(vectors_path.read_text())
    with tempfile.TemporaryDirectory(prefix="ldp-bench-sdk-") as tmp:
        speed = _c_speed({name: _c_build(Path(tmp) / f"c-{name}", "Release", opts, "ldp_sample")
                          for name, opts in PROFILES[:2]}, vectors, Path(tmp), seconds)
        c, c_fw = speed["default"], speed["firmware"]
        sizes = {name: _c_size(_c_build(Path(tmp) / f"os-{name}", "MinSizeRel", opts, "ldp"))
                 for name, opts in PROFILES}
    ts = _lines(_run(["node", str(compile_ts() / "tools" / "sample.js"), "bench",
                      str(vectors_path), str(seconds)]))
    py = _python(vectors, seconds)
    rows = [{"case": k, "c": c[k], "c_firmware": c_fw.get(k), "ts": ts[k], "python": py[k]}
            for k in c]
    if args.json:
        print(json.dumps({"seconds_per_case": seconds, "reports_per_s": rows, "c_size": sizes}))
        return 0
    print(f"reports randomized per second, one core ({seconds:g} s per case and SDK; C firmware: "
          "the firmware profile's build, - beyond its limits; firmware/C: its speed relative "
          "to the default build in the same run)")
    print(f"{'case':<15}{'C':>13}{'C firmware':>13}{'firmware/C':>12}{'TypeScript':>13}"
          f"{'Python':>13}")
    for r in rows:
        fw = r["c_firmware"]
        fw_text = f"{fw:>13,.0f}{fw / r['c']:>12.2f}" if fw else f"{'-':>13}{'-':>12}"
        print(f"{r['case']:<15}{r['c']:>13,.0f}{fw_text}{r['ts']:>13,.0f}{r['python']:>13,.0f}")
    ratios = [r["c_firmware"] / r["c"] for r in rows if r["c_firmware"]]
    print(f"firmware/C geometric mean over {len(ratios)} cases: "
          f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}")
    print("C -Os static library per profile (flash: text + data, without libsodium and jansson; "
          "RAM a device keeps: two ldp_state, ldp_ledger, ldp_trust, ldp_os_rng, static data "
          "and bss; the parse arena apart)")
    print(f"{'profile':<14}{'flash B':>9}{'RAM B':>9}{'ldp_state':>11}{'ldp_ledger':>12}"
          f"{'bss':>8}{'arena':>8}")
    for name, z in sizes.items():
        print(f"{name:<14}{z['flash']:>9}{z['ram']:>9}{z['ldp_state']:>11}{z['ldp_ledger']:>12}"
              f"{z['bss']:>8}{z['parse_arena']:>8}")
    sys.stdout.flush()
    return 0
