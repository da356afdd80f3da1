"""The core is general: it loads nothing of chess, engines, plots or widgets, and its GRPO loop learns a
toy verifiable reward with no chess in sight (GRPO's own smoke test)."""

import json
import subprocess
import sys

from rookworld_lib.core import grpo
from rookworld_lib.core.train_grpo import GRPOTrainConfig, GRPOTrainer, PromptItem
from rookworld_lib.core.train_sft import SFTConfig, train_sft

CORE_MODULES = ("model", "tokenizer", "task_vocab", "sampling", "grpo", "train_step", "train_sft", "train_grpo",
                "checkpoint", "distributed", "trainer")
# torch._dynamo too: torch.compile's tracer costs about 1.8 s to import, and only a process that compiles needs it
FORBIDDEN = ("chess", "plotly", "ipywidgets", "anywidget", "kaleido", "IPython", "pandas", "papermill",
             "rookworld_lib.chess", "rookworld_lib.lab", "torch._dynamo")


def test_importing_the_core_loads_no_chess_engine_plot_widget_or_compiler_module():
    code = ("import json, sys\n" + "".join(f"import rookworld_lib.core.{m}\n" for m in CORE_MODULES)
            + f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r} "
              f"or m.startswith({FORBIDDEN!r}))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


def says_yes(prompts, completions, **columns):
    """The toy verifiable reward: 1 for the answer "yes", 0 for anything else."""
    assert len(columns["task"]) == len(columns["truth"]) == len(completions) == len(prompts)
    return [1.0 if c.strip() == "yes" else 0.0 for c in completions]


def test_core_grpo_learns_a_toy_reward(tmp_path):
    """SFT teaches a tiny model to answer "Q: <n> A:" with yes or no, half and half; GRPO with the
    yes-reward then drives the sampled reward from about 0.5 to near its maximum of 1."""
    texts = [f"Q: {i} A: {a}" for i in range(64) for a in ("yes", "no")]
    sft = SFTConfig(model="tiny", model_overrides={"block_size": 32}, block_size=32, batch_size=8, max_steps=100,
                    lr=3e-3, min_lr=3e-4, warmup_steps=5, policy_fraction=None, vocab="task", val_fraction=0.0,
                    eval_interval=0, checkpoint_interval=0, export_hf=False, progress=False, report_to="none",
                    out_dir=str(tmp_path / "sft"), seed=0)
    model = train_sft(sft, train_texts=texts).model
    items = [PromptItem("P", f"Q: {i} A:") for i in range(64)]
    cfg = GRPOTrainConfig(steps=40, prompts_per_step=4, group_size=4, policy_fraction=1.0, max_new_tokens=3,
                          minibatch_size=16, lr=2e-3, loss=grpo.GRPOConfig(beta=0.0), progress=False,
                          report_to="none", seed=0)
    history = GRPOTrainer(model, items, cfg, reward_funcs=says_yes).train()
    rewards = [r["reward"] for r in history]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-10:]) / 10
    assert 0.2 <= first <= 0.8, f"SFT should leave yes and no about even, got a first reward of {first:.2f}"
    assert last >= 0.9, f"GRPO should drive the yes-reward near 1 within 40 steps: {[round(r, 2) for r in rewards]}"


def test_reward_functions_are_summed_as_trl_sums_them():
    """Weighted sum over functions; None (unscorable) is left out as TRL's nansum leaves it; a
    function that gives the wrong number of values is refused."""
    import pytest
    import torch

    from rookworld_lib.core.train_grpo import score_completions

    items = [PromptItem("P", "P: a", {"k": 1}), PromptItem("A", "A: b")]
    length = lambda prompts, completions, **_: [float(len(c)) for c in completions]  # noqa: E731
    only_policy = lambda prompts, completions, task, truth, **_: [1.0 if t == "P" else None for t in task]  # noqa: E731
    got = score_completions([length, only_policy], [0.5, 2.0], items, ["xx", "yyyy"])
    assert torch.equal(got, torch.tensor([0.5 * 2 + 2.0 * 1.0, 0.5 * 4]))
    with pytest.raises(ValueError, match="gave 1 values for 2 completions"):
        score_completions([lambda prompts, completions, **_: [0.0]], [1.0], items, ["x", "y"])


def test_task_metadata_travels_in_config_json_and_only_under_our_prefix(tmp_path):
    import pytest

    from rookworld_lib.core.model import GPT, GPTConfig

    model = GPT(GPTConfig.preset("tiny", block_size=32))
    model.meta["rookworld_task"] = {"name": "toy", "answers": ["yes", "no"]}
    model.save_pretrained(tmp_path / "m")
    back = GPT.from_pretrained(tmp_path / "m")
    assert back.meta == {"rookworld_task": {"name": "toy", "answers": ["yes", "no"]}}
    assert back.prompt_prefix == model.prompt_prefix and back.source == str(tmp_path / "m")
    back.meta["layout"] = "x"  # not ours: transformers might read it
    with pytest.raises(ValueError, match="must start with 'rookworld_'"):
        back.save_pretrained(tmp_path / "n")
