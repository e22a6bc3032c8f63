"""Idempotent report batches: per-sender dedupe inside the exactly-once apply (docs/security.md
"Idempotent batches"; the batch key is in docs/pipeline.md "Wire format").

A batch may carry a key ``(sender device id, sequence)``; a device increases its sequence with
every batch. The worker counts a keyed batch once per (collection, partition, sender), however
often it is delivered (a retried HTTP request whose answer was lost, a producer retry, a batch
produced twice). Per sender the state is bounded: the highest sequence seen and a 64-bit bitmap of
the 64 sequences below it (bit ``i``: ``high - 1 - i`` seen). A sequence

- above ``high`` is new (the bitmap shifts),
- equal to ``high`` or with its bit set is a **duplicate**: not counted, not an error (the device
  is answered as for the first delivery), counted in ``ldp_duplicate_batches_total``,
- within the 64 below ``high`` and unseen is new (late, e.g. reordered),
- more than 64 below ``high`` is refused: ``ldp.dlq`` reason ``stale_sequence`` (it may or may
  not have been counted; its payload is kept).

The state of a partition's senders lives in side hashes ``ldp:{<cid>#<p>}:x:dedupe:<w>:<b>``
(agents/store/keys.py; bucket ``b`` of the sender: agents/store/side_buckets.py) of the
worker-clock window ``w = floor(now / WINDOW_S)``, field the sender's id, value
``"<high>:<bitmap>"``, set by the same Lua call that applies the counts and moves the
offset (agents/store/count_store.py ``SideValues``): after any crash the hashes hold exactly the state of what
was counted. A lookup reads the current window, then the previous one; a hash expires two windows
after its own, so a sender is remembered for at least one window (24 h) after its last keyed batch
and memory is one field per sender active in the last two windows. A retry more than that late is
counted again: the stated window. The worker reads the fields of each poll's senders only
(agents/ingest/intake.py ``Intake.load``), into a :class:`DedupeBook` of that poll.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

__all__ = ["WINDOW_S", "BITS", "PREFIX", "NEW", "DUPLICATE", "STALE", "admit", "side_name",
           "window_of", "expire_at", "DedupeBook"]

WINDOW_S = 86_400.0      # the dedupe window (s): a sender is remembered at least this long
BITS = 64                # sequences below the highest that are remembered one by one
PREFIX = "dedupe:"
NEW, DUPLICATE, STALE = "new", "duplicate", "stale"
_MASK = (1 << BITS) - 1

#: (highest sequence, bitmap of the BITS sequences below it)
State = tuple[int, int]


def admit(state: State | None, seq: int) -> tuple[str, State | None]:
    """The verdict on sequence ``seq`` of a sender in ``state`` (None: never seen) and the state
    after it (unchanged unless NEW)."""
    if state is None:
        return NEW, (seq, 0)
    high, bits = state
    if seq > high:
        shift = seq - high
        bits = ((bits << shift) | (1 << (shift - 1))) & _MASK if shift <= BITS else 0
        return NEW, (seq, bits)
    if seq == high:
        return DUPLICATE, state
    below = high - seq - 1
    if below >= BITS:
        return STALE, state
    if bits >> below & 1:
        return DUPLICATE, state
    return NEW, (high, bits | 1 << below)


def side_name(window: int) -> str:
    """The side-hash name of dedupe window ``window``."""
    return f"{PREFIX}{int(window)}"


def window_of(now_s: float) -> int:
    """The dedupe window of a time of the worker's clock (unix s)."""
    return int(now_s // WINDOW_S)


def expire_at(window: int) -> float:
    """When the hash of ``window`` expires (unix s): two windows after its own."""
    return (int(window) + 2) * WINDOW_S


def _parse(value: str | bytes) -> State:
    text = value.decode() if isinstance(value, bytes) else value
    high, _, bits = text.partition(":")
    return int(high), int(bits or 0)


@dataclasses.dataclass
class DedupeBook:
    """What senders of one partition have had counted (applied and pending), for the windows
    loaded; valid for the partition's ``epoch`` only (agents/ingest/service.py drops pending work by
    bumping it, and the book is then re-read from Redis). The worker holds one per poll, of that
    poll's senders only (``known``; None: every sender of the hashes loaded)."""

    epoch: int
    windows: dict[int, dict[int, State]] = dataclasses.field(default_factory=dict)
    known: frozenset[int] | None = None

    def _check(self, sender: int) -> None:
        if self.known is not None and sender not in self.known:
            raise RuntimeError(f"batch-dedupe state of sender {sender} not read for this poll")

    def load(self, window: int,
             raw: Mapping[int, str | bytes] | Mapping[str | bytes, str | bytes]) -> None:
        """Take the side hash of ``window`` as read from Redis (field → "high:bitmap")."""
        self.windows[window] = {int(k): _parse(v) for k, v in raw.items()}
        for w in [w for w in self.windows if w < window - 1]:
            del self.windows[w]   # expired in Redis too: forgotten here

    def state_of(self, window: int, sender: int) -> State | None:
        """The sender's state a decision in ``window`` starts from (None: not seen)."""
        self._check(sender)
        state = self.windows[window].get(sender)
        return self.windows[window - 1].get(sender) if state is None else state

    def decide(self, window: int, sender: int, seq: int,
               pending: dict[int, dict[int, str]]) -> str:
        """The verdict on ``(sender, seq)`` in ``window`` (both it and the previous one loaded);
        a NEW one is recorded here and in ``pending`` (window → sender → "high:bitmap", the
        values the apply sets)."""
        self._check(sender)
        cur = self.windows[window]
        state = cur.get(sender)
        if state is None:
            state = self.windows[window - 1].get(sender)
        verdict, after = admit(state, seq)
        if verdict == NEW and after is not None:
            cur[sender] = after
            pending.setdefault(window, {})[sender] = f"{after[0]}:{after[1]}"
        return verdict
