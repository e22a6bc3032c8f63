"""Progress bars of long runs (``simulate``, ``bench``): a rich bar on stderr, so stdout stays a
table or JSON. Shown when stderr is a terminal, or when ``LDP_PROGRESS=1`` (``0`` hides it)."""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

ENV_PROGRESS = "LDP_PROGRESS"


def shown() -> bool:
    """Whether progress bars are drawn (``$LDP_PROGRESS``, else: stderr is a terminal)."""
    forced = os.environ.get(ENV_PROGRESS, "").strip()
    return forced == "1" if forced in ("0", "1") else sys.stderr.isatty()


def _ignore(k: int = 1) -> None:
    """The progress callback when no bar is shown."""


@contextmanager
def progress(label: str, total: int) -> Iterator[Callable[[int], None]]:
    """``with progress("simulate", n) as advance: ... advance(k)``; a no-op when not shown."""
    if not shown():
        yield _ignore
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

    console = Console(stderr=True, force_terminal=os.environ.get(ENV_PROGRESS) == "1" or None)
    with Progress("[progress.description]{task.description}", BarColumn(),
                  "{task.completed}/{task.total}", TimeElapsedColumn(), TimeRemainingColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task(label, total=total)

        def advance(k: int = 1) -> None:
            bar.advance(task, k)
        yield advance
