"""``ldpstream bench numeric``: the numeric family (sw-hm, docs/numeric.md) against its
targets, side by side in one run, at ε ∈ {0.5, 1, 2, 4, 8} per attribute.

1. Mean: the Monte Carlo variance of the PM, HM, Duchi and k-point mean estimates (R runs of
   n values of Adult's age, every report on the mean task) against the papers' closed forms
   (the k-point mechanism's: its exact variance), and the smallest variance (and MSE) of "bin
   into k equal cells + GRR + bin centres" over k ≤ 64 (exact, from the GRR channel); at the
   whole column's n, the MSE of ``mean: auto`` against that baseline's best MSE in hindsight.
2. Distribution: W1 (÷ the range) of SW + EMS at the automatic granularity against hand-binned
   GRR with the best k ≤ 64 in hindsight and, from a source checkout, the reference SW + EMS
   written from the paper (tests/sw_oracle.py), on Beta(5, 2) and Adult's age and
   hours-per-week (ranges: the data's min and max), every report on the distribution task;
   beside it the same counts estimated with ``bins="cv"`` (the bin count by held-out
   likelihood).
3. Coverage: the 95 % intervals of the median, p90, p99 and the mean, and the W1 bound, over R
   runs on Beta(5, 2) (n = 20,000, the default mean_share 0.5).

``--quick`` shrinks R and the runs. Timings are not the point here; on a shared machine a full
run takes a few minutes.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from ldpstream.datasets import adult_path, load_csv
from ldpstream.estimators.families.numeric import QUANTILES, Numeric, numeric_domain
from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels import numeric as nm
from ldpstream.estimators.kernels.proper import project_simplex
from ldpstream.progress import progress

EPS = (0.5, 1.0, 2.0, 4.0, 8.0)
KS = tuple(range(2, 65))


def _oracle() -> ModuleType | None:
    """tests/sw_oracle.py of a source checkout (None when installed without the tests)."""
    path = Path(__file__).resolve().parents[1] / "tests" / "sw_oracle.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("sw_oracle", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def binned_grr_mean(t: np.ndarray, eps: float, k: int) -> tuple[float, float]:
    """(variance, MSE) of the mean of t ∈ [−1, 1] estimated by k equal bins + GRR(ε, k) + the
    bin centres, exactly: Var = Σ_i Var(c_{Y_i}) / (n (p−q))², bias = Σ c_j f_j − mean(t)."""
    p, q = ch.grr_pq(eps, k)
    c = -1 + (2 * np.arange(k) + 1) / k
    b = np.minimum(((t + 1) / 2 * k).astype(np.int64), k - 1)
    S, S2 = c.sum(), (c ** 2).sum()
    m1 = p * c[b] + q * (S - c[b])
    m2 = p * c[b] ** 2 + q * (S2 - c[b] ** 2)
    n = len(t)
    var = float((m2 - m1 ** 2).sum() / (n * (p - q)) ** 2)
    bias = float(c[b].mean() - t.mean())
    return var, var + bias ** 2


def part_mean(ages: np.ndarray, R: int, n: int, rng: np.random.Generator,
              advance: Any) -> list[dict[str, Any]]:
    t_all = 2 * (ages - ages.min()) / (ages.max() - ages.min()) - 1
    t = rng.choice(t_all, size=n, replace=False)
    rows = []
    for eps in EPS:
        row: dict[str, Any] = {"epsilon": eps}
        for mech in nm.MEAN_MECHANISMS:
            fam = Numeric(numeric_domain(["t"]), {"t": (-1.0, 1.0)}, eps, mean=mech,
                          mean_share=1.0)
            idx, _ = fam.encode(np.tile(t, R)[:, None])
            cells = fam.randomize(idx, rng)[:, 0].astype(np.int64).reshape(R, n)
            est = fam.mean_part(0)[1][cells].mean(axis=1)
            cf = float(nm.closed_form_variance(mech, eps, nm.grid_t(nm.DEFAULT_GRID)[idx[:n, 0]])
                       .sum() / n ** 2)
            row[mech] = {"variance": float(est.var(ddof=1)), "closed_form": cf,
                         "ratio": float(est.var(ddof=1) / cf)}
            advance(1)
        best = min(((k,) + binned_grr_mean(t, eps, k) for k in KS), key=lambda r: r[1])
        row["binned_grr"] = {"k": best[0], "variance": best[1], "mse": best[2],
                             "best_mse": min(binned_grr_mean(t, eps, k)[1] for k in KS)}
        row["auto"] = nm.choose_mean(eps, 129)
        row["points_k"] = nm.points_k(eps)
        # at the whole column's n the centres' bias no longer shrinks with n: MSE against MSE
        N = len(t_all)
        full = min(((k,) + binned_grr_mean(t_all, eps, k) for k in KS), key=lambda r: r[2])
        row["full_n"] = {"n": N, "auto_mse": float(nm.closed_form_variance(
            row["auto"], eps, t_all).sum() / N ** 2), "grr_best_k": full[0],
            "grr_best_mse": full[2]}
        rows.append(row)
    return rows


def _binned_grr_w1(v: np.ndarray, eps: float, k: int, rng: np.random.Generator) -> float:
    """W1 on [0, 1] of k equal bins + GRR + the unbiased estimate projected on the simplex,
    uniform within bins."""
    b = np.minimum((v * k).astype(np.int64), k - 1)
    y = ch.randomize(b, ch.grr(eps, k), rng)
    p, q = ch.grr_pq(eps, k)
    f = (np.bincount(y, minlength=k) / len(v) - q) / (p - q)
    return nm.w1_samples(project_simplex(f), v)


def part_distribution(datasets: dict[str, np.ndarray], runs: int, rng: np.random.Generator,
                      oracle: ModuleType | None, advance: Any) -> list[dict[str, Any]]:
    rows = []
    for name, v in datasets.items():
        for eps in EPS:
            fam = Numeric(numeric_domain(["v"]), {"v": (0.0, 1.0)}, eps, mean_share=0.0)
            idx, _ = fam.encode(v[:, None])
            ours, cv, ref, bins, cv_bins = [], [], [], 0, []
            grr = np.zeros(len(KS))
            for _ in range(runs):
                counts = fam.count(fam.randomize(idx, rng), fam.tensors([("v",)]))
                est = fam.estimate(counts, ("v",), "distribution")
                bins = est.extra["bins"]
                ours.append(nm.w1_samples(np.asarray(est.extra["histogram"]), v))
                est = fam.estimate(counts, ("v",), "distribution", bins="cv")
                cv.append(nm.w1_samples(np.asarray(est.extra["histogram"]), v))
                cv_bins.append(est.extra["bins"])
                grr += [_binned_grr_w1(v, eps, k, rng) for k in KS]
                if oracle is not None:
                    out = oracle.oracle_randomize(v, eps, rng)
                    ref.append(nm.w1_samples(oracle.oracle_ems(out, eps), v))
                advance(1)
            grr /= runs
            kb = int(np.argmin(grr))
            rows.append({"data": name, "epsilon": eps, "n": len(v), "bins": bins,
                         "w1": float(np.mean(ours)), "cv_w1": float(np.mean(cv)),
                         "cv_bins": cv_bins, "grr_best_k": KS[kb],
                         "grr_w1": float(grr[kb]),
                         "reference_w1": float(np.mean(ref)) if ref else None})
    return rows


def part_coverage(R: int, rng: np.random.Generator, advance: Any) -> list[dict[str, Any]]:
    rows = []
    for eps in (1.0, 4.0):
        fam = Numeric(numeric_domain(["x"]), {"x": (0.0, 1.0)}, eps)
        hq, hm, hw = [], [], []
        for _ in range(R):
            vals = rng.beta(5, 2, size=20_000)
            idx, _ = fam.encode(vals[:, None])
            counts = fam.count(fam.randomize(idx, rng), fam.tensors([("x",)]))
            em = fam.estimate(counts, ("x",), "mean")
            ed = fam.estimate(counts, ("x",), "distribution")
            tq = np.quantile(vals, QUANTILES)
            hq.append([lo <= t <= hi for (_, lo, hi), t in zip(ed.extra["quantiles"].values(), tq)])
            # the mean's interval is about the population the devices are drawn from (its
            # variance the reports' own: sampling and randomization), Beta(5, 2)'s mean 5/7;
            # the quantiles' are about the values reported
            hm.append(em.extra["mean_low"] <= 5 / 7 <= em.extra["mean_high"])
            hw.append(nm.w1_samples(np.asarray(ed.extra["histogram"]), vals)
                      <= ed.extra["w1_bound"])
            advance(1)
        cov = np.mean(hq, axis=0)
        rows.append({"epsilon": eps, "runs": R, "mean": float(np.mean(hm)),
                     **{f"q{p:g}": float(c) for p, c in zip(QUANTILES, cov)},
                     "w1_bound": float(np.mean(hw))})
    return rows


def run(quick: bool = False, verbose: bool = True) -> dict[str, Any]:
    rng = np.random.default_rng(20_26)
    adult = load_csv(adult_path(), ["age", "hours-per-week"],
                     numeric={"age": None, "hours-per-week": None})

    def unit(x: np.ndarray) -> np.ndarray:
        return (x - x.min()) / (x.max() - x.min())

    datasets = {"beta(5,2)": rng.beta(5, 2, size=50_000),
                "adult age": unit(adult.values["age"]),
                "adult hours-per-week": unit(adult.values["hours-per-week"])}
    R_mean, n_mean = (300, 1000) if quick else (2000, 2000)
    runs, R_cov = (1, 20) if quick else (5, 200)
    oracle = _oracle()
    total = len(EPS) * 3 + len(datasets) * len(EPS) * runs + 2 * R_cov
    with progress("bench numeric", total) as advance:
        out = {"mean": part_mean(adult.values["age"], R_mean, n_mean, rng, advance),
               "distribution": part_distribution(datasets, runs, rng, oracle, advance),
               "coverage": part_coverage(R_cov, rng, advance),
               "settings": {"mean_runs": R_mean, "mean_n": n_mean, "distribution_runs": runs,
                            "coverage_runs": R_cov, "reference": oracle is not None}}
    if verbose:
        report(out)
    return out


def report(out: dict[str, Any]) -> None:
    s = out["settings"]
    print(f"Mean: variance of the estimate, Monte Carlo ({s['mean_runs']} runs of n = "
          f"{s['mean_n']} Adult ages on [−1, 1]) ÷ closed form (points: ÷ its exact variance, "
          f"its k); binned GRR: smallest variance "
          f"over k ≤ 64 (its k; its MSE with the centres' bias; best MSE over k)")
    print(f"{'ε':>4} {'auto':>6} {'PM':>7} {'HM':>7} {'Duchi':>7} {'points (k)':>12} {'auto var':>10} "
          f"{'GRR var (k)':>16} {'GRR MSE':>10} {'best MSE':>10}  below | at n = "
          f"{out['mean'][0]['full_n']['n']:,}: auto MSE, best GRR MSE (k)")
    for r in out["mean"]:
        g = r["binned_grr"]
        print(f"{r['epsilon']:>4g} {r['auto']:>6} {r['pm']['ratio']:>7.3f} {r['hm']['ratio']:>7.3f} "
              f"{r['duchi']['ratio']:>7.3f} {r['points']['ratio']:>7.3f} ({r['points_k']:>2}) "
              f"{r[r['auto']]['variance']:>10.3e} "
              f"{g['variance']:>10.3e} ({g['k']:>2}) {g['mse']:>10.3e} {g['best_mse']:>10.3e}  "
              f"{'yes' if r[r['auto']]['variance'] < g['variance'] else 'NO':>5} | "
              f"{r['full_n']['auto_mse']:.3e}, {r['full_n']['grr_best_mse']:.3e} "
              f"({r['full_n']['grr_best_k']})")
    print(f"\nDistribution: W1 ÷ range (mean of {s['distribution_runs']} runs); ratios > 1 mean "
          f"sw-hm is better")
    print(f"{'data':<22} {'ε':>4} {'bins':>5} {'sw-hm':>8} {'GRR best k':>14} {'×':>6} "
          f"{'reference':>10} {'×':>6}  | bins=cv: W1, × GRR, × reference (its bins)")
    for r in out["distribution"]:
        ref = r["reference_w1"]
        print(f"{r['data']:<22} {r['epsilon']:>4g} {r['bins']:>5} {r['w1']:>8.4f} "
              f"{r['grr_w1']:>9.4f} ({r['grr_best_k']:>2}) {r['grr_w1'] / r['w1']:>6.2f} "
              + (f"{ref:>10.4f} {ref / r['w1']:>6.2f}" if ref is not None else
                 f"{'-':>10} {'-':>6}")
              + f"  | {r['cv_w1']:.4f} {r['grr_w1'] / r['cv_w1']:.2f} "
              + (f"{ref / r['cv_w1']:.2f}" if ref is not None else "-")
              + f" ({'/'.join(str(b) for b in r['cv_bins'])})")
    print("\nCoverage of the 95 % intervals (Beta(5, 2), n = 20,000, mean_share 0.5)")
    print(f"{'ε':>4} {'runs':>5} {'mean':>6} {'median':>7} {'p90':>6} {'p99':>6} {'W1 bound':>9}")
    for r in out["coverage"]:
        print(f"{r['epsilon']:>4g} {r['runs']:>5} {r['mean']:>6.1%} {r['q0.5']:>7.1%} "
              f"{r['q0.9']:>6.1%} {r['q0.99']:>6.1%} {r['w1_bound']:>9.1%}")
    print("\nLive (ingest/raw of a numeric collection): not measured by this bench "
          "(docs/numeric.md).")


def main(args: Any) -> int:
    if getattr(args, "live", False):   # the live ingest ratio: bench/numeric_live.py
        from ldpstream.bench import numeric_live

        return numeric_live.main(args)
    if getattr(args, "drift", False):   # partitioned numeric drift: bench/numeric_drift.py
        from ldpstream.bench import numeric_drift

        return numeric_drift.main(args)
    out = run(quick=bool(getattr(args, "quick", False)), verbose=not args.json)
    if args.json:
        print(json.dumps(out, indent=2, default=float))
    return 0


__all__ = ["run", "main", "binned_grr_mean"]
