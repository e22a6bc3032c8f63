"""``ldpstream bench numeric --drift``: calibration of the drift test of a numeric attribute
inside ``partitioned``'s marginals (docs/windows.md "Numeric attributes").

A collection of fw (3 firmwares) and battery on [0, 100] (9 points), ε = 2 per report, the
tables [battery] and [fw, battery] declared, with GRR and with OLH oracles. R pairs of
stationary windows of 20,000 reports each (fw uniform, battery ~ 100·Beta(5, 2)), each
table's codes drawn from their exact probabilities (:func:`draw`). Per marginal and oracle:
the standard deviation of every standardized change (the mean and the share below each pooled
quantile, per firmware; ideal 1) and the alarm rates at α = 0.05 and 0.01 (ideal: at most α).
Then power: over 10 seeds, windows of reports randomized by the family (its own oracles) whose
battery moved from 100·Beta(5, 2) to 100·Beta(3, 2) and to 100·Beta(2, 5), at α = 0.001.
``--quick``: 100 pairs, 3 seeds.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np
from scipy.special import betainc

from ldpstream.config import parse_config
from ldpstream.estimators.families.partitioned import Partitioned, tensor_key
from ldpstream.estimators.oracles import frequency_oracles as fo
from ldpstream.estimators.stream.drift import terms_test
from ldpstream.progress import progress

#: the points of battery
BINS = 9
#: reports per window
N = 20_000
#: the marginals whose drift is numeric
NUMERIC = (("battery",), ("fw", "battery"))
ALPHAS = (0.05, 0.01)


def collection(oracles: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    """The bench's collection (``oracles``: the oracles allowed; default the family's)."""
    params = {"marginals": [["battery"], ["fw", "battery"], ["fw"]], "bins": {"battery": BINS},
              **({"oracles": oracles} if oracles else {})}
    return {"id": "c", "schema": {"attributes": {
        "fw": ["a", "b", "c"], "battery": {"numeric": {"min": 0, "max": 100}}}},
        "mechanism": "partitioned", "epsilon": 2.0, "epsilon_scope": "record",
        "params": params, "marginals": [["battery"], ["fw", "battery"], ["fw"]],
        "estimators": ["global", "unbiased"], **extra}


def mechanism(oracles: list[str] | None = None) -> Partitioned:
    mech = parse_config({"collections": [collection(oracles)]}).collections["c"].mechanism()
    assert isinstance(mech, Partitioned)
    return mech


def cell_law(mech: Partitioned, a: float = 5.0, b: float = 2.0) -> dict[str, np.ndarray]:
    """Each declared table's cell probabilities: fw uniform, battery ~ 100·Beta(a, b) put on
    the nearest grid point, then rounded without bias to the points (exactly)."""
    G = mech.domain["battery"]
    cuts = np.clip((np.arange(G + 1) - 0.5) / (G - 1), 0, 1)
    pts = np.diff(betainc(a, b, cuts)) @ mech.binning.channel(mech.domain.axes(("battery",))[0])
    fw = np.full(3, 1 / 3)
    law = {("battery",): pts, ("fw", "battery"): np.outer(fw, pts).ravel(), ("fw",): fw}
    return {tensor_key(m): law[tuple(m)] for m in mech.marginals}


def draw(mech: Partitioned, law: dict[str, np.ndarray], n: int,
         rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One window's tensors from the exact report probabilities: each report's table uniform,
    then its code multinomial with the oracle's channel (GRR: the code is the support; OLH: the
    code (seed, y) supports every cell hashed to y under its seed)."""
    per_table = rng.multinomial(n, np.full(len(mech.marginals), 1 / len(mech.marginals)))
    out = {}
    for (key, f), o, n_k in zip(law.items(), mech.oracles, per_table):
        codes = rng.multinomial(n_k, f @ o.channel())
        if isinstance(o, fo.OLH):
            H = o.hash(np.arange(o.seeds), np.arange(o.d))
            codes = codes.reshape(o.seeds, o.g)[np.arange(o.seeds)[:, None], H].sum(axis=0)
        out[key] = np.concatenate([codes, [n_k]])
    return out


def reports(mech: Partitioned, n: int, rng: np.random.Generator, a: float = 5.0,
            b: float = 2.0) -> dict[str, np.ndarray]:
    """The counts of n reports randomized by the family (fw uniform, battery ~ 100·Beta(a, b)
    on the nearest grid point)."""
    G = mech.domain["battery"]
    idx = np.stack([rng.integers(0, 3, n),
                    np.rint(rng.beta(a, b, n) * (G - 1)).astype(np.int64)], axis=1)
    return mech.count(mech.randomize(idx, rng), mech.tensors())


def power(mech: Partitioned, seeds: int, later: tuple[float, float],
          alpha: float = 0.001) -> dict[str, Any]:
    """Per seed two windows of :data:`N` reports randomized by the family, battery ~
    100·Beta(5, 2) then 100·Beta(*later): the share of seeds that alarm (battery; per firmware),
    the statistics' and the means' z ranges."""
    stat, z_mean, alarm, by_alarm, by_z = [], [], 0, 0, []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        before, after = reports(mech, N, rng), reports(mech, N, rng, *later)
        res = terms_test(mech.drift_terms(after, before, ("battery",), "global"), alpha=alpha)
        by = terms_test(mech.drift_terms(after, before, ("fw", "battery"), "global"),
                        alpha=alpha)
        alarm += res.alarm
        by_alarm += by.alarm
        stat.append(res.statistic)
        z_mean.append(res.detail[0]["z"])
        by_z += [q["z"] for q in by.detail if q["quantity"] == "mean"]
    return {"later": list(later), "seeds": seeds, "alpha": alpha, "alarm": alarm / seeds,
            "statistic": [min(stat), max(stat)], "mean_z": [min(z_mean), max(z_mean)],
            "by_alarm": by_alarm / seeds, "by_mean_z": [min(by_z), max(by_z)]}


def calibration(mech: Partitioned, runs: int, rng: np.random.Generator,
                advance: Any = lambda k: None) -> dict[tuple[str, ...], dict[str, Any]]:
    """Per numeric marginal over ``runs`` stationary pairs: every quantity's standardized
    changes (``z``: runs × quantities), their standard deviations and the alarm rates."""
    law = cell_law(mech)
    zs: dict[tuple[str, ...], list[np.ndarray]] = {a: [] for a in NUMERIC}
    alarms = {a: np.zeros(len(ALPHAS)) for a in NUMERIC}
    names: dict[tuple[str, ...], tuple[str, ...]] = {}
    for _ in range(runs):
        cur, prev = draw(mech, law, N, rng), draw(mech, law, N, rng)
        for attrs in NUMERIC:
            t = mech.drift_terms(cur, prev, attrs, "global")
            names[attrs] = t.names
            zs[attrs].append((t.cur - t.prev) / np.sqrt(t.cur_var + t.prev_var))
            alarms[attrs] += [terms_test(t, alpha=a).alarm for a in ALPHAS]
        advance(1)
    return {a: {"names": names[a], "z": np.array(zs[a]), "sd": np.array(zs[a]).std(axis=0),
                "alarm_rate": dict(zip(ALPHAS, alarms[a] / runs))} for a in NUMERIC}


def run(quick: bool = False) -> dict[str, Any]:
    runs = 100 if quick else 1_000
    rng = np.random.default_rng(2026)
    out: dict[str, Any] = {"runs": runs, "reports": N, "rows": []}
    with progress("bench numeric --drift", 2 * runs) as advance:
        for oracle in ("grr", "olh"):
            for attrs, r in calibration(mechanism([oracle]), runs, rng, advance).items():
                out["rows"].append({"oracle": oracle, "marginal": "|".join(attrs),
                                    "sd_min": float(r["sd"].min()),
                                    "sd_max": float(r["sd"].max()),
                                    **{f"alarm_{a:g}": float(v)
                                       for a, v in r["alarm_rate"].items()}})
    seeds = 3 if quick else 10
    out["power"] = [power(mechanism(), seeds, later) for later in ((3.0, 2.0), (2.0, 5.0))]
    return out


def report(out: dict[str, Any]) -> None:
    print(f"Drift of partitioned numeric marginals: {out['runs']} stationary pairs of "
          f"{out['reports']:,} reports, ε = 2, battery on 9 points")
    print(f"{'oracle':<6} {'marginal':<12} {'sd of z':>13} " +
          " ".join(f"{'α=' + format(a, 'g'):>8}" for a in ALPHAS))
    for r in out["rows"]:
        print(f"{r['oracle']:<6} {r['marginal']:<12} {r['sd_min']:>6.3f}–{r['sd_max']:<6.3f} " +
              " ".join(f"{r[f'alarm_{a:g}']:>8.3f}" for a in ALPHAS))
    print("\nPower (the family's oracles, reports randomized by it, battery from 100·Beta(5, 2))")
    print(f"{'to':<14} {'seeds':>5} {'α':>6} {'alarms':>7} {'statistic':>12} {'mean z':>12} "
          f"{'by fw: alarms':>14} {'each mean z':>12}")
    for p in out["power"]:
        print(f"{'100·Beta(%g, %g)' % tuple(p['later']):<14} {p['seeds']:>5} {p['alpha']:>6g} "
              f"{p['alarm']:>7.0%} {p['statistic'][0]:>5.1f}–{p['statistic'][1]:<6.1f} "
              f"{p['mean_z'][0]:>5.1f}–{p['mean_z'][1]:<6.1f} {p['by_alarm']:>14.0%} "
              f"{p['by_mean_z'][0]:>5.1f}–{p['by_mean_z'][1]:<6.1f}")


def main(args: Any) -> int:
    out = run(quick=bool(args.quick))
    if args.json:
        print(json.dumps(out, indent=2, default=float))
    else:
        report(out)
    return 0


__all__ = ["run", "main", "calibration", "power", "cell_law", "draw", "reports", "collection",
           "mechanism"]
