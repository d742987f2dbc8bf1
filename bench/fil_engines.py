"""Which CPU engine runs a forest fastest for the FIL backend (issue 29): Treelite's GTIL
(what Triton FIL itself runs on the CPU) against XGBoost's ``inplace_predict`` and LightGBM's
``predict``, on the same model and rows, in-process, single-threaded and all threads.

    python bench/fil_engines.py [--trees 100] [--depth 6] [--features 32] [--rounds 20]

Brief by design (a few seconds); prints the median microseconds per call for batch sizes
1, 16 and 256.
"""

from __future__ import annotations

import argparse
import statistics
import time

import lightgbm as lgb
import numpy as np
import treelite
import xgboost as xgb


def _median_us(fn, rounds: int) -> float:
    fn()  # warm
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4000, args.features)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(np.int32)
    booster = xgb.train({"max_depth": args.depth, "objective": "binary:logistic", "nthread": 1},
                        xgb.DMatrix(x, y), num_boost_round=args.trees)
    lgbm = lgb.train({"num_leaves": 2 ** args.depth, "objective": "binary", "verbose": -1},
                     lgb.Dataset(x, y), num_boost_round=args.trees)
    tl_xgb = treelite.frontend.from_xgboost(booster)
    tl_lgb = treelite.frontend.from_lightgbm(lgbm)
    print(f"{args.trees} trees, depth {args.depth}, {args.features} features; median us per call")
    print(f"{'batch':>6} {'threads':>7} {'gtil(xgb)':>10} {'xgb inplace':>12} "
          f"{'gtil(lgb)':>10} {'lgb predict':>12}")
    for batch in (1, 16, 256):
        rows = x[:batch]
        for threads in (1, -1):
            n = threads if threads > 0 else 0
            booster.set_param({"nthread": n})
            calls = [
                lambda r=rows, t=threads: treelite.gtil.predict(tl_xgb, r, nthread=t),
                lambda r=rows: booster.inplace_predict(r),
                lambda r=rows, t=threads: treelite.gtil.predict(tl_lgb, r, nthread=t),
                lambda r=rows, t=n: lgbm.predict(r, num_threads=t),
            ]
            cells = [_median_us(call, args.rounds) for call in calls]
            print(f"{batch:>6} {threads:>7} " + " ".join(f"{c:>10.0f}  " for c in cells))


if __name__ == "__main__":
    main()
