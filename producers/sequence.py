"""The batch key's sequence of a Python device (docs/device-protocol.md, "Reports, batches,
batch key, ledger")."""
from __future__ import annotations

import os
import time
from typing import Callable

__all__ = ["BatchSequence"]


class BatchSequence:
    """The batch key's sequence of one device (docs/device-protocol.md, "Batch key"): strictly
    increasing, persisted *before* the batch leaves (a crash skips a number, never reuses one).
    ``path``: a file holding the next sequence (None: in memory, starting at the clock in
    microseconds, so a restarted device without storage still moves forward)."""

    def __init__(self, path: str | None, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        start = int(clock() * 1e6)
        if path is not None:
            try:
                with open(path, encoding="ascii") as fh:
                    start = int(fh.read().strip() or 0)
            except FileNotFoundError:
                start = 0
        self.next = start

    def take(self) -> int:
        """The sequence of the next batch (saved as used first)."""
        seq = self.next
        self.next = seq + 1
        if self.path is not None:
            with open(self.path + ".tmp", "w", encoding="ascii") as fh:
                fh.write(f"{self.next}\n")
            os.replace(self.path + ".tmp", self.path)
        return seq
