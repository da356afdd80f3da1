"""Run a small GRPO job (as one process or under torchrun) and save the final parameters.

Used by test_distributed.py: the same global batch at world size 1 and 2 must give the same
parameters.
"""

import sys

import torch

from rookworld_lib.core import distributed, grpo
from rookworld_lib.core.model import GPT, GPTConfig
from rookworld_lib.core.train_grpo import GRPOTrainConfig, GRPOTrainer, PromptItem
from sft_helpers import item_reward


def reward(item, text):
    return float(len(text) % 3) / 2.0


def main(out_path: str, loss_type: str) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", block_size=64))
    items = [PromptItem("P", f"P: prompt {i}") for i in range(8)] + [PromptItem("A", f"A: env {i}+") for i in range(8)]
    cfg = GRPOTrainConfig(steps=2, prompts_per_step=4, group_size=4, rollout_chunks=2, max_new_tokens=6,
                          minibatch_size=8, mu=2, lr=1e-3, seed=3, progress=False,
                          loss=grpo.GRPOConfig(beta=0.04, loss_type=loss_type, max_completion_length=6))
    trainer = GRPOTrainer(model, items, cfg, reward_funcs=item_reward(reward))
    trainer.train()
    if trainer.dist.is_main:
        torch.save({k: v.detach().clone() for k, v in trainer.model.state_dict().items()}, out_path)
    trainer.close()  # drop the DDP wrapper before the group goes (GRPOTrainer.close)
    distributed.cleanup()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
