"""``ldpstream simulate`` (docs/simulate.md): the command, choosing between one run of the driver
(:mod:`.driver`), a comparison (:mod:`.compare`) and a synthetic dataset (:mod:`.synthesize`)."""
from __future__ import annotations

import json
import time
from typing import Any

import numpy as np

from ldpstream.simulate.compare import main as compare_main
from ldpstream.simulate.driver import Plan, build, check_epsilon, drive, plan_from_args, print_table, run_with_progress

__all__ = ["main"]


def main(args: Any) -> int:
    if getattr(args, "epsilon", None) is not None:
        check_epsilon(args.epsilon)
    if getattr(args, "numeric", None):
        from ldpstream.simulate.numeric import main as numeric_main
        return numeric_main(args)
    if getattr(args, "compare", False):
        return compare_main(args)
    if getattr(args, "memoize", False):
        from ldpstream.simulate.memo import main as memo_main
        return memo_main(args)
    plan = plan_from_args(args)
    from threadpoolctl import threadpool_limits
    with threadpool_limits(1):   # many small dense solves: one BLAS thread on a shared machine
        doc = run_with_progress(plan)
    if getattr(args, "synthesize", None):
        doc["synthesis"] = _synthesize(plan, args.synthesize)
    if args.json:
        print(json.dumps(doc))
    else:
        print_table(doc)
        if "synthesis" in doc:
            syn = doc["synthesis"]
            print(f"synthetic dataset → {syn['path']} ({syn['estimator']}): clusters "
                  f"{syn['clusters']}; marginal tvd 1-way {syn['tvd_1way']:.4f}, 2-way "
                  f"{syn['tvd_2way']:.4f}; {syn['seconds']:.1f}s")
    return 0


def _synthesize(plan: Plan, path: str) -> dict[str, Any]:
    """One more run keeping the reports; a synthetic dataset from its joints (first estimator)."""
    from ldpstream.simulate.synthesize import marginal_fidelity, synthesize_dataset, write_csv
    rng = np.random.default_rng([plan.seed, 104729])
    run = drive(build(plan, plan.variants[0]), plan.dataset.records, rng, (), keep_reports=True)
    t0 = time.perf_counter()
    records, info = synthesize_dataset(plan.dataset, run.mechanism, run.accepted_reports,
                                       plan.estimators[0], rng)
    info["seconds"] = time.perf_counter() - t0
    write_csv(path, plan.dataset, records)
    info.update(marginal_fidelity(plan.dataset, records), path=str(path))
    return info
