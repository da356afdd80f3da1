"""One GRPO ablation run on a fixed SFT model, judged on the shipped test split (docs/grpo.md).

    python benchmarks/grpo_ablation.py --sft runs/<stamp>/training/sft/final --name pps16 \\
        --set '{"temperature": 0.3, "prompts_per_step": 16, "minibatch_size": 32}' --reward graded

Starts from the `cpu` profile's GRPO settings (workflow.grpo_config), applies --set (GRPOTrainConfig
fields; "loss": {...} for grpo.GRPOConfig fields; "gw": {...} for rewards.GradedWeights), trains, and
evaluates the SFT model and the result on the first --policy / --env test records: every strict
metric greedy and as pass@1 over --samples samples at the rollout temperature, with paired 95%
intervals. Appends one JSON line to --out; the SFT model's evaluation is cached beside it.

--own-piece W adds one reward function to the run, `P/moves_own_piece` with weight W: the share of the
M: entries whose from-square holds a piece of the side to move (reading the board from the FEN, which
`policy_anatomy.py` finds the model fails at for over half of its moves; docs/grpo.md, section 4).
It reads only the from-square, so it also pays a null move from an own piece (`e8e8`, which the SFT
model writes greedily), as it did in the runs of docs/grpo.md rows 21-22.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import time
from pathlib import Path

import torch

import chess

from rookworld_lib.chess import data, evaluate, rewards, tasks
from rookworld_lib.chess.training import prompt_items, reward_functions, train_records
from rookworld_lib.core.model import GPT
from rookworld_lib.core.train_grpo import GRPOTrainer
from rookworld_lib.lab import workflow


def own_piece_share(prompt: str, completion: str) -> float:
    """The share of a P: answer's M: entries (read leniently, malformed or not) that name a from-square
    holding a piece of the side to move; 0 for an answer with no M: entry."""
    board = chess.Board(tasks.parse_policy_prompt(prompt).fen)
    moves = tasks.read_policy_fields(completion, tasks.parse_policy_completion(completion)).moves
    own = [len(m) >= 2 and m[:2] in chess.SQUARE_NAMES and (piece := board.piece_at(chess.parse_square(m[:2])))
           is not None and piece.color == board.turn for m in moves]
    return sum(own) / len(own) if own else 0.0


def moves_own_piece(prompts, completions, **columns) -> list:
    """own_piece_share in TRL's reward signature: P: rows only, None on A: rows."""
    return [own_piece_share(p, c) if tasks.task_of(p) == "P" else None for p, c in zip(prompts, completions)]


moves_own_piece.__name__ = "P/moves_own_piece"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sft", required=True, help="the SFT model (Hugging Face directory)")
    ap.add_argument("--name", required=True)
    ap.add_argument("--set", default="{}", help="JSON: GRPOTrainConfig fields, 'loss' and 'gw' (see the description above)")
    ap.add_argument("--reward", default="graded", choices=("gated", "graded"))
    ap.add_argument("--policy", type=int, default=300, help="P: test records")
    ap.add_argument("--env", type=int, default=200, help="A: test records")
    ap.add_argument("--samples", type=int, default=4, help="pass@1 samples per prompt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--own-piece", type=float, default=0.0, help="weight of an added P/moves_own_piece reward (see the description above)")
    ap.add_argument("--out", type=Path, default=Path("runs/grpo_ablation/results.jsonl"))
    args = ap.parse_args()
    if (args.out.parent / args.name).exists():  # before minutes of evaluation: GRPO would refuse its folder
        ap.error(f"{args.out.parent / args.name} exists: a run of that --name is there already (another --name, "
                 "or remove the folder)")
    torch.set_num_threads(args.threads)
    over = json.loads(args.set)
    loss_over, gw = over.pop("loss", {}), over.pop("gw", None)
    prof = workflow.resolve("cpu")
    cfg = workflow.grpo_config(prof, args.out.parent / args.name, seed=args.seed)
    cfg = dataclasses.replace(cfg, progress=False, report_to="none", resume=False, **over,
                              loss=dataclasses.replace(cfg.loss, **loss_over))
    if gw:
        weights = rewards.GradedWeights(**gw)
        funcs = rewards.policy_component_rewards(weights, env_weights=rewards.GRADED_ENV_WEIGHTS)
        reward_weights = rewards.component_reward_weights(weights)
    else:
        funcs, reward_weights = reward_functions(args.reward)
    if args.own_piece:
        funcs, reward_weights = [*funcs, moves_own_piece], [*reward_weights, args.own_piece]
    policy = data.load_split("P", "test").records[:args.policy]
    env = data.load_split("A", "test").records[:args.env]
    ecfg = dataclasses.replace(workflow.eval_config(prof, args.seed), samples=args.samples,
                               sample_temperature=cfg.temperature)

    def judge(model):
        return {**evaluate.evaluate_policy(model, policy, ecfg), **evaluate.evaluate_environment(model, env, ecfg)}

    args.out.parent.mkdir(parents=True, exist_ok=True)
    records = hashlib.sha1(json.dumps([evaluate.record_key(r) for r in policy + env]).encode()).hexdigest()[:10]
    cache = args.out.parent / f"sft_{Path(args.sft).resolve().as_posix().replace('/', '_')}_p{args.policy}_" \
                              f"e{args.env}_k{args.samples}_T{cfg.temperature}_s{args.seed}_{records}.pt"
    if not cache.exists():
        torch.save(judge(GPT.from_pretrained(args.sft).eval()), cache)
    before = torch.load(cache, weights_only=False)
    t0 = time.perf_counter()
    trainer = GRPOTrainer(GPT.from_pretrained(args.sft), prompt_items(train_records()), cfg, reward_funcs=funcs,
                          reward_weights=reward_weights)
    history = trainer.train()
    seconds = time.perf_counter() - t0
    after = judge(trainer.export_model().eval())
    trainer.export(args.out.parent / args.name / "final")
    keys = [k for k in evaluate.STRICT_METRICS + evaluate.SAMPLED_METRICS if k in after]
    q = max(1, len(history) // 4)
    trend = workflow.reward_trend(history)
    row = {"name": args.name, "reward": "custom" if gw else args.reward, "set": json.loads(args.set),
           "own_piece": args.own_piece,
           "seed": args.seed, "sft": args.sft, "policy_records": len(policy), "env_records": len(env),
           "grpo_s": round(seconds), "steps": len(history), "completions": len(history) * cfg.prompts_per_step * cfg.group_size,
           "frac_reward_zero_std": sum(r["frac_reward_zero_std"] for r in history) / len(history),
           "kl_last_quarter": sum(r.get("kl", 0.0) for r in history[-q:]) / q,
           "reward_trend": trend.to_dict(orient="index"),
           "metrics": {}}
    for k in keys:
        d = evaluate.paired_estimates(before[k], after[k], k)  # refuses a cached SFT result of other records
        row["metrics"][k] = {"before": before[k].value, "after": after[k].value, "change": d.value, "low": d.low,
                             "high": d.high, "n": d.n}
    print(json.dumps(row))
    with args.out.open("a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
