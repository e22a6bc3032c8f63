"""Corr-RR (estimators/families/corr_rr.py, corr_rr_paper.py, cond_rr.py), the synthetic generator and the
simulate/bench entry points: privacy audits from the exact Phase II channel, χ² of the
randomizer, unbiasedness and stated variance of the GLS estimator by seeded Monte Carlo, the
published bias floor, and corr-rr against corr-rr-paper and SPL."""
import io
import json
from contextlib import redirect_stdout

import numpy as np
import pytest
from scipy import stats

from ldpstream.estimators.families.corr_rr import CorrRR, PhaseModel, decode_optimal_table, optimal_table, shrunk_plugin
from ldpstream.estimators.families.corr_rr_paper import CorrRRPaper, paper_py, paper_py_table, run_two_phase
from ldpstream.estimators.families.multi_baselines import SPL, marginal_mse
from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.mechanism import MECHANISMS, from_state
from ldpstream.producers.synthetic import SpecError, generate, parse_spec, population_marginals

pytestmark = [pytest.mark.core, pytest.mark.slow]

EQ = Domain(("a", "b", "c"), (3, 3, 3))
HET = Domain(("a", "b", "c"), (2, 3, 2))


def _truth(X, shape):
    return [np.bincount(X[:, j].astype(np.intp), minlength=d) / len(X) for j, d in enumerate(shape)]


def _star(n, shape, rho=0.7, seed=0):
    rng = np.random.default_rng(seed)
    x1 = rng.choice(shape[0], n, p=np.arange(shape[0], 0, -1) / np.arange(shape[0], 0, -1).sum())
    cols = [x1] + [np.where(rng.random(n) < rho, x1 % d, rng.integers(0, d, n)) for d in shape[1:]]
    return np.stack(cols, axis=1).astype(np.uint8)


def test_registered_and_state_round_trip():
    assert {"corr-rr", "corr-rr-paper"} <= set(MECHANISMS)
    X = _star(4000, HET.shape)
    for cls, dom in [(CorrRR, EQ), (CorrRRPaper, EQ), (CorrRR, HET), (CorrRRPaper, HET)]:
        Xd = _star(4000, dom.shape)
        mech, counts = run_two_phase(cls(dom, 1.0, 0.2), Xd, np.random.default_rng(0))
        assert mech.version == 1  # refined once from Phase I
        st = json.loads(json.dumps(mech.state()))
        assert st["mechanism"] == cls.name and st["version"] == 1 and "table" in st
        back = from_state(st)
        assert type(back) is cls and back.state() == mech.state()
        assert np.array_equal(mech.randomize(Xd, np.random.default_rng(5)),
                              back.randomize(Xd, np.random.default_rng(5)))
        # the table is a pure function of the Phase I counts
        again = cls(dom, 1.0, 0.2).refine(counts, n_plan=len(Xd))
        assert np.array_equal(again.table, mech.table)
    assert X.shape[1] == 3


def test_errors():
    with pytest.raises(ValueError):
        CorrRR(HET, 1.0, copy="py")  # p_y copies need one domain size
    with pytest.raises(ValueError):
        CorrRR(EQ, 1.0, phase1_fraction=1.0)
    with pytest.raises(ValueError):
        CorrRR(EQ, -1.0)
    with pytest.raises(ValueError):
        CorrRR(EQ, 1.0, table=np.full((3, 3), 1.5))
    mech = CorrRR(EQ, 1.0)
    X = _star(2000, EQ.shape)
    counts = mech.count(mech.randomize(X, np.random.default_rng(0)), mech.tensors())
    with pytest.raises(ValueError):
        mech.estimate(counts, ("a", "b"))
    with pytest.raises(ValueError):
        mech.estimate(counts, ("a",), "castell")
    e = mech.estimate(counts, ("b",), "corr-rr", proper=True)
    assert e.factor.values.sum() == pytest.approx(1.0) and e.epsilon == pytest.approx(1.0)


# --- privacy audit ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dom,copy", [(EQ, "py"), (HET, "cond")], ids=["p_y", "cond"])
def test_privacy_audit(dom, copy):
    """Declared ε == ε of the exact channels: Phase II (uniform pivot, GRR_ε, copies) and
    Phase I (SPL, GRR(ε/m) each), for the published and the optimised tables."""
    X = _star(6000, dom.shape)
    for cls in (CorrRR, CorrRRPaper):
        mech, _ = run_two_phase(cls(dom, 1.3, 0.3, copy=copy), X, np.random.default_rng(2))
        Xs, P = mech.phase2_channel()
        assert np.allclose(P.sum(axis=1), 1.0)
        assert ch.epsilon(P) == pytest.approx(1.3, rel=1e-9)
        assert ch.epsilon_of_report(mech.P1) == pytest.approx(1.3, rel=1e-9)
        assert mech.epsilon == pytest.approx(1.3, rel=1e-9)


@pytest.mark.parametrize("dom,copy", [(EQ, "py"), (HET, "cond")], ids=["p_y", "cond"])
def test_phase2_randomize_matches_channel(dom, copy):
    m = len(dom)
    rng = np.random.default_rng(3)
    table = rng.uniform(0.1, 0.9, (m, m))
    cond = None
    if copy == "cond":
        cond = [[None if j == k else rng.dirichlet(np.ones(dom.shape[k]), size=dom.shape[j])
                 for k in range(m)] for j in range(m)]
    mech = CorrRR(dom, 1.0, 0.1, copy=copy, table=table, cond=cond)
    Xs, P = mech.phase2_channel()
    N = 30_000
    for row in (0, len(Xs) // 2, len(Xs) - 1):
        rep = mech.with_phase(1).randomize(np.tile(Xs[row], (N, 1)).astype(np.uint8), rng)
        idx = np.ravel_multi_index(tuple(rep[:, 1:].astype(np.intp).T), dom.shape)
        obs = np.bincount(idx, minlength=P.shape[1])
        exp = P[row] * N
        keep = exp > 5
        o, e = np.append(obs[keep], obs[~keep].sum()), np.append(exp[keep], exp[~keep].sum())
        if e[-1] == 0:
            o, e = o[:-1], e[:-1]
        assert stats.chisquare(o, e).pvalue > 1e-4


# --- the published p_y and the exact-MSE table ------------------------------------------------------

def test_paper_py_published_form():
    """Hand evaluation of the published closed form for d = 3 (docs/mechanisms.md §5), and its guards."""
    fa, fb, eps, n2 = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5]), 2.0, 5000
    d = 3
    p = np.exp(eps) / (np.exp(eps) + d - 1)
    q = 1 / (np.exp(eps) + d - 1)
    dl = p - q
    d0, e = 1 - fa - fb, 2 * fb - 1
    al = (1 - dl) / d + dl / 2 * (d0 + 2 * fa)
    be = dl / 2 * e
    D1 = d0 * e / 2 + be * (1 - 2 * al) / (n2 * dl ** 2)
    D2 = e * e / 4 - be * be / (n2 * dl ** 2)
    want = float(np.clip(-D1.sum() / (2 * D2.sum()), 0, 1))
    assert paper_py(fa, fb, eps, n2) == pytest.approx(want) == pytest.approx(0.653968, rel=1e-6)
    assert paper_py(fa, fb, eps, 1) == 0.5
    assert paper_py(np.array([0.5, 0.5]), np.array([0.5, 0.5]), eps, 100) == 0.5  # ΣD₂ = 0


def _decode_mse(dom, table, f, eps, n2, k, mech):
    chans = [[None if j == l else mech.affine(j, l)[0] + table[j, l] * mech.affine(j, l)[1]
              for l in range(len(dom))] for j in range(len(dom))]
    pm = PhaseModel(dom.shape, eps, 0, n2, chans)
    lam = pm.lam(np.concatenate(f))
    s = slice(pm.off[k], pm.off[k + 1])
    p, q = ch.grr_pq(eps, dom.shape[k])
    D = (lam[s] - q) / (p - q)
    return float(np.sum((D - f[k]) ** 2) + np.sum(lam[s] * (1 - lam[s])) / (n2 * (p - q) ** 2))


def test_decode_optimal_table_is_exact_minimum():
    """Per column, the table minimises the exact MSE of the Phase II GRR decode (brute-force grid
    over the two pivots' t), and it is never worse than the published p_y."""
    rng = np.random.default_rng(0)
    mech = CorrRR(EQ, 1.0)
    for _trial in range(2):
        f = [rng.dirichlet(np.ones(3)) for _ in range(3)]
        T = decode_optimal_table(f, 1.0, 500, mech.affine_all())
        Tp = paper_py_table(f, 1.0, 500)
        grid = np.linspace(0, 1, 21)
        for k in range(3):
            others = [j for j in range(3) if j != k]

            def at(t):
                T2 = T.copy()
                T2[others, k] = t
                return _decode_mse(EQ, T2, f, 1.0, 500, k, mech)

            best = min(at(np.array([a, b])) for a in grid for b in grid)
            got = at(T[others, k])
            assert got <= best + 1e-12
            assert got <= at(Tp[others, k]) + 1e-12


# --- the GLS estimator: unbiased, with the stated variance ------------------------------------------

@pytest.mark.parametrize("dom,copy", [(EQ, "py"), (HET, "cond")], ids=["p_y", "cond"])
def test_unbiased_estimator_monte_carlo(dom, copy):
    """Fixed dataset (n = 20 000), fixed copy table, 150 seeded runs of the whole report →
    estimate path: every cell's mean error of the GLS estimate within 4.5 standard errors of 0,
    and the stated variance (mean over cells) within 15 % of the Monte Carlo variance."""
    m = len(dom)
    rng = np.random.default_rng(1)
    table = rng.uniform(0.2, 0.9, (m, m))
    cond = None
    if copy == "cond":
        cond = [[None if j == k else rng.dirichlet(np.ones(dom.shape[k]) * 2, size=dom.shape[j])
                 for k in range(m)] for j in range(m)]
    mech = CorrRR(dom, 1.0, 0.2, copy=copy, table=table, cond=cond)
    X = _star(20_000, dom.shape, seed=4)
    truth = np.concatenate(_truth(X, dom.shape))
    R = 150
    ests, stated = [], []
    for r in range(R):
        counts = mech.count(mech.randomize(X, np.random.default_rng([7, r])), mech.tensors())
        cb = mech.combined(counts)
        ests.append(cb.unbiased)
        stated.append(np.diag(cb.cov_unbiased))
    ests = np.asarray(ests)
    z = (ests.mean(0) - truth) / (ests.std(0, ddof=1) / np.sqrt(R))
    assert np.all(np.abs(z) < 4.5), z
    ratio = np.mean(stated) / ests.var(0, ddof=1).mean()
    assert 0.85 < ratio < 1.15, ratio


# --- behaviour claimed in the docs ----------------------------------------------------------------------

def test_py_one_on_perfectly_correlated_attributes_beats_spl():
    """All attributes equal (ρ = 1): with p_y = 1 every Phase II column is a full-ε GRR report
    of the common value, and corr-rr beats SPL (ε/m per attribute) by far."""
    dom = Domain(("a", "b", "c", "d"), (4,) * 4)
    rng = np.random.default_rng(0)
    x = rng.choice(4, 20_000, p=[0.4, 0.3, 0.2, 0.1])
    X = np.stack([x] * 4, axis=1).astype(np.uint8)
    truth = _truth(X, dom.shape)
    mech = CorrRR(dom, 1.0, 0.1, table=np.ones((4, 4)))
    spl = SPL(dom, 1.0)
    c_rr, c_spl = [], []
    for r in range(20):
        g = np.random.default_rng([3, r])
        c_rr.append(marginal_mse(mech.estimate_all(mech.count(mech.randomize(X, g),
                                                              mech.tensors())), truth))
        c_spl.append(marginal_mse(spl.estimate_all(spl.count(spl.randomize(X, g),
                                                             spl.tensors())), truth))
    assert np.mean(c_rr) < 0.2 * np.mean(c_spl), (np.mean(c_rr), np.mean(c_spl))


def test_paper_bias_floor_and_corr_rr_below_it():
    """corr-rr-paper on correlated data with different marginals: the MSE does not shrink with ε
    (ε = 8 within a factor 0.6 of ε = 2, and at least half the bias floor predicted by the linear
    model), while corr-rr is below it at every ε tested."""
    spec = parse_spec("corr:m=4,d=2,rho=0.7,n=20000,seed=1")
    ds = generate(spec)
    truth = _truth(ds.records, ds.domain.shape)
    res = {}
    for eps in (0.5, 2.0, 8.0):
        for cls in (CorrRRPaper, CorrRR):
            v = []
            for r in range(8):
                mech, counts = run_two_phase(cls(ds.domain, eps, 0.1), ds.records,
                                             np.random.default_rng([int(eps * 10), r]))
                v.append(marginal_mse(mech.estimate_all(counts), truth))
            res[cls.name, eps] = np.mean(v)
    assert res["corr-rr-paper", 8.0] > 0.6 * res["corr-rr-paper", 2.0]
    # predicted floor: squared bias of the published decode under the published table at the truth
    n1, n2 = 2000, 18000
    Tp = paper_py_table(truth, 8.0, n2)
    mech = CorrRRPaper(ds.domain, 8.0, table=Tp)
    pm = PhaseModel(ds.domain.shape, 8.0, n1, n2, mech.copy_channels())
    T, t0, _, _ = pm.decode_affine()
    f = np.concatenate(truth)
    floor = float(pm.omega @ ((T - np.eye(pm.D)) @ f + t0) ** 2)
    assert res["corr-rr-paper", 8.0] > 0.5 * floor > 0
    for eps in (0.5, 2.0, 8.0):
        assert res["corr-rr", eps] < res["corr-rr-paper", eps], (eps, res)


def test_shrunk_plugin_and_optimal_table():
    f = [np.array([0.5, 0.3, 0.2])] * 3
    plug, post = shrunk_plugin([x + 0.01 for x in f], 1.0, 100)
    assert all(np.allclose(p, plug[0]) for p in plug)  # noise only: shrunk to the common centre
    assert post.shape == (9, 9)
    T, info = optimal_table(f, 1.0, 1000, 9000, CorrRR(EQ, 1.0).affine_all(), post)
    assert T.shape == (3, 3) and np.all((T >= 0) & (T <= 1)) and "predicted" in info


# --- synthetic generator -------------------------------------------------------------------------------

def test_generator_spec_and_marginals():
    s = parse_spec("corr:m=3,d=4,rho=0.6,n=50000,model=star,p=skew,seed=3")
    assert (s.m, s.d, s.rho, s.n, s.seed) == (3, 4, 0.6, 50000, 3)
    assert parse_spec(s.text()) == s
    assert parse_spec("corr:n=2e4").n == 20000
    ds = generate(s)
    assert ds.records.shape == (50000, 3) and ds.domain.shape == (4, 4, 4)
    for emp, pop in zip(_truth(ds.records, ds.domain.shape), population_marginals(s)):
        assert np.max(np.abs(emp - pop)) < 0.01
    assert np.allclose(population_marginals(s)[0], [0.4, 0.3, 0.2, 0.1])
    u = generate("corr:m=3,d=2,rho=0.7,n=60000,p=uniform,model=latent,seed=1").records
    c = np.corrcoef(u.T.astype(float))
    assert np.allclose(c[np.triu_indices(3, 1)], 0.7, atol=0.02)
    st = generate("corr:m=3,d=2,rho=0.7,n=60000,p=uniform,model=star,seed=1").records
    c = np.corrcoef(st.T.astype(float))
    assert c[0, 1] == pytest.approx(0.7, abs=0.02) and c[1, 2] == pytest.approx(0.49, abs=0.02)
    ch_ = generate("corr:m=3,d=3,rho=0.5,n=1000,model=chain,seed=2")
    assert ch_.n == 1000
    for bad in ("corr:m=1", "corr:rho=2", "corr:model=tree", "corr:k=3", "corr:m=x", "gauss:m=2",
                "corr:m=2,m=3", "corr:n"):
        with pytest.raises(SpecError):
            parse_spec(bad)


# --- entry points ---------------------------------------------------------------------------------------

def _cli(argv):
    from ldpstream.cli import main
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(argv)
    return rc, buf.getvalue()


def test_simulate_cli(capsys):
    rc, out = _cli(["simulate", "--mechanism", "corr-rr", "--generator",
                    "corr:m=3,d=3,rho=0.8,n=3000", "--runs", "2", "--epsilon", "1",
                    "--epsilon-scope", "record", "--estimator", "corr-rr", "--estimator",
                    "unbiased", "--json"])
    assert rc == 0
    res = json.loads(out)
    assert res["mechanism"] == "corr-rr" and res["runs"] == 2 and res["n"] == 3000
    assert [r["estimator"] for r in res["results"]] == ["corr-rr", "unbiased"]
    assert res["results"][0]["stderr"] is not None
    assert res["epsilon_per_record"] == pytest.approx(1.0)
    # RS+FD: the published amplified ε' (one-attribute neighbours) is a parameter
    for neighbours, want in (("attribute", np.log(3 * np.expm1(1.0) + 1)), ("record", 1.0)):
        rc, out = _cli(["simulate", "--mechanism", "rs-fd", "--generator", "corr:m=3,d=3,n=2000",
                        "--epsilon", "1", "--epsilon-scope", "record", "--param",
                        f"neighbours={neighbours}", "--json"])
        r = json.loads(out)
        assert rc == 0 and r["epsilon_per_record"] == pytest.approx(want, rel=1e-9)
    rc, out = _cli(["simulate", "--mechanism", "rs-fd", "--generator", "corr:m=3,d=3,n=2000",
                    "--epsilon", "1", "--epsilon-scope", "record", "--proper"])
    assert rc == 0 and "ε per record=1 " in out
    assert _cli(["simulate", "--mechanism", "corr-rr", "--phase1-fraction", "0"])[0] == 2
    assert _cli(["simulate", "--mechanism", "smp", "--generator", "corr:rho=3"])[0] == 2
    assert _cli(["simulate", "--mechanism", "spl", "--estimator", "paper"])[0] == 2
    assert _cli(["simulate", "--mechanism", "spl", "--param", "neighbours=attribute"])[0] == 2
    err = capsys.readouterr().err
    assert "--phase1-fraction" in err and "--generator" in err and "--estimator" in err
    assert "--param neighbours: unknown parameter for spl" in err


def test_bench_quick():
    from ldpstream.bench import mech_corr
    res = mech_corr.run(quick=True, verbose=False)
    assert set(res["settings"]) and "timing" in res
    for label, s in res["settings"].items():
        ref = () if label.startswith("adult") else (mech_corr.REFERENCE,)
        assert set(s["mse"]) == set(mech_corr.MECHS + ref)
        assert len(s["summary"]["rows"]) == 3
        for row in s["summary"]["rows"]:
            assert row["ratio_vs_paper_se"] >= 0 and np.isfinite(row["ratio_vs_best"])
        assert all(c["epsilon_per_record"] > 0 for c in s["mse"]["corr-rr"].values())
    assert res["timing"]["spl"]["speedup"] > 0
