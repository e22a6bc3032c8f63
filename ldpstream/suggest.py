"""Did-you-mean hints for names given wrong (config fields, mechanism and estimator names,
attributes, columns, categories), and values shown as the user wrote them (never a numpy repr
such as ``np.str_('eco')``)."""
from __future__ import annotations

import difflib
from typing import Any, Iterable

import numpy as np


def plain(value: Any) -> Any:
    """A numpy scalar as the Python value it holds (``np.str_('eco')`` → ``'eco'``)."""
    return value.item() if isinstance(value, np.generic) else value


def nearest(word: Any, candidates: Iterable[Any]) -> str | None:
    """The candidate closest to ``word`` (difflib ratio ≥ 0.6, case folded), or None."""
    names = [str(plain(c)) for c in candidates]
    folded = {n.casefold(): n for n in names}
    found = difflib.get_close_matches(str(plain(word)).casefold(), list(folded), n=1, cutoff=0.6)
    return folded[found[0]] if found else None


def did_you_mean(word: Any, candidates: Iterable[Any]) -> str:
    """``"; did you mean 'x'?"`` for the nearest candidate, or ``""``."""
    near = nearest(word, candidates)
    return f"; did you mean {near!r}?" if near is not None else ""
