"""How often the paired interval of the evaluation tables calls a change where there is none, for a
right/wrong metric with few discordant records (docs/grpo.md, section 3: best-move accuracy, about 1%).

    python benchmarks/paired_interval_null.py [--records 730] [--draws 20000]

Each draw is a test split of --records paired outcomes with no true change: a record is discordant
(right before and wrong after, or the other way) with the given probability, and each discordant
record goes either way with probability 1/2. It counts the draws whose `evaluate.paired_difference`
interval (Newcombe's, that of every table since 2026-11-28; before, the normal interval of the differences) excludes zero, and those where an exact McNemar test
(two-sided binomial test on the discordant records) has p < 0.05. The nominal rate of both is 5%.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from rookworld_lib.chess.evaluate import paired_difference


def mcnemar_exact_p(lost: int, gained: int) -> float:
    """Two-sided exact McNemar p-value: the binomial test of `gained` among `lost + gained` at 1/2."""
    m = lost + gained
    k = min(lost, gained)
    return 1.0 if m == 0 else min(1.0, 2 * sum(math.comb(m, i) for i in range(k + 1)) / 2 ** m)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=730, help="paired records per draw (the P: test split)")
    ap.add_argument("--draws", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    n = args.records
    print(f"{n} records, {args.draws} draws, no true change: share of draws that call a change")
    print("discordant share | mean discordant records | paired interval excludes 0 | exact McNemar p < 0.05")
    for share in (0.005, 0.01, 0.02, 0.05, 0.14):
        paired = exact = 0
        for _ in range(args.draws):
            discordant = int(rng.binomial(n, share))
            gained = int(rng.binomial(discordant, 0.5))
            lost = discordant - gained
            rest = [0.0] * (n - discordant)  # records right or wrong on both sides add 0 to every difference
            est = paired_difference([1.0] * lost + [0.0] * gained + rest, [0.0] * lost + [1.0] * gained + rest)
            paired += est.low > 0 or est.high < 0
            exact += mcnemar_exact_p(lost, gained) < 0.05
        print(f"{share:16.3f} | {share * n:23.1f} | {paired / args.draws:27.4f} | {exact / args.draws:.4f}")


if __name__ == "__main__":
    main()
