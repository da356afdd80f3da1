"""What dropping finished rows from the decode batch saves an evaluation (a benchmark, not a test).

    python benchmarks/bench_decode_retire.py MODEL [--prompts 256] [--repeats 2]

MODEL: a trained export (e.g. `runs/<stamp>/training/sft/final` of `make run`): a random model's
rows do not finish as a trained one's do. Decodes the first `prompts` P: and A: test prompts, greedy
and 4 samples each (`evaluate.complete`, as `rookworld eval` does), with the sampler as it is and
with `sampling._retire_finished` switched off (every row decoded to the batch's last step), the
two interleaved `repeats` times; prints the best time of each, their ratio, and whether the
completions are the same text.
"""

from __future__ import annotations

import argparse
import time

from rookworld_lib.chess import evaluate as ev
from rookworld_lib.core import sampling
from rookworld_lib.core.model import GPT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    model = GPT.from_pretrained(args.model)
    suites = ev.load_test_suites(keys=("P", "A"))
    retire = sampling._retire_finished
    contenders = {"retire": retire, "keep": lambda finished, live: None}
    best, texts = {}, {}
    for _ in range(args.repeats):
        for name, fn in contenders.items():
            sampling._retire_finished = fn
            for task, prompt_of in (("P", ev.policy_prompt_of), ("A", ev.env_prompt_of)):
                prompts = [prompt_of(r, "compact") for r in suites[task][:args.prompts]]
                for samples in (0, 4):
                    start = time.perf_counter()
                    texts[name, task, samples] = ev.complete(model, prompts, ev.EvalConfig(), samples=samples)
                    key = (name, task, samples)
                    best[key] = min(best.get(key, float("inf")), time.perf_counter() - start)
    sampling._retire_finished = retire
    total = {name: sum(v for k, v in best.items() if k[0] == name) for name in contenders}
    for task in ("P", "A"):
        for samples in (0, 4):
            keep, ret = best["keep", task, samples], best["retire", task, samples]
            same = texts["keep", task, samples] == texts["retire", task, samples]
            print(f"{task}: {'greedy' if not samples else f'{samples} samples'}: keep {keep:.2f} s, retire {ret:.2f} s, "
                  f"{keep / ret:.2f}x; completions {'identical' if same else 'DIFFER'}")
    print(f"all: keep {total['keep']:.2f} s, retire {total['retire']:.2f} s, {total['keep'] / total['retire']:.2f}x")


if __name__ == "__main__":
    main()
