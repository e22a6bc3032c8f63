"""The previous window of a memoized collection's drift check (docs/privacy-over-time.md,
"Memoized collections count devices").

A memoized collection counts each device at its latest report, so the range of buckets before
the current window holds only the devices that have not reported since: a fleet reporting in
both windows would leave it empty. The window as it *was* one window length ago holds every
device that reported in it once (its latest report then). So the refresh keeps snapshots of
each finite window's counts, one every ``span / PER_WINDOW`` seconds, and compares the current
window with the newest snapshot at least one window length old (and younger than two): two
consecutive windows, each counting its devices once, a gap of at most ``span / PER_WINDOW``
plus one refresh interval between them. Snapshots live in the refresh's memory: for the first
window length after a start there is no previous window (no drift value)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, MutableMapping

from ldpstream.agents.refresh.bucket_reader import WindowCounts
from ldpstream.windows import Window

__all__ = ["WindowSnapshots", "PER_WINDOW"]

#: snapshots per window length
PER_WINDOW = 16


@dataclass
class WindowSnapshots:
    """Per window name, (time, counts) of its range, oldest first."""

    held: dict[str, list[tuple[float, WindowCounts]]] = field(default_factory=dict)

    def previous(self, name: str, now: float, span: float) -> WindowCounts | None:
        """The newest snapshot of ``name`` at least ``span`` and less than ``2 span`` old."""
        for t, counts in reversed(self.held.get(name, [])):
            if now - t >= span:
                return counts if now - t < 2 * span else None
        return None

    def add(self, name: str, now: float, counts: WindowCounts, span: float) -> None:
        """Keep ``counts`` if the newest snapshot is ``span / PER_WINDOW`` old; drop those older
        than the newest one at least ``span`` old."""
        held = self.held.setdefault(name, [])
        if not held or now - held[-1][0] >= span / PER_WINDOW:
            held.append((now, counts))
        old = [i for i, (t, _) in enumerate(held) if now - t >= span]
        if len(old) > 1:
            del held[:old[-1]]

    def swap(self, reads: MutableMapping[str, WindowCounts], windows: Iterable[Window],
             now: float, suffix: str) -> None:
        """Replace each finite window's previous range in ``reads`` (``<name><suffix>``) by its
        snapshot one window length ago (removed when there is none yet), and snapshot the
        current ranges."""
        for w in windows:
            if w.seconds is None or w.name not in reads:
                continue
            prev = self.previous(w.name, now, w.seconds)
            if prev is None:
                reads.pop(w.name + suffix, None)
            else:
                reads[w.name + suffix] = prev
            self.add(w.name, now, reads[w.name], w.seconds)
