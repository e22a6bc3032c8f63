"""RRBA views: which attribute combinations a client is asked about ([RRBA] §4, docs/mechanisms.md §4).

A *view* is a list of disjoint k-subsets of the m attributes ("combinations"); a client answers
every combination of one view. The set of views must cover every pair of attributes at least once.

* k = 2: the round-robin (circle) schedule — m−1 perfect matchings for even m, m matchings with
  one attribute sitting out for odd m; every pair appears exactly once.
* k > 2: a greedy covering by disjoint k-subsets (⌊m/k⌋ per view, the m mod k left over sit out);
  every pair at least once. Deterministic.

>>> round_robin_pairs(4)
[[(0, 3), (1, 2)], [(0, 2), (1, 3)], [(0, 1), (2, 3)]]
>>> len(round_robin_pairs(5)), len(round_robin_pairs(5)[0])
(5, 2)
>>> uncovered_pairs(make_views(7, 3), 7)
[]
"""
from __future__ import annotations

from itertools import combinations

__all__ = ["round_robin_pairs", "covering_views", "make_views", "uncovered_pairs"]

View = list[tuple[int, ...]]


def round_robin_pairs(m: int) -> list[View]:
    """Circle-method round robin over ``m`` attributes (a dummy is added for odd m; the attribute
    paired with it sits out that round). Each pair occurs in exactly one view."""
    if m < 2:
        raise ValueError(f"views need at least 2 attributes, got {m}")
    n = m + (m % 2)
    ring = list(range(n))
    views: list[View] = []
    for _ in range(n - 1):
        view = []
        for i in range(n // 2):
            a, b = ring[i], ring[n - 1 - i]
            if a < m and b < m:
                view.append((min(a, b), max(a, b)))
        views.append(sorted(view))
        ring = [ring[0], ring[-1]] + ring[1:-1]  # rotate all but the first
    return views


def covering_views(m: int, k: int) -> list[View]:
    """Greedy covering of all pairs by views of ⌊m/k⌋ disjoint k-subsets.

    Each group starts from the free attribute with the most uncovered pairs among the free ones,
    then repeatedly adds the free attribute covering the most new pairs with the group (ties: the
    smaller index). Every view covers at least one new pair, so the loop ends."""
    if k < 2:
        raise ValueError(f"combination size k must be ≥ 2, got {k}")
    if m < k:
        raise ValueError(f"combination size k = {k} exceeds the number of attributes m = {m}")
    uncovered = set(combinations(range(m), 2))
    views: list[View] = []
    while uncovered:
        free = list(range(m))
        view: View = []
        while len(free) >= k:
            def new_with(a: int, group: list[int]) -> int:
                return sum((min(a, g), max(a, g)) in uncovered for g in group)
            first = max(free, key=lambda a: (new_with(a, free), -a))
            group = [first]
            free.remove(first)
            while len(group) < k:
                nxt = max(free, key=lambda a: (new_with(a, group), new_with(a, free), -a))
                group.append(nxt)
                free.remove(nxt)
            g = tuple(sorted(group))
            view.append(g)
            uncovered -= set(combinations(g, 2))
        views.append(sorted(view))
    return views


def make_views(m: int, k: int) -> list[View]:
    """The views RRBA uses: round robin for k = 2, greedy covering for k > 2."""
    return round_robin_pairs(m) if k == 2 else covering_views(m, k)


def uncovered_pairs(views: list[View], m: int) -> list[tuple[int, int]]:
    """Pairs of ``range(m)`` that no combination of ``views`` contains (empty = a covering).
    Also checks that every view's combinations are disjoint."""
    seen = set()
    for view in views:
        used = [a for comb in view for a in comb]
        if len(used) != len(set(used)):
            raise ValueError(f"view {view} has overlapping combinations")
        for comb in view:
            seen |= set(combinations(sorted(comb), 2))
    return sorted(set(combinations(range(m), 2)) - seen)
