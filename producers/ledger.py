"""The device's persisted privacy state (SQLite, stdlib ``sqlite3``): the ε it has spent, its
memoized randomized responses and what it last reported.

* ``spend``: one row per randomization of true data that left the device (time, collection, ε).
  A :class:`Budget` caps the ε spent in any window of ``window_s`` seconds (sliding, w-event style
  [Kellaris et al., VLDB 2014; LDP-IDS, SIGMOD 2022]); :meth:`Ledger.refusal` says why a new
  report would break it.
* ``memo``: the permanent randomized response of each (collection, permanent-channel
  fingerprint, rotation period, attribute, true value) [RAPPOR §3]. Kept across restarts: a
  device that re-drew its memoized responses after each restart would leak its value by
  averaging them.
* ``batch_seq``: the next batch sequence number of each sender id (the batch key of
  docs/pipeline.md "Wire format"): taken before a batch is sent, so a restarted device never
  reuses one and a retried batch keeps its key (counted once: docs/security.md).
* ``state_floor``: the newest ``(version, issued_at)`` of a signed mechanism state adopted per
  collection (producers/device.py ``ConfigWatcher(floor=ledger)``): an older state replayed after
  a restart is refused.
* ``sent``: when each distinct record was last reported per collection and period, so a device
  repeating a record sends it once per rotation period. Rows of past periods (sent records and
  memoized responses) are deleted when a report of a newer period is committed.

One report is committed in one transaction (memos, spend and sent together).

The ledger fails closed (docs/security.md "The ε ledger fails closed"): spends are ordered by
their insertion (SQLite rowid) and the ledger's clock never goes back (``now`` is the greater of
the device clock and the newest spend), so a clock stepped back never frees budget; and a ledger
file is bound to a *marker* file (default ``<path>.marker``; put it with the device's identity or
key store) holding the ledger's random id: a ledger missing or replaced while its marker exists
is refused (:class:`LedgerMissing`), never silently reset to a full budget.
"""
from __future__ import annotations

import hashlib
import math
import numbers
import os
import sqlite3
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from ldpstream.privacy_windows import DAY_S, budget_day

_SCHEMA = """
CREATE TABLE IF NOT EXISTS spend (at REAL NOT NULL, collection TEXT NOT NULL,
                                  epsilon REAL NOT NULL);
CREATE INDEX IF NOT EXISTS spend_at ON spend (at);
CREATE TABLE IF NOT EXISTS memo (collection TEXT NOT NULL, channel TEXT NOT NULL,
                                 period INTEGER NOT NULL, attribute INTEGER NOT NULL,
                                 value INTEGER NOT NULL, response INTEGER NOT NULL,
                                 PRIMARY KEY (collection, channel, period, attribute, value));
CREATE TABLE IF NOT EXISTS sent (collection TEXT NOT NULL, period INTEGER NOT NULL,
                                 record TEXT NOT NULL, at REAL NOT NULL,
                                 PRIMARY KEY (collection, period, record));
CREATE TABLE IF NOT EXISTS batch_seq (sender TEXT PRIMARY KEY, next INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS state_floor (collection TEXT PRIMARY KEY, version INTEGER NOT NULL,
                                        issued_at REAL NOT NULL);
"""


@dataclass(frozen=True)
class Budget:
    """At most ``epsilon`` spent in any window of ``window_s`` seconds."""

    epsilon: float
    window_s: float = 86400.0

    def __post_init__(self) -> None:
        for name, value in (("epsilon", self.epsilon), ("window_s", self.window_s)):
            # a string ("8") or a bool is a mistake to name, not a TypeError from math.isfinite
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"Budget.{name} must be a number, got {value!r} "
                                 f"({type(value).__name__})")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"Budget.{name} must be a finite number > 0, got {value!r}")


def channel_fingerprint(channels: Sequence[np.ndarray]) -> str:
    """A short stable hash of channel matrices: memoized responses are reused only under the
    same permanent channels (a new mechanism version with other channels draws afresh)."""
    h = hashlib.blake2b(digest_size=8)
    for P in channels:
        arr = np.ascontiguousarray(np.asarray(P, dtype="<f8"))
        h.update(str(arr.shape).encode())
        h.update(arr.tobytes())
    return h.hexdigest()


class LedgerMissing(RuntimeError):
    """The ledger's marker says a ledger existed, but the file is gone or another one."""


class Ledger:
    """A device's ε ledger and memoized responses in one SQLite file (created if missing, unless
    its ``marker`` file says one existed: :class:`LedgerMissing`). ``marker``: default
    ``<path>.marker`` (none for ``":memory:"``)."""

    def __init__(self, path: str | Path, *, budget: Budget | None = None,
                 marker: str | Path | None = None) -> None:
        self.path = str(path)
        self.budget = budget
        memory = self.path == ":memory:"
        self.marker = None if memory and marker is None else \
            Path(marker if marker is not None else self.path + ".marker")
        existed = memory or os.path.exists(self.path)
        if self.marker is not None and self.marker.exists() and not existed:
            raise LedgerMissing(f"ledger {self.path} is missing but its marker {self.marker} "
                                f"exists: refusing to start with a fresh budget")
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.executescript(_SCHEMA)
        if self.marker is not None:
            self._bind_marker(self.marker)

    def _bind_marker(self, marker: Path) -> None:
        """Check (or write) the marker: it holds this ledger's id."""
        row = self._db.execute("SELECT value FROM meta WHERE name='id'").fetchone()
        if row is None:
            row = (uuid.uuid4().hex,)
            self._db.execute("INSERT INTO meta VALUES ('id', ?)", row)
        if marker.exists():
            if marker.read_text().strip() != row[0]:
                self._db.close()
                raise LedgerMissing(f"ledger {self.path} is not the one its marker {marker} "
                                    f"names (replaced?): refusing it")
            return
        marker.parent.mkdir(parents=True, exist_ok=True)
        tmp = marker.with_name(marker.name + ".tmp")
        tmp.write_text(row[0] + "\n")
        os.replace(tmp, marker)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- ε -------------------------------------------------------------------------------------
    def now(self, clock: float) -> float:
        """The ledger's time: never before its newest spend, so a clock stepped back does not
        move the budget window back."""
        row = self._db.execute("SELECT at FROM spend ORDER BY rowid DESC LIMIT 1").fetchone()
        return float(clock) if row is None else max(float(clock), float(row[0]))

    def spent(self, now: float, window_s: float | None = None) -> float:
        """ε spent in the ``window_s`` seconds up to the ledger's time (:meth:`now` of ``now``),
        every collection; all of it when ``window_s`` is None. A spend stamped after ``now``
        (the clock went back) counts."""
        if window_s is None:
            row = self._db.execute("SELECT COALESCE(SUM(epsilon), 0) FROM spend").fetchone()
        else:
            row = self._db.execute("SELECT COALESCE(SUM(epsilon), 0) FROM spend WHERE at > ?",
                                   (self.now(now) - window_s,)).fetchone()
        return float(row[0])

    def refusal(self, cost: float, now: float) -> str | None:
        """Why a report costing ``cost`` at ``now`` would break the budget, or None."""
        if self.budget is None or cost <= 0:
            return None
        spent = self.spent(now, self.budget.window_s)
        if spent + cost > self.budget.epsilon * (1 + 1e-12):
            return (f"budget exceeded: this report costs ε={cost:.6g}, {spent:.6g} already spent "
                    f"in the last {self.budget.window_s:g} s, budget ε={self.budget.epsilon:g} "
                    f"per {self.budget.window_s:g} s")
        return None

    def daily_refusal(self, collection: str, cost: float, now: float,
                      max_per_day: float) -> str | None:
        """Why a report of ``collection`` costing ``cost`` at ``now`` would spend more than the
        collection's ``max_epsilon_per_day`` in the budget day of ``now`` (its UTC calendar day,
        :func:`~ldpstream.privacy_windows.budget_day`, the worker's day too;
        docs/privacy-over-time.md), or None."""
        if cost <= 0:
            return None
        start = budget_day(self.now(now)) * DAY_S
        row = self._db.execute("SELECT COALESCE(SUM(epsilon), 0) FROM spend WHERE collection=? "
                               "AND at >= ?", (collection, start)).fetchone()
        spent = float(row[0])
        if spent + cost > max_per_day * (1 + 1e-12):
            return (f"over_budget: this report costs ε={cost:.6g}, {spent:.6g} already spent on "
                    f"{collection!r} this UTC day, its max_epsilon_per_day is "
                    f"{max_per_day:g}")
        return None

    # --- batch sequence numbers --------------------------------------------------------------
    def next_sequence(self, sender: int) -> int:
        """Take the next batch sequence number of ``sender`` (0, 1, 2, ...; persisted first)."""
        with self._transaction():
            row = self._db.execute("SELECT next FROM batch_seq WHERE sender=?",
                                   (str(int(sender)),)).fetchone()
            seq = 0 if row is None else int(row[0])
            self._db.execute("INSERT OR REPLACE INTO batch_seq VALUES (?, ?)",
                             (str(int(sender)), seq + 1))
        return seq

    # --- the newest adopted mechanism state (replay protection) -----------------------------
    def state_floor(self, collection: str) -> tuple[int, float] | None:
        """The newest ``(version, issued_at)`` adopted for ``collection`` (None: none yet)."""
        row = self._db.execute("SELECT version, issued_at FROM state_floor WHERE collection=?",
                               (collection,)).fetchone()
        return None if row is None else (int(row[0]), float(row[1]))

    def raise_state_floor(self, collection: str, version: int, issued_at: float) -> None:
        """Record an adopted state's ``(version, issued_at)`` unless an equal or newer one is."""
        with self._transaction():
            old = self.state_floor(collection)
            if old is None or (int(version), float(issued_at)) > old:
                self._db.execute("INSERT OR REPLACE INTO state_floor VALUES (?, ?, ?)",
                                 (collection, int(version), float(issued_at)))

    # --- memoized responses --------------------------------------------------------------------
    def memos(self, collection: str, channel: str, period: int,
              keys: Iterable[tuple[int, int]]) -> dict[tuple[int, int], int]:
        """The memoized responses of ``(attribute, value)`` keys that have one."""
        out = {}
        for j, v in keys:
            row = self._db.execute("SELECT response FROM memo WHERE collection=? AND channel=? "
                                   "AND period=? AND attribute=? AND value=?",
                                   (collection, channel, int(period), int(j), int(v))).fetchone()
            if row is not None:
                out[(int(j), int(v))] = int(row[0])
        return out

    def last_sent(self, collection: str, period: int, record: str) -> float | None:
        """When ``record`` was last reported to ``collection`` in ``period`` (None: not yet)."""
        row = self._db.execute("SELECT at FROM sent WHERE collection=? AND period=? AND record=?",
                               (collection, int(period), record)).fetchone()
        return None if row is None else float(row[0])

    def newest_period(self, collection: str) -> int | None:
        """The newest rotation period a memoized report of ``collection`` was committed in (a
        device whose clock steps back keeps using it: docs/device-protocol.md, "Ledger")."""
        row = self._db.execute("SELECT MAX(period) FROM sent WHERE collection=?",
                               (collection,)).fetchone()
        return None if row[0] is None else int(row[0])

    def commit(self, collection: str, now: float, cost: float, *, channel: str = "",
               period: int = 0, memos: dict[tuple[int, int], int] | None = None,
               record: str | None = None) -> None:
        """Record one report atomically: its ε, the new memoized responses and, for a memoized
        ``record``, that it was sent in ``period``."""
        with self._transaction():
            if cost > 0:  # stamped with the ledger's time: spends stay in insertion order
                self._db.execute("INSERT INTO spend VALUES (?, ?, ?)",
                                 (self.now(now), collection, float(cost)))
            for (j, v), y in (memos or {}).items():
                self._db.execute("INSERT INTO memo VALUES (?, ?, ?, ?, ?, ?)",
                                 (collection, channel, int(period), int(j), int(v), int(y)))
            for table in ("memo", "sent"):  # past periods are never reused
                self._db.execute(f"DELETE FROM {table} WHERE collection=? AND period<?",
                                 (collection, int(period)))
            if record is not None:
                self._db.execute("INSERT OR REPLACE INTO sent VALUES (?, ?, ?, ?)",
                                 (collection, int(period), record, float(now)))

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
