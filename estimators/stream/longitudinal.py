"""Longitudinal privacy: memoized randomized response and what a device's reports cost over time.

A device that reports the same value again and again with a fresh randomization each time leaks
it: averaging k reports recovers the value, ε grows as k·ε. RAPPOR [Erlingsson, Pihur, Korolova,
CCS 2014, §3] memoizes instead: the *permanent* randomized response ``B = P(v)`` is drawn once per
(attribute, true value) and reused; an optional *instantaneous* randomization ``Q`` is applied to
``B`` afresh for every report, so a single report reveals less than ``B`` itself.

With row-stochastic channels (``P[u, v] = Pr(out = v | in = u)``) the server sees the composed
channel ``P @ Q`` and estimators invert it. What it costs (pure ε-LDP, sequential composition):

* one report: ε(P @ Q) per attribute (≤ min(ε(P), ε(Q)));
* any number of reports of one value within one rotation period: ε(P) (the reports are
  post-processing of one draw of ``B``); each further distinct value of the attribute within the
  period costs ε(P) once more;
* any 24 h: ε(P) times the number of rotation periods a 24 h window meets, for a device whose
  record stays the same (``B`` is re-drawn each period). A device whose values change pays ε(P)
  per new value and period: only a budget bounds that (the device SDK's ε ledger enforces one).

>>> P, Q = ch.grr(np.log(3), 2), ch.grr(np.log(3), 2)
>>> compose(P, Q).round(3).tolist()
[[0.625, 0.375], [0.375, 0.625]]
>>> periods_per_window(86400, 86400), periods_per_window(86400, 3600), periods_per_window(86400, None)
(2, 25, 1)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ldpstream.estimators.kernels import channels as ch

DAY_S = 86400.0


@dataclass(frozen=True)
class Memoize:
    """Memoization settings of a collection.

    ``rotation_s``: the permanent response of an (attribute, value) is re-drawn in every period
    ``floor(t / rotation_s)`` (None: never). ``instantaneous_epsilon``: ε of the fresh GRR applied
    on top of the permanent response for every report, per attribute (None: reports carry the
    permanent response itself)."""

    rotation_s: float | None = DAY_S
    instantaneous_epsilon: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.rotation_s is not None and not (math.isfinite(self.rotation_s)
                                                and self.rotation_s > 0):
            raise ValueError(f"memoize.rotation_s must be a finite number > 0 or None, got "
                             f"{self.rotation_s!r}")
        if self.instantaneous_epsilon is not None:
            eps = tuple(float(e) for e in self.instantaneous_epsilon)
            for e in eps:
                if not (math.isfinite(e) and e > 0):
                    raise ValueError(f"memoize.instantaneous_epsilon must be finite numbers > 0, "
                                     f"got {e!r}")
            object.__setattr__(self, "instantaneous_epsilon", eps)

    def period(self, t: float) -> int:
        """The rotation period holding time ``t`` (seconds since the epoch); 0 if never rotated."""
        return 0 if self.rotation_s is None else int(math.floor(t / self.rotation_s))

    def to_dict(self) -> dict[str, Any]:
        return {"rotation_s": self.rotation_s,
                "instantaneous_epsilon": None if self.instantaneous_epsilon is None
                else list(self.instantaneous_epsilon)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Memoize":
        inst = d.get("instantaneous_epsilon")
        rot = d.get("rotation_s")
        return cls(None if rot is None else float(rot), None if inst is None else tuple(inst))


def compose(permanent: np.ndarray, instantaneous: np.ndarray | None) -> np.ndarray:
    """The channel a report goes through: ``permanent @ instantaneous`` (row-stochastic), or the
    permanent channel alone."""
    P = np.asarray(permanent, dtype=float)
    return P if instantaneous is None else P @ np.asarray(instantaneous, dtype=float)


def periods_per_window(window_s: float, rotation_s: float | None) -> int:
    """The most rotation periods ``[k·r, (k+1)·r)`` a window of ``window_s`` seconds can meet:
    ``ceil(window_s / r) + 1`` (a window not aligned to the periods meets one more), 1 when the
    response is never rotated."""
    if rotation_s is None:
        return 1
    return int(math.ceil(window_s / rotation_s)) + 1


@dataclass(frozen=True)
class Guarantee:
    """What a device's reports cost over time (ε, pure LDP, summed over the record's attributes).

    ``per_rotation`` and ``per_day`` hold for a device whose record does not change; None means
    unbounded (every report randomized afresh: k reports cost k·``per_report``).
    ``per_version_change``: what a memoized device of an adaptive family spends again when a
    new version changes the permanent channels (its memos are kept per channel fingerprint, so
    the new version's are drawn afresh: at most ``per_rotation`` more in that period); None for
    static families."""

    per_report: float
    memoized: bool = False
    rotation_s: float | None = None
    per_rotation: float | None = None
    per_day: float | None = None
    per_version_change: float | None = None

    @classmethod
    def fresh(cls, per_report: float) -> "Guarantee":
        """Every report randomized afresh: only the per-report ε is bounded."""
        return cls(float(per_report))

    @classmethod
    def memoized_channels(cls, permanent: Sequence[np.ndarray],
                          instantaneous: Sequence[np.ndarray] | None,
                          memoize: Memoize) -> "Guarantee":
        """The guarantee of per-attribute permanent channels (+ instantaneous ones), computed from
        the matrices [RAPPOR §3, §6]."""
        inst = list(instantaneous) if instantaneous is not None else [None] * len(permanent)
        per_report = ch.epsilon_of_report(compose(P, Q) for P, Q in zip(permanent, inst))
        per_rotation = ch.epsilon_of_report(permanent)
        return cls(per_report, True, memoize.rotation_s, per_rotation,
                   per_rotation * periods_per_window(DAY_S, memoize.rotation_s))

    def to_dict(self) -> dict[str, Any]:
        note = ("per_rotation and per_day hold while the record stays the same; every further "
                "distinct value of an attribute costs its permanent ε once per rotation period"
                if self.memoized else
                "every report is randomized afresh: k reports cost k × per_report")
        if self.per_version_change is not None:
            note += ("; a new version with other permanent channels draws new memos: up to "
                     "epsilon_per_version_change more in that period")
        return {"memoized": self.memoized, "rotation_s": self.rotation_s,
                "epsilon_per_report": self.per_report,
                "epsilon_per_rotation": self.per_rotation,
                "epsilon_per_day": self.per_day,
                "epsilon_per_version_change": self.per_version_change, "note": note}
