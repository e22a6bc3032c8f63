"""What the ingest worker did so far, shown in ``/healthz`` (``checks.ingest``) and read by
``ldpstream bench pipeline`` (the timings)."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class IngestStats:
    """Counters of one ingest service (cumulative since it started)."""

    applied_batches: int = 0
    applied_reports: int = 0
    #: deltas whose range was already counted (REPLAYED)
    skipped_batches: int = 0
    #: deltas refused by the compare-and-set (re-sought)
    conflicts: int = 0
    #: idle partitions whose stored offset went back (re-sought)
    lost_rereads: int = 0
    poison_pills: int = 0
    #: memoized collections: reports of new devices refused for want of device state, per
    #: collection (docs/privacy-over-time.md)
    device_state_full: dict[str, int] = dataclasses.field(default_factory=dict)
    #: unix time the last assignment was done / the last delta was applied
    assigned_at: float | None = None
    last_apply_at: float | None = None
    #: the process's CPU seconds (all threads, ``time.process_time``) at the last apply
    last_apply_cpu: float | None = None
    #: seconds spent (polls that returned data): waiting in getmany, decoding + validating +
    #: counting (count: the counting part), waiting for the previous flush; and applying (per
    #: collection and flush, in the background flush task)
    timings: dict[str, float] = dataclasses.field(default_factory=lambda: {
        "poll": 0.0, "decode": 0.0, "flush_wait": 0.0, "count": 0.0, "apply": 0.0})
