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
                    lr=3e-3, min_lr=3e-4, warmup_steps=5, vocab="task", val_fraction=0.0,
                    eval_interval=0, checkpoint_interval=0, export_hf=False, progress=False, report_to="none",
                    out_dir=str(tmp_path / "sft"), seed=0)
    model = train_sft(sft, train_texts=texts).model
    items = [PromptItem("yes-no", f"Q: {i} A:") for i in range(64)]  # a task of its own name: no chess tag needed
    cfg = GRPOTrainConfig(steps=40, prompts_per_step=4, group_size=4, max_new_tokens=3,
                          minibatch_size=16, lr=2e-3, loss=grpo.GRPOConfig(beta=0.0), progress=False,
                          report_to="none", seed=0)
    history = GRPOTrainer(model, items, cfg, reward_funcs=says_yes).train()
    rewards = [r["reward"] for r in history]
    assert [r["rewards/yes-no/mean"] for r in history] == rewards  # the per-task metric, under the task's name
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


def tiny_trainer(tmp_path=None, reward_funcs=None, items=None, **kw):
    import torch

    from rookworld_lib.core.model import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = GRPOTrainConfig(**{**dict(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=2,
                                    progress=False, report_to="none", loss=grpo.GRPOConfig(beta=0.0), seed=0,
                                    out_dir=None if tmp_path is None else str(tmp_path)), **kw})
    return GRPOTrainer(GPT(GPTConfig.preset("tiny", block_size=32)), items or [PromptItem("P", "Q: 1 A:")] * 2, cfg,
                       reward_funcs=reward_funcs or says_yes)


def test_a_bad_reward_function_or_prompt_is_refused_in_one_line_naming_it():
    """What a reward function returns is checked as TRL's signature asks (one float or None per
    completion; numpy and torch values too), naming the function; a task the trainer does not draw is
    refused, not dropped; a step that no function could score warns (it trains nothing)."""
    import warnings

    import numpy as np
    import pytest
    import torch

    def returns(value):
        def judge(prompts, completions, **_):
            return value
        return judge

    for value, message in ((0.5, "gave float 0.5 for 4 completions"), (None, "gave NoneType None for 4"),
                           ({"a": 1.0}, "gave dict"), ([0.0], "gave 1 values for 4"),
                           (["good"] * 4, "gave str 'good' for completion 0"), ([[0.5]] * 4, r"gave list \[0.5\] for completion 0"),
                           (torch.zeros(4, 2), "gave Tensor tensor\\(\\[0., 0.\\]\\) for completion 0")):
        with pytest.raises(ValueError, match=rf"^reward function 'judge' {message}"):
            tiny_trainer(reward_funcs=returns(value)).train()
    for value in (np.zeros(4, dtype=np.float32), torch.ones(4), [True, None, 1, np.float64(0.5)],
                  np.array(["yes", "no", "yes", "no"]) == "yes", np.ones((4, 1))):  # numpy bools; one value a row
        assert len(tiny_trainer(reward_funcs=returns(value)).train()) == 1
    # an unscored completion's reward is null in the rollout rows (completions.jsonl), as the metrics leave it out
    trainer = tiny_trainer(reward_funcs=returns([1.0, None, 1.0, None]))
    record = trainer.train()[0]
    assert record["reward"] == 1.0 and [r["reward"] for r in trainer.last_rollout] == [1.0, None, 1.0, None]
    with pytest.raises(ValueError, match="reward_funcs must be a function .* got str 'abc'"):
        tiny_trainer(reward_funcs="abc")
    base = tiny_trainer()
    for weights, shown in ((["x"], r"\['x'\]"), ([True], r"\[True\]")):  # a flag is no weight of 1
        with pytest.raises(ValueError, match=rf"^reward_weights must be finite numbers, got {shown}"):
            GRPOTrainer(base.model, [PromptItem("P", "Q:")] * 2, base.cfg, says_yes, reward_weights=weights)
    assert GRPOTrainer(base.model, [PromptItem("P", "Q:")] * 2, base.cfg, says_yes, reward_weights=[1]).reward_weights == [1.0]
    with pytest.raises(ValueError, match=r"prompt 1: task 'math', which task_weights \{'P': 1.0\} does not name; give "
                                         r"it a weight \(0 leaves it out\) or set task_weights=None"):
        tiny_trainer(items=[PromptItem("P", "Q: 1 A:"), PromptItem("math", "1+1=")], task_weights={"P": 1.0})
    # items as a generator are read once (the sampler read it empty: "the items list is empty"); others are named
    assert tiny_trainer(items=(PromptItem("P", f"Q: {k} A:") for k in range(2))).train()
    for items, message in ((["Q: 1 A:"], r"items\[0\] is a str, not a PromptItem"),
                           ([PromptItem("P", "Q:"), {"task": "P", "prompt": "x"}], r"items\[1\] is a dict")):
        with pytest.raises(ValueError, match=message):
            tiny_trainer(items=items)
    bare = tiny_trainer()  # a plain GPT-2 directory's model has no prompt prefix: an empty prompt is nothing
    bare.model.prompt_prefix = ""
    with pytest.raises(ValueError, match=r"items\[0\]: the prompt is empty"):
        GRPOTrainer(bare.model, [PromptItem("P", "")] * 2, bare.cfg, says_yes)
    with pytest.raises(ValueError, match="task_weights gives 'A' a share of 0.5, but no prompt is of that task"):
        tiny_trainer(task_weights={"P": 0.5, "A": 0.5})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tiny_trainer(reward_funcs=returns([float("nan"), None, None, None])).train()
    assert any("no reward to learn from" in str(w.message) for w in caught)


def test_reward_metric_names_are_unique_and_stable_and_num_tokens_counts_as_trls(tmp_path):
    """Two lambdas log as <lambda> and <lambda>_2, a partial under its function's name (no address that
    changes every run); num_tokens is TRL's: the prompt and completion tokens of every step so far,
    carried across a resume."""
    import functools

    from rookworld_lib.core.tokenizer import encode

    def score(prompts, completions, k=1, **_):
        return [float(k)] * len(completions)

    class Judge:
        def __call__(self, prompts, completions, **_):
            return [0.5] * len(completions)

    funcs = [lambda completions, **_: [0.0] * len(completions), lambda completions, **_: [1.0] * len(completions),
             functools.partial(score, k=2), functools.partial(Judge())]
    trainer = tiny_trainer(tmp_path, reward_funcs=funcs, steps=2)
    first = trainer.train(until=1)[-1]
    assert {"rewards/<lambda>/mean", "rewards/<lambda>_2/mean", "rewards/score/mean", "rewards/Judge/mean"} <= set(first)
    prompt = len(encode(trainer.model.prompt_prefix + "Q: 1 A:"))  # the model's prefix (<|endoftext|>) first
    assert first["num_tokens"] == 4 * prompt + int(trainer.last_batch.mask.sum())
    resumed = tiny_trainer(tmp_path, reward_funcs=funcs, steps=2)
    second = resumed.train()[-1]
    assert second["num_tokens"] == first["num_tokens"] + 4 * prompt + int(resumed.last_batch.mask.sum())


def test_a_resume_names_a_changed_reward_function_or_model_shape(tmp_path):
    import dataclasses

    import pytest

    from rookworld_lib.core.model import GPT, GPTConfig

    tiny_trainer(tmp_path).train()
    with pytest.raises(ValueError, match=r"other settings \(reward_funcs: 'says_yes x1' -> '<lambda> x1'\)"):
        tiny_trainer(tmp_path, reward_funcs=lambda completions, **_: [0.0] * len(completions), steps=2)
    with pytest.raises(ValueError, match=r"other settings \(model.n_embd: 64 -> 128\)"):
        GRPOTrainer(GPT(GPTConfig.preset("tiny", block_size=32, n_embd=128)), [PromptItem("P", "Q: 1 A:")] * 2,
                    dataclasses.replace(tiny_trainer(tmp_path).cfg, steps=2),
                    reward_funcs=says_yes)
    assert tiny_trainer(tmp_path, steps=2).resumed_from is not None  # the same functions and shape resume


def test_an_old_trainer_called_again_refuses_to_cut_back_a_later_runs_logs(tmp_path):
    """A notebook cell run again on a trainer another run has overtaken (or on one made before another
    run saved) would reopen the logs at its own step: it is refused, and every record stays."""
    import pytest

    old = tiny_trainer(tmp_path, steps=2)
    old.train()
    tiny_trainer(tmp_path, steps=3).train()  # a later run continues the same out_dir to step 3
    with pytest.raises(ValueError, match="another run saved step_00000003.pt there after this trainer left step_00000002.pt"):
        old.train()
    made_early = tiny_trainer(tmp_path / "b")
    tiny_trainer(tmp_path / "b").train()
    with pytest.raises(ValueError, match="after this trainer was made"):
        made_early.train()
    steps = [json.loads(line)["step"] for line in (tmp_path / "grpo_metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3] and len((tmp_path / "b" / "grpo_metrics.jsonl").read_text().splitlines()) == 1


def test_ctrl_c_or_sigterm_ends_the_step_saves_and_the_same_run_resumes_there(tmp_path):
    """Ctrl-C (or SIGTERM) mid-run: the step under way ends, a checkpoint is saved although the run
    saves only where it stops (checkpoint_interval 0), KeyboardInterrupt reaches the caller, and a new
    trainer resumes at that step with every metrics line kept. A second Ctrl-C stops at once. The
    process's own handlers are back afterwards."""
    import os
    import signal

    import pytest

    from rookworld_lib.core import checkpoint as ck

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a Python started in a terminal
    try:
        for signum, at in ((signal.SIGINT, 2), (signal.SIGTERM, 3)):
            out = tmp_path / signum.name
            trainer = tiny_trainer(out, steps=50)
            trainer.on_step = lambda record: record["step"] == at and os.kill(os.getpid(), signum)
            with pytest.raises(KeyboardInterrupt):
                trainer.train()
            assert [s for s, _ in ck.list_checkpoints(out / "checkpoints")] == [at]
            assert len((out / "grpo_metrics.jsonl").read_text().splitlines()) == at
            assert tiny_trainer(out, steps=50).step == at
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

        # in the run's last step: the run ends (saved), and the caller is still told to stop
        last = tiny_trainer(tmp_path / "last", steps=3)
        last.on_step = lambda record: record["step"] == 3 and os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            last.train()
        assert [s for s, _ in ck.list_checkpoints(tmp_path / "last" / "checkpoints")] == [3]
        # a shutdown's SIGINT then SIGTERM (jupyter's, a scheduler's): the SIGTERM only adds to the request.
        # The process's own SIGTERM handler records what reaches it: a trainer that gave SIGTERM back on the
        # first signal fails here, instead of ending this process with SIG_DFL.
        reached_the_process = []
        signal.signal(signal.SIGTERM, lambda signum, frame: reached_the_process.append(signum))
        both = tiny_trainer(tmp_path / "both", steps=50)
        both.on_step = lambda record: record["step"] == 2 and (os.kill(os.getpid(), signal.SIGINT),
                                                                os.kill(os.getpid(), signal.SIGTERM))
        with pytest.raises(KeyboardInterrupt):
            both.train()
        assert [s for s, _ in ck.list_checkpoints(tmp_path / "both" / "checkpoints")] == [2]
        assert reached_the_process == [], "the SIGTERM after a Ctrl-C left the trainer's handler"

        def twice(record):
            if record["step"] == 2:
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)  # the second: KeyboardInterrupt here, mid-step 2's bookkeeping
        trainer = tiny_trainer(tmp_path / "twice", steps=50)
        trainer.on_step = twice
        with pytest.raises(KeyboardInterrupt):
            trainer.train()
        assert ck.list_checkpoints(tmp_path / "twice" / "checkpoints") == []  # stopped at once: nothing saved
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_an_ignored_sigint_stays_ignored_and_training_off_the_main_thread_leaves_handlers_alone():
    """Under `nohup` or `&` a shell starts the process with SIGINT ignored: training must not take it over
    (a Ctrl-C meant for the shell would stop the run) and leaves it ignored after; SIGTERM still asks for a
    save. On a thread other than the main one (a notebook's background run) no handler can be set, so the
    process's handlers stay exactly as they were while it trains."""
    import signal
    import threading

    seen = []
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        trainer = tiny_trainer(steps=1)
        trainer.on_step = lambda record: seen.append((signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)))
        trainer.train()
        assert seen[0][0] is signal.SIG_IGN and seen[0][1] not in (signal.SIG_DFL, signal.SIG_IGN), seen
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

        signal.signal(signal.SIGINT, signal.default_int_handler)
        seen.clear()
        trainer = tiny_trainer(steps=1)
        trainer.on_step = lambda record: seen.append((signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)))
        worker = threading.Thread(target=trainer.train)
        worker.start()
        worker.join(60)
        assert seen == [(signal.default_int_handler, signal.SIG_DFL)], seen
    finally:
        signal.signal(signal.SIGINT, previous)


def test_task_weights_mix_any_named_tasks_in_grpo_prompts_and_sft_samples():
    """The core mixes tasks by name, not by chess's P:/A: tags. GRPO gives each task its share of the
    prompts over the run, within one prompt of it at every step, however few prompts a step has (a
    0.1 task among 4 prompts a step is drawn, not rounded away); where a step's share is whole it gets
    exactly that; a weight of 0 leaves a task out; None draws from one pool. SFT's stream draws each
    sample's task with those odds (a binomial 5-sigma band over 4,000 samples)."""
    import random

    import numpy as np

    from rookworld_lib.core.train_grpo import PromptSampler
    from rookworld_lib.core.train_sft import PackedStream

    items = [PromptItem(t, f"{t}: {i}") for t in ("sum", "sort", "copy") for i in range(5)]
    sampler = PromptSampler(items, {"sum": 2, "sort": 1, "copy": 1}, seed=0)
    assert sampler.counts(8) == {"sum": 4, "sort": 2, "copy": 2} and sampler.tasks == ["sum", "sort", "copy"]
    assert [i.task for i in sampler.draw(8)] == ["sum"] * 4 + ["sort"] * 2 + ["copy"] * 2
    assert PromptSampler(items, {"sum": 1, "sort": 0, "copy": 1}, seed=0).counts(6) == {"sum": 3, "sort": 0, "copy": 3}
    rng = random.Random(0)
    for _ in range(300):
        f, n = rng.choice([0.1, 0.25, 0.5, 0.75, 1.0, rng.random()]), rng.randint(1, 33)
        sampler, drawn = PromptSampler(items[:10], {"sum": f, "sort": 1 - f}, seed=0), 0
        for step in range(1, 21):
            counts = sampler.counts(n)
            assert sum(counts.values()) == n
            drawn += counts["sum"]
            assert abs(drawn - step * n * f) < 1 + 1e-9, (f, n, step, drawn)
            if (n * f).is_integer():
                assert counts["sum"] == n * f, (f, n)
    # the credit is part of the state: restored mid-run, a sampler draws as one that never stopped
    straight, paused = (PromptSampler(items[:10], {"sum": 0.7, "sort": 0.3}, seed=0) for _ in range(2))
    for _ in range(3):
        straight.draw(4), paused.draw(4)
    resumed = PromptSampler(items[:10], {"sum": 0.7, "sort": 0.3}, seed=0)
    resumed.load_state_dict(paused.state_dict())
    assert [[i.prompt for i in straight.draw(4)] for _ in range(10)] == [[i.prompt for i in resumed.draw(4)] for _ in range(10)]
    rare = PromptSampler(items[:10], {"sum": 0.9, "sort": 0.1}, seed=0)
    assert sum(rare.counts(4)["sort"] for _ in range(10)) == 4  # 40 prompts, 4 of the 0.1 task
    one_pool = PromptSampler(items, None, seed=0)
    assert one_pool.tasks == ["sum", "sort", "copy"] and len(set(i.prompt for i in one_pool.draw(15))) == 15

    texts = [f"{t}: {i} {'x' * (i % 7)}" for t in ("sum", "sort", "copy") for i in range(40)]
    stream = PackedStream(texts, seed=1, task_weights={"sum": 0.6, "sort": 0.3, "copy": 0.1})
    n = 4000
    drawn = np.bincount([stream._pool_of(k) for k in range(n)], minlength=3) / n
    for share, want in zip(drawn, (0.6, 0.3, 0.1)):
        assert abs(share - want) < 5 * (want * (1 - want) / n) ** 0.5, drawn


def test_sft_task_weights_shape_the_val_stream_and_name_an_untagged_sample_where_the_user_put_it(tmp_path):
    """A task of weight 0 is left out of the val loss as it is of training (the val texts held out of
    the train texts hold it too); a sample with no task tag is named by its index in the texts given,
    before any val split, whether it would land in train or val."""
    import numpy as np
    import pytest

    from rookworld_lib.core.train_sft import SFTTrainer

    texts = [f"S: {i}+{i} = {2 * i}" for i in range(100)] + [f"R: {'ab' * (i % 5 + 1)} = ba" for i in range(100)]
    cfg = SFTConfig(model="tiny", model_overrides={"block_size": 32}, block_size=32, batch_size=2, max_steps=1,
                    warmup_steps=0, val_fraction=0.2, eval_interval=1, eval_steps=1, progress=False, report_to="none",
                    export_hf=False, out_dir=str(tmp_path / "run"), task_weights={"S": 1.0, "R": 0.0})
    val = SFTTrainer(cfg, train_texts=texts).val_stream
    assert val.task_weights == {"S": 1.0, "R": 0.0}
    assert set(np.bincount([val._pool_of(k) for k in range(2000)], minlength=2)[1:]) == {0}  # never an R: sample
    for where in (0, 151, 199):
        bad = texts[:where] + ["hello world"] + texts[where + 1:]
        with pytest.raises(ValueError, match=rf"^train sample {where} starts with 'hello world': with task_weights set, "
                                             r"every sample must start with 'S: ' or 'R: ' \(give its task a weight"):
            SFTTrainer(cfg, train_texts=bad)


def test_a_resume_past_the_steps_a_run_is_set_to_is_refused_not_a_silent_no_op(tmp_path):
    import pytest

    tiny_trainer(tmp_path, steps=3).train()
    with pytest.raises(ValueError, match=r"step_00000003.pt is at step 3, past the 2 steps this GRPO run is set to: "
                                         "nothing to train; set more steps"):
        tiny_trainer(tmp_path, steps=2)
    assert tiny_trainer(tmp_path, steps=3).train() == []  # the same length: done, nothing to add


def test_prompt_items_and_task_names_are_checked_where_they_are_made():
    import pytest

    with pytest.raises(ValueError, match=r"PromptItem.task must be a non-empty name without a trailing colon \('P', for prompts 'P: \.\.\.'\), got ''"):
        PromptItem("", "Q: 1 A:")
    with pytest.raises(ValueError, match="PromptItem.prompt must be text, got int 123"):
        PromptItem("sum", 123)
    with pytest.raises(ValueError, match=r"GRPOTrainConfig.task_weights must name each task by its tag without the colon "
                                         r"\('S' for samples 'S: ...'\), not 'S:'"):
        GRPOTrainConfig(task_weights={"S:": 1.0})


def test_grpo_writes_its_export_at_the_end_as_sft_does_and_help_lists_every_field(tmp_path):
    import dataclasses

    from rookworld_lib.core.model import GPT
    from rookworld_lib.core.train_grpo import GRPOTrainConfig as Config

    trainer = tiny_trainer(tmp_path / "a", steps=2)
    trainer.train()
    back = GPT.from_pretrained(tmp_path / "a" / "final")  # the trained weights, as train() left them
    assert all(torch_equal(a, b) for a, b in zip(trainer.model.parameters(), back.parameters()))
    tiny_trainer(tmp_path / "b", export_hf=False).train()
    assert not (tmp_path / "b" / "final").exists()
    for cls in (Config, SFTConfig):  # help(Config): each field, its type, default and help text
        assert all(f"\n    {f.name} (" in cls.__doc__ for f in dataclasses.fields(cls))
    assert "task_weights (dict[str, float] | None = None): each task's share" in Config.__doc__


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a.detach().cpu(), b.detach().cpu())


def test_a_resume_keeps_the_runs_own_start_and_refuses_a_checkpoint_from_before_task_weights(tmp_path):
    """Resumed once with its latest weights (a notebook re-running its cell on the model trained in
    place), a run still knows where it started: its first model resumes it later too. A checkpoint
    written before task_weights (its config has policy_fraction) is refused in one line saying so."""
    import pytest

    from rookworld_lib.core import checkpoint as ck

    def parity(completions, **_):  # varied within a group: every step moves the weights
        return [float(len(c) % 2) for c in completions]

    settings = dict(steps=3, group_size=8, max_new_tokens=6, lr=1e-2, reward_funcs=parity)
    first = tiny_trainer(tmp_path, **settings)
    first.train(until=1)
    assert ck.weights_fingerprint(first.model) != first.start_weights  # trained in place
    again = GRPOTrainer(first.model, [PromptItem("P", "Q: 1 A:")] * 2, first.cfg, reward_funcs=parity)
    assert again.resumed_from is not None
    again.train(until=2)
    assert tiny_trainer(tmp_path, **settings).resumed_from is not None  # the run's first model (seeded alike)
    state = ck.load_checkpoint(ck.latest_checkpoint(tmp_path / "checkpoints"))
    config = {k: v for k, v in state["config"].items() if k != "task_weights"} | {"policy_fraction": 0.5}
    ck.save_checkpoint(tmp_path / "checkpoints", {**state, "config": config, "step": state["step"] + 1})
    with pytest.raises(ValueError, match=r"step_00000003.pt was written before task_weights replaced policy_fraction"):
        tiny_trainer(tmp_path, **{**settings, "steps": 4})


def test_reward_functions_get_trls_completion_ids_beside_the_text():
    """completion_ids, as TRL passes them: each completion's GPT-2 token ids, the end token included
    where the completion ended; the text is those ids decoded without it."""
    from rookworld_lib.core.tokenizer import EOT_ID, get_tokenizer

    seen = []

    def looks(prompts, completions, completion_ids, **_):
        seen.extend(zip(completions, completion_ids))
        return [0.0] * len(completions)

    tiny_trainer(reward_funcs=looks, max_new_tokens=4).train()
    tok = get_tokenizer()
    assert len(seen) == 4
    for text, ids in seen:
        assert tok.decode(ids[:-1] if ids[-1] == EOT_ID else ids) == text and 1 <= len(ids) <= 4


def test_a_data_sets_columns_reach_the_reward_functions_by_name_as_trl_passes_them():
    """TRL hands every data-set column to each reward function by its name, one value per completion: an
    accuracy(prompts, completions, answer, **kwargs) written for TRL failed here after the first rollout with a
    bare TypeError (kwargs["answer"]: a bare KeyError), and PromptItem had no place for the column. It now
    takes `columns`; a function that requires a column no prompt gives is refused before any rollout, naming
    it; an item without a column another has gives None there."""
    import pytest

    seen = []

    def accuracy(prompts, completions, answer, **kwargs):
        seen.extend(zip(prompts, answer, kwargs["level"]))
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

    items = [PromptItem("P", "Q: 1 A:", columns={"answer": "1", "level": 1}), PromptItem("P", "Q: 2 A:", columns={"answer": "2"})]
    record = tiny_trainer(reward_funcs=accuracy, items=items, prompts_per_step=2).train()[0]
    want = {("Q: 1 A:", "1", 1), ("Q: 2 A:", "2", None)}  # each completion's own row (a group repeats its prompt's)
    assert len(seen) == 4 and set(seen) == want and seen[0] == seen[1] and seen[2] == seen[3]
    assert "rewards/accuracy/mean" in record
    with pytest.raises(ValueError, match=r"^reward function 'accuracy' requires 'answer', which no prompt gives: a data "
                                         r"set's column reaches it as PromptItem\(\.\.\., columns=\{'answer': \.\.\.\}\) \(the "
                                         r"columns given: task, truth, completion_ids, trainer_state\)$"):
        tiny_trainer(reward_funcs=accuracy)
    for columns, message in (({"truth": 1}, "'truth' cannot be a column's name"), ({"a b": 1}, "'a b' cannot be"),
                             ([("answer", 1)], "must be a mapping")):
        with pytest.raises(ValueError, match=rf"^PromptItem\.columns(:)? {message}"):
            PromptItem("P", "Q:", columns=columns)


def test_a_reward_function_that_scores_nothing_in_a_step_logs_null_and_trainer_state_counts_grpo_steps(tmp_path):
    """The README promises rewards/<function>/mean and /std for every function each step: one that gave None
    for every completion had neither (TRL logs nanmean's NaN); here null in the metrics file. trainer_state
    counts the GRPO steps done before the rollout, out of the run's steps (its docstring said optimizer
    steps, which a step of mu=2 passes over 2 minibatches makes 4 of)."""
    from rookworld_lib.core.train_grpo import METRICS_FILE
    from rookworld_lib.core.train_utils import read_metrics

    states = []

    def never(prompts, completions, trainer_state, **_):
        states.append((trainer_state.global_step, trainer_state.max_steps))
        return [None] * len(completions)

    trainer = tiny_trainer(tmp_path, reward_funcs=[says_yes, never], steps=2, mu=2, minibatch_size=2)
    assert len(trainer.train()) == 2 and states == [(0, 2), (1, 2)]
    for written in read_metrics(tmp_path / METRICS_FILE):
        assert written["rewards/never/mean"] is None and written["rewards/never/std"] is None
        assert isinstance(written["rewards/says_yes/mean"], float)


def test_a_prompt_too_long_for_the_model_is_named_by_its_index_and_text():
    import pytest

    items = [PromptItem("P", "Q: 1 A:"), PromptItem("P", "Q: " + "1 " * 40 + "A:"), PromptItem("P", "Q: 2 A:")]
    with pytest.raises(ValueError, match=r"^the longest prompt \(4\d tokens: items\[1\], 'Q: 1 1 1 [1 ]*\.\.\.\) is "
                                         r"longer than the model's block_size 32"):
        tiny_trainer(items=items)


def test_ranks_that_see_different_latest_checkpoints_are_refused_naming_both(tmp_path, monkeypatch):
    """Under torchrun every rank must resume from the same checkpoint: where out_dir is not on a shared
    filesystem, rank 1 finds another latest file than rank 0 (here none, while rank 0 broadcasts
    step_00000004.pt) and the run is refused naming both; ranks that agree start fresh."""
    import re

    import pytest

    from rookworld_lib.core import distributed

    trainer = tiny_trainer(tmp_path)
    trainer.dist = distributed.DistInfo(rank=1, world_size=2)
    rank_0_says = iter([None, "step_00000004.pt"])  # out_dir is not busy; its latest checkpoint
    monkeypatch.setattr(distributed, "broadcast_object", lambda obj, src=0: next(rank_0_says))
    with pytest.raises(ValueError, match=rf"^rank 1 sees latest checkpoint None in {re.escape(str(tmp_path / 'checkpoints'))}, rank 0 "
                                         r"sees step_00000004\.pt: under torchrun out_dir must be on a filesystem that "
                                         r"every node shares$"):
        trainer.find_checkpoint()
    monkeypatch.setattr(distributed, "broadcast_object", lambda obj, src=0: obj)  # rank 0 sees none either
    assert trainer.find_checkpoint() is None


def test_the_trainers_loss_takes_the_samplers_budget_and_temperature():
    """The loss's copies of the sampler's settings are the sampler's (TRL has one field for each): dr_grpo's
    constant is max_new_tokens, whatever loss.max_completion_length says (512, TRL's default, made a step
    128 times smaller at a budget of 4, silently), as the temperature already was; the budget is taken also
    where the temperatures already agree."""
    grads = []
    for length in (4, 512):
        trainer = tiny_trainer(max_new_tokens=4, temperature=0.7,
                               loss=grpo.GRPOConfig(loss_type="dr_grpo", max_completion_length=length, beta=0.0),
                               reward_funcs=lambda completions, **_: [float(len(c)) for c in completions])
        assert (trainer.cfg.loss.max_completion_length, trainer.cfg.loss.temperature) == (4, 0.7)
        grads.append(trainer.train()[0]["grad_norm"])
    assert grads[0] == grads[1]
    agreed = tiny_trainer(max_new_tokens=4, temperature=1.0,
                          loss=grpo.GRPOConfig(loss_type="dr_grpo", max_completion_length=512, temperature=1.0, beta=0.0))
    assert (agreed.cfg.loss.max_completion_length, agreed.cfg.loss.temperature) == (4, 1.0)


def test_a_grpo_config_is_frozen_as_the_other_configs():
    """cfg.group_size = 1 after construction bypassed every check (a run that trained nothing, silently);
    GRPOTrainConfig is frozen as SFTConfig and GRPOConfig are: dataclasses.replace checks the new value."""
    import dataclasses

    import pytest

    cfg = tiny_trainer().cfg
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.group_size = 1
    with pytest.raises(ValueError, match="GRPOTrainConfig.group_size must be an integer >= 2"):
        dataclasses.replace(cfg, group_size=1)


def test_a_grpo_run_takes_every_seed_its_config_allows():
    """GRPOTrainConfig.seed goes to 2**32 - 1, but a chunk's sampling seed (seed * 1,000,003 + step, times
    10,007) passed torch's 2**64 from seed 1.8e9 on: the first step died in torch.Generator.manual_seed.
    The seed a generator gets is taken mod 2**64 (every smaller one as before)."""
    import pytest

    from rookworld_lib.core.config import SEED_MAX
    from rookworld_lib.core.sampling import SamplingConfig

    assert tiny_trainer(seed=SEED_MAX).train()[0]["step"] == 1
    with pytest.raises(ValueError, match=r"SamplingConfig.seed must be an integer in 0..18446744073709551615"):
        SamplingConfig(seed=2**64)


def test_a_temperature_too_small_to_sample_at_is_refused_by_name():
    """--temperature 1e-45 was accepted: logits / T overflowed to inf, every GRPO loss was NaN, and the run
    stopped after five steps saying "Lower lr"; sampling at it drew from NaN probabilities. Temperatures
    below 0.01 (a greedy draw in all but name) are refused by the field's name, 0 stays greedy."""
    import dataclasses

    import pytest

    from rookworld_lib.core.sampling import MIN_TEMPERATURE, SamplingConfig

    cfg = tiny_trainer().cfg
    for t in (1e-45, 0.009):
        with pytest.raises(ValueError, match=r"GRPOTrainConfig.temperature must be a finite number in \[0.01, inf\), got"):
            dataclasses.replace(cfg, temperature=t)
        with pytest.raises(ValueError, match=r"SamplingConfig.temperature must be 0 \(greedy\) or >= 0.01, got"):
            SamplingConfig(temperature=t)
    assert dataclasses.replace(cfg, temperature=MIN_TEMPERATURE).temperature == SamplingConfig(temperature=0.01).temperature
    assert SamplingConfig(temperature=0).temperature == 0
