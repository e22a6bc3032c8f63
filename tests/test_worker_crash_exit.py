"""A worker whose faust app crashed exits non-zero within ``STOP_GRACE_S`` (agents/app.py
``PromptWorker``) whatever its stop waits for, so a supervisor restarts it. Before, a crash under
a config flood (a timer raising while the event loop was busy) left the process alive in
``Producer: Stopping...`` with its HTTP port closed: nothing restarted it. The fault is injected
(agents/ingest/faults.py): a timer raises, then the event loop is blocked for
:data:`BLOCKED_S`."""
from __future__ import annotations

import time

import pytest
from conftest import write_config

pytestmark = pytest.mark.pipeline

CRASH_AFTER_S = 5.0
BLOCKED_S = 120.0


def test_a_crashed_worker_exits_non_zero_promptly(tmp_path, service_env, spawn_worker,
                                                  unique_name):
    from ldpstream.agents.app import STOP_GRACE_S

    path = write_config(tmp_path / "c.yaml", unique_name, partitions=1)
    w = spawn_worker(path, dict(service_env, LDP_FAULT_CRASH_APP_AFTER_S=str(CRASH_AFTER_S),
                                LDP_FAULT_BLOCK_LOOP_S=str(BLOCKED_S)))
    deadline = time.monotonic() + 90
    serving = None
    while serving is None and time.monotonic() < deadline and w.proc.poll() is None:
        try:
            w.get("/healthz", timeout=1.0, any_status=True)
            serving = time.monotonic()   # the app runs: its timers too
        except OSError:
            time.sleep(0.1)
    assert serving is not None, w.log_tail()
    limit = CRASH_AFTER_S + STOP_GRACE_S + 10.0
    while time.monotonic() - serving < limit and w.proc.poll() is None:
        time.sleep(0.2)
    took = time.monotonic() - serving
    assert w.proc.poll() is not None, f"still running {took:.0f} s after start:\n{w.log_tail()}"
    print(f"exited with {w.proc.returncode} {took:.1f} s after it first answered HTTP "
          f"(crash {CRASH_AFTER_S:g} s after start, event loop then blocked {BLOCKED_S:g} s)")
    assert w.proc.returncode != 0, w.log_tail()
