"""A small GRPO job whose final parameters test_distributed.py compares across world sizes.

`train(loss_type)` trains it in the calling process (world size 1: the test's reference, no
subprocess). Run as a script under torchrun, every loss type named on the command line is trained
in turn inside the same process group (one launch for all of them: the launch, not the training,
is what costs seconds) and rank 0 saves each one's parameters to OUT_DIR/<loss_type>.pt:

    python -m torch.distributed.run --standalone --nproc_per_node=2 dist_grpo_worker.py OUT_DIR grpo dapo

(`grpo-one-chunk`: the grpo job in one rollout chunk, which rank 0 alone samples.)
"""

import sys
from pathlib import Path

import torch

from rookworld_lib.core import distributed, grpo
from rookworld_lib.core.model import GPT, GPTConfig
from rookworld_lib.core.train_grpo import GRPOTrainConfig, GRPOTrainer, PromptItem
from sft_helpers import item_reward


def reward(item, text):
    return float(len(text) % 3) / 2.0


def initial_model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.preset("tiny", block_size=64))


def train(loss_type: str, rollout_chunks: int = 2) -> tuple[dict, bool]:
    """Train the job once at this process's world size; returns ({"params": the final parameters,
    "history": the logged records}, is rank 0).

    The trainer's DDP wrapper is dropped before returning (GRPOTrainer.close), so the next job of the
    same process group gets a fresh one; the process group itself stays up."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        items = [PromptItem("P", f"P: prompt {i}") for i in range(8)] + [PromptItem("A", f"A: env {i}+") for i in range(8)]
        cfg = GRPOTrainConfig(steps=2, prompts_per_step=4, group_size=4, rollout_chunks=rollout_chunks, max_new_tokens=6,
                              minibatch_size=8, mu=2, lr=1e-3, seed=3, progress=False, task_weights={"P": 0.5, "A": 0.5},
                              loss=grpo.GRPOConfig(beta=0.04, loss_type=loss_type, max_completion_length=6))
        trainer = GRPOTrainer(initial_model(), items, cfg, reward_funcs=item_reward(reward))
        try:
            history = trainer.train()
            params = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
            return {"params": params, "history": history}, trainer.dist.is_main
        finally:
            trainer.close()  # drop the DDP wrapper before the group goes (GRPOTrainer.close)
    finally:
        torch.set_num_threads(threads)


def main(out_dir: str, jobs: list[str]) -> None:
    try:
        for name in jobs:  # a loss type, or `<loss type>-one-chunk`: one rollout chunk (one rank samples)
            loss_type, _, one = name.partition("-")
            job, is_main = train(loss_type, 1 if one else 2)
            if is_main:
                torch.save(job, Path(out_dir) / f"{name}.pt")
    finally:
        distributed.cleanup()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
