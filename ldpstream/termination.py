"""SIGTERM before a command installs its own stop handler.

Until a long-running command hands its stop signals to its event loop (:func:`on_loop`), and in
batch commands, SIGTERM unwinds the command like Ctrl-C does: :func:`on_sigterm` raises
:class:`Terminated`. CPython does not always let that exception through: the compiler's constant
folding (a module compiled at its first import, e.g. ``2 ** 64``) clears any exception but
KeyboardInterrupt raised while it computes. So the signal is also *recorded*: the CLI re-raises
it once the command's module is imported, and :func:`on_loop` acts on it at once."""
from __future__ import annotations

import asyncio
import signal
from types import FrameType
from typing import Callable

__all__ = ["Terminated", "on_sigterm", "received", "raise_if_received", "on_loop"]

_received = False


class Terminated(BaseException):
    """SIGTERM before the command installed its own stop handler."""


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    """The SIGTERM handler until a command installs its own: record the signal, unwind."""
    global _received
    _received = True
    raise Terminated()


def received() -> bool:
    """Whether SIGTERM arrived while :func:`on_sigterm` was the handler."""
    return _received


def raise_if_received() -> None:
    """Raise :class:`Terminated` if SIGTERM arrived and its exception was lost."""
    if _received:
        raise Terminated()


def on_loop(stop: Callable[[], None],
            signals: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM),
            loop: asyncio.AbstractEventLoop | None = None) -> None:
    """``loop`` (the running one by default; a loop not yet running acts once it runs) calls
    ``stop`` on each of ``signals`` from now on, and soon if SIGTERM arrived before (its
    exception lost while the command started)."""
    loop = loop if loop is not None else asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, stop)
    if _received:
        loop.call_soon(stop)
