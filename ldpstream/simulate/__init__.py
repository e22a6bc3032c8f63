"""``ldpstream simulate``: offline runs of any mechanism through the one driver
(:mod:`.driver`), the loop the streaming worker runs."""
from __future__ import annotations

from ldpstream.simulate.command import main
from ldpstream.simulate.driver import check_epsilon

__all__ = ["check_epsilon", "main"]
