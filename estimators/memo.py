"""Memoization shared by the one-shot families (docs/mechanisms.md §8): the ``memoize``
parameter and the composition of a permanent GRR with an instantaneous one.

A permanent GRR_k(ε₁) followed by a fresh GRR_k(ε₂) is again a GRR over the same k values,
keep probability p₁p₂ + (k − 1)q₁q₂, so estimators invert the composed channel as they would
a single GRR (the frequency oracles of ``partitioned`` then only change their ε).

>>> round(composed_grr_epsilon(math.log(3), math.log(3), 2), 6) == round(math.log(0.625 / 0.375), 6)
True
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.mechanism import ParamError, Params, attribute_budget
from ldpstream.estimators.oracles.frequency_oracles import grr_pq
from ldpstream.estimators.stream.longitudinal import DAY_S, Memoize

__all__ = ["memoize_param", "memoize_per_attribute", "memoize_state", "memoize_of",
           "only_memoize", "per_attribute", "composed_grr_pq",
           "composed_grr_epsilon"]


def memoize_param(raw: Any, instantaneous: Callable[[float], tuple[float, ...]]) -> Memoize:
    """The ``memoize: {rotation_s, instantaneous_epsilon}`` parameter (both optional: daily
    rotation, no instantaneous layer; ``rotation_s: null`` never rotates); ``instantaneous``
    maps the configured instantaneous ε to the family's per-unit ε. Errors name
    ``memoize.<field>``."""
    if not isinstance(raw, Mapping):
        raise ParamError("memoize", f"must be a mapping {{rotation_s, instantaneous_epsilon}} "
                                    f"(got {raw!r})")
    sub = Params("memoize", raw)
    try:
        never = not sub.has("rotation_s") and "rotation_s" in raw  # rotation_s: null
        rotation = None if never else sub.number("rotation_s", DAY_S, gt=0.0)
        inst = sub.number("instantaneous_epsilon", None, gt=0.0)
        sub.done()
    except ParamError as exc:
        raise ParamError(f"memoize.{exc.field}", str(exc).split(": ", 1)[1]) from None
    return Memoize(rotation, None if inst is None else instantaneous(inst))


def memoize_per_attribute(raw: Any, epsilon_scope: str, m: int) -> Memoize:
    """:func:`memoize_param` whose instantaneous ε is per attribute and follows
    ``epsilon_scope`` like ε (rr-ind, rr-joint, rr-clusters, spl)."""
    return memoize_param(raw, lambda e: (attribute_budget(e, epsilon_scope, m),) * m)


def memoize_state(memoize: Memoize | None) -> dict[str, Any]:
    """The ``memoize`` entry of a mechanism's state (none when not memoized)."""
    return {} if memoize is None else {"memoize": memoize.to_dict()}


def memoize_of(state: Mapping[str, Any]) -> Memoize | None:
    """The :class:`Memoize` of a state written with :func:`memoize_state`."""
    return None if state.get("memoize") is None else Memoize.from_dict(state["memoize"])


def only_memoize(family: str, params: Mapping[str, Any] | None, epsilon_scope: str,
                 m: int) -> Memoize | None:
    """The params of a family whose one parameter is ``memoize`` (per attribute)."""
    p = Params(family, params)
    raw = p.value("memoize")
    p.done()
    return None if raw is None else memoize_per_attribute(raw, epsilon_scope, m)


def per_attribute(responses: np.ndarray, channels: Sequence[np.ndarray] | None,
                  rng: np.random.Generator) -> np.ndarray:
    """Column j of ``responses`` ``(n, m)`` through ``channels[j]`` (a copy); the responses
    themselves when there are no channels (no instantaneous layer)."""
    if channels is None:
        return responses
    out = np.empty_like(responses)
    for j, Q in enumerate(channels):
        out[:, j] = ch.randomize(responses[:, j], Q, rng)
    return out


def composed_grr_pq(p1: float, p2: float, k: int) -> tuple[float, float]:
    """(keep, each other value) of GRR_k with keep ``p1`` followed by GRR_k with keep ``p2``."""
    q1, q2 = (1.0 - p1) / (k - 1), (1.0 - p2) / (k - 1)
    keep = p1 * p2 + (k - 1) * q1 * q2
    return keep, (1.0 - keep) / (k - 1)


def composed_grr_epsilon(eps1: float, eps2: float, k: int) -> float:
    """ε of GRR_k(ε₁) followed by GRR_k(ε₂), from the composed channel's two probabilities."""
    p, q = composed_grr_pq(grr_pq(eps1, k)[0], grr_pq(eps2, k)[0], k)
    return math.log(p / q) if q > 0 else math.inf
