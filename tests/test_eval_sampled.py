"""pass@1 beside greedy (issue 26, item 4): every strict metric averaged over k samples per prompt at a
temperature (`EvalConfig.samples`, `sample_temperature`), checked against samples drawn here with
core.sampling.generate and scored here with python-chess and the task parsers.

The model is a tiny one trained in a few seconds over the task vocabulary of six shipped test
records until it nearly knows their answers, then expanded to the full GPT-2 (core.task_vocab):
greedy gets them right, samples at T=1 only sometimes, so per-record pass@1 is fractional."""

import json
import statistics
from collections import Counter
from dataclasses import replace

import chess
import pytest
import torch

from rookworld_lib.chess import data, rewards, tasks
from rookworld_lib.chess import evaluate as ev
from rookworld_lib.core.model import GPT, GPTConfig
from rookworld_lib.core.sampling import SamplingConfig, generate
from rookworld_lib.core.task_vocab import TaskVocab, pin_bias_coordinate
from rookworld_lib.core.tokenizer import EOT_ID, encode_prompt, get_tokenizer

K, T, SEED, BATCH, BUDGET = 4, 1.0, 3, 3, 80  # BATCH: prompts per sampled batch (BATCH * K rows)
CFG = ev.EvalConfig(samples=K, sample_temperature=T, seed=SEED, batch_size=BATCH * K, max_new_tokens=BUDGET,
                    selfplay_games=0)


def trained_model(records, steps: int = 80) -> GPT:
    """A tiny GPT-2 that has nearly memorised the records' answers (SFT-style loss on completions)."""
    tok = get_tokenizer()
    seqs = [(encode_prompt(p, "<|endoftext|>", tok), tok.encode(c) + [EOT_ID])
            for p, c in map(data.record_text, records)]
    vocab = TaskVocab(t for a, b in seqs for t in a + b)
    torch.manual_seed(0)
    model = GPT(vocab.compact_config(GPTConfig.preset("tiny", block_size=192)))
    pin_bias_coordinate(model)
    width = max(len(a) + len(b) for a, b in seqs)
    x, y = torch.full((len(seqs), width), EOT_ID), torch.full((len(seqs), width), -1)
    for i, (a, b) in enumerate(seqs):
        x[i, :len(a) + len(b)] = torch.tensor(a + b)
        y[i, len(a) - 1:len(a) + len(b) - 1] = torch.tensor(b)
    x, y = vocab.compact(x), vocab.compact(y)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for _ in range(steps):
        loss = model(x, targets=y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return vocab.expand(model).eval()


def reference_samples(model: GPT, prompts: list[str], k: int, seed: int) -> list[list[str]]:
    """k completions per prompt, drawn here as evaluate documents it: batches of BATCH prompts, each
    seeded by SEED + its first index, k rows per prompt at T."""
    tok, out = get_tokenizer(), []
    for start in range(0, len(prompts), BATCH):
        ids = [encode_prompt(p, model.prompt_prefix, tok) for p in prompts[start:start + BATCH]]
        assert max(map(len, ids)) + BUDGET <= model.config.block_size  # the budget is not cut
        texts = generate(model, ids, SamplingConfig(max_new_tokens=BUDGET, temperature=T, num_samples=k,
                                                    seed=seed + start)).completions(tok)
        out += [texts[i:i + k] for i in range(0, len(texts), k)]
    return out


def policy_outcomes(rec: dict, text: str) -> dict[str, bool]:
    parse = tasks.parse_policy_completion(text)
    try:
        legal = parse.best is not None and chess.Move.from_uci(parse.best) in chess.Board(rec["fen"]).legal_moves
    except ValueError:  # not UCI at all
        legal = False
    return {"policy/valid": parse.ok, "policy/legal_best_move": legal,
            "policy/best_move_accuracy": parse.best == rec["moves"][0]}


def env_outcomes(rec: dict, text: str) -> dict[str, bool]:
    parse = tasks.parse_env_completion(text)
    return {"env/valid": parse.ok,
            "env/next_fen_exact": parse.new_fen is not None and tasks.same_position(parse.new_fen, rec["new_fen"])}


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    policy, env = data.load_split("P", "test").records[:4], data.load_split("A", "test").records[:2]
    model = trained_model(policy + env)
    calls, scored = [], Counter()
    real_generate, real_score = ev.generate, rewards.score_policy_detailed

    def spy_generate(m, ids, sc):
        rollout = real_generate(m, ids, sc)
        calls.append((len(ids), sc.num_samples, sc.temperature, sc.seed, rollout.tokens.size(0)))
        return rollout

    def spy_score(prompt, text, **kw):
        scored[prompt] += 1
        return real_score(prompt, text, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ev, "generate", spy_generate)
        mp.setattr(rewards, "score_policy_detailed", spy_score)
        results = {**ev.evaluate_policy(model, policy, CFG), **ev.evaluate_environment(model, env, CFG)}
    return model, policy, env, results, calls, scored


def test_k_samples_per_prompt_are_drawn_and_scored(setup):
    model, policy, env, results, calls, scored = setup
    # per suite: greedy batches of batch_size rows (1 row per prompt, T=0: all 4 policy prompts at once),
    # then sampled ones of batch_size // K prompts (K rows per prompt, T, seeded by index)
    assert calls == [(4, 1, 0.0, SEED, 4), (3, K, T, SEED, 3 * K), (1, K, T, SEED + 3, K),
                     (2, 1, 0.0, SEED, 2), (2, K, T, SEED, 2 * K)]
    layout = ev.EvalConfig().for_model(model).layout
    assert scored == {ev.policy_prompt_of(r, layout): 1 + K for r in policy}  # one greedy, K sampled
    for m in ev.SAMPLED_METRICS:
        assert results[m].n == (len(policy) if m.startswith("pass@1/policy") else len(env))
        assert all(x * K == round(x * K) for x in results[m].outcomes)  # shares of K samples


def test_more_samples_than_batch_rows_go_in_batches_of_batch_size(setup, monkeypatch):
    """k > batch_size: a prompt's samples in batches of batch_size rows, each batch seeded apart, in order
    (they went in one batch of k rows: `eval --samples 1000000 --batch-size 4` ran the machine out of
    memory). The first batch of each prompt is the one k <= batch_size would draw at its seed."""
    model, policy, *_ = setup
    prompts = [ev.policy_prompt_of(r, ev.EvalConfig().for_model(model).layout) for r in policy[:2]]
    calls, real_generate = [], ev.generate

    def spy_generate(m, ids, sc):
        calls.append((len(ids), sc.num_samples, sc.seed))
        return real_generate(m, ids, sc)

    monkeypatch.setattr(ev, "generate", spy_generate)
    cfg = replace(CFG, batch_size=2, samples=5)
    texts = ev.complete(model, prompts, cfg, samples=5)
    n = len(prompts)
    assert calls == [(1, 2, SEED), (1, 2, SEED + n), (1, 1, SEED + 2 * n), (1, 2, SEED + 1), (1, 2, SEED + 1 + n),
                     (1, 1, SEED + 1 + 2 * n)]  # never more than batch_size rows
    assert len(texts) == 5 * n and texts == ev.complete(model, prompts, cfg, samples=5)  # seeded: the same again
    for i, prompt in enumerate(prompts):  # prompt i's samples are items 5i..5i+4; their first two, seed SEED + i's
        first = real_generate(model, [encode_prompt(prompt, model.prompt_prefix, get_tokenizer())],
                              SamplingConfig(max_new_tokens=BUDGET, temperature=T, num_samples=2, seed=SEED + i))
        assert texts[5 * i:5 * i + 2] == first.completions(get_tokenizer())


def test_pass_at_1_is_the_mean_of_independently_scored_samples(setup):
    model, policy, env, results, _, _ = setup
    layout = ev.EvalConfig().for_model(model).layout
    for records, prompt_of, outcomes_of in ((policy, ev.policy_prompt_of, policy_outcomes),
                                            (env, ev.env_prompt_of, env_outcomes)):
        samples = reference_samples(model, [prompt_of(r, layout) for r in records], K, SEED)
        assert [len(s) for s in samples] == [K] * len(records)
        per_sample = [[outcomes_of(r, text) for text in s] for r, s in zip(records, samples)]
        for m in per_sample[0][0]:
            shares = tuple(sum(o[m] for o in sample) / K for sample in per_sample)
            got = results[ev.sampled_name(m)]
            assert got.outcomes == pytest.approx(shares), m
            assert got.value == pytest.approx(sum(shares) / len(shares)), m
            assert got.low <= got.value <= got.high
    # the check is not 0 == 0: the model is right on some samples and wrong on others
    assert any(0 < x < 1 for m in ev.SAMPLED_METRICS for x in results[m].outcomes)
    # and greedy differs from pass@1 here (greedy repeats the memorised answer)
    assert any(results[m].value != results[ev.sampled_name(m)].value for m in ev.STRICT_METRICS)


def test_samples_are_deterministic_given_the_seed(setup):
    model, policy, _, _, _, _ = setup
    prompts = [ev.policy_prompt_of(r, ev.EvalConfig().for_model(model).layout) for r in policy]
    texts = ev.complete(model, prompts, CFG, samples=K)  # drawn again: the same K samples per prompt
    assert [texts[i:i + K] for i in range(0, len(texts), K)] == reference_samples(model, prompts, K, SEED)
    assert ev.complete(model, prompts, replace(CFG, seed=SEED + 1), samples=K) != texts


def test_samples_0_leaves_greedy_results_as_they_were(setup):
    model, policy, env, results, _, _ = setup
    greedy_cfg = ev.EvalConfig(seed=SEED, batch_size=BATCH * K, max_new_tokens=BUDGET, selfplay_games=0, samples=0,
                               sample_temperature=T)
    assert greedy_cfg == replace(CFG, samples=0)  # greedy only (the default samples 4 beside greedy)
    greedy = {**ev.evaluate_policy(model, policy, greedy_cfg), **ev.evaluate_environment(model, env, greedy_cfg)}
    assert not any(m.startswith(ev.SAMPLED_PREFIX) for m in greedy)
    assert set(results) == set(greedy) | set(ev.SAMPLED_METRICS)
    for m, e in greedy.items():  # every greedy key the same, outcomes included
        assert (e, e.outcomes) == (results[m], results[m].outcomes), m
    # and as before this change: argmax completions, scored as given
    tok = get_tokenizer()
    layout = greedy_cfg.for_model(model).layout
    texts = generate(model, [encode_prompt(ev.policy_prompt_of(r, layout), model.prompt_prefix, tok) for r in policy],
                     SamplingConfig(max_new_tokens=BUDGET, temperature=0.0)).completions(tok)
    given = ev.evaluate_policy(None, policy, greedy_cfg, completions=texts)
    assert {m: (e, e.outcomes) for m, e in given.items()} == {m: (greedy[m], greedy[m].outcomes) for m in given}


def test_paired_change_on_sampled_metrics(setup):
    model, policy, _, results, _, _ = setup
    after = ev.evaluate_policy(model, policy, replace(CFG, sample_temperature=0.5))
    table = ev.paired_change(results, after)  # greedy rows, then pass@1 rows, of what both measured
    assert list(table.index) == [m for m in ev.STRICT_METRICS + ev.SAMPLED_METRICS if "policy" in m]
    for m in table.index[3:]:
        diff = ev.paired_difference(results[m].outcomes, after[m].outcomes)
        mean = sum(a - b for a, b in zip(after[m].outcomes, results[m].outcomes)) / results[m].n
        assert diff.value == pytest.approx(mean)
        assert table.loc[m, "change (points)"] == f"{100 * diff.value:+.1f} [{100 * diff.low:+.1f}, {100 * diff.high:+.1f}]"
    for m in table.index[:3]:  # greedy does not depend on the sampling temperature
        assert table.loc[m, "change (points)"].startswith("+0.0 [-") and table.loc[m, "moved"] == "no resolved change"
    assert list(ev.paired_change(results, after, ev.SAMPLED_METRICS).index) == list(table.index[3:])


def test_paired_change_of_fractional_outcomes_by_hand():
    n = 100
    before = {"pass@1/policy/valid": ev.pass_at_1([[1, 0, 0, 0]] * n)}  # 25% on every record
    after = {"pass@1/policy/valid": ev.pass_at_1([[1, 1, 1, 0]] * (n // 2) + [[1, 0, 0, 0]] * (n // 2))}
    row = ev.paired_change(before, after).loc["pass@1/policy/valid"]
    assert row["change (points)"].startswith("+25.0 [") and row["moved"] == "up"
    # a paired mean difference of shares with a Student t interval (t(3, 0.975) = 3.182)
    before, after = [0.25, 0.5, 0.0, 1.0], [0.5, 0.5, 0.25, 0.75]
    diffs = [a - b for a, b in zip(after, before)]
    d = ev.paired_difference(before, after)
    assert d.value == pytest.approx(statistics.mean(diffs)) and d.n == 4 and d.kind == "mean"
    assert d.high - d.value == pytest.approx(3.182446 * statistics.stdev(diffs) / 2, abs=1e-6)


def test_a_pass_at_1_change_is_a_t_interval_even_where_every_share_is_whole():
    """Shares that happen to be 0 or 1 (every record's samples agree) are still shares: paired_change gives
    pass@1 the t interval, a greedy rate Newcombe's; paired_difference alone goes by the values."""
    b, a = [[0, 0], [1, 1], [0, 0], [0, 0]], [[1, 1], [1, 1], [1, 1], [0, 0]]
    before, after = {"pass@1/policy/valid": ev.pass_at_1(b)}, {"pass@1/policy/valid": ev.pass_at_1(a)}
    t = ev.paired_difference([0, 1, 0, 0], [1, 1, 1, 0], binary=False)
    assert ev.paired_estimates(before["pass@1/policy/valid"], after["pass@1/policy/valid"], "pass@1/policy/valid") == t
    assert ev.paired_difference([0, 1, 0, 0], [1, 1, 1, 0]) == ev.newcombe_paired([0, 1, 0, 0], [1, 1, 1, 0])
    assert t.low < ev.newcombe_paired([0, 1, 0, 0], [1, 1, 1, 0]).low
    # none right before or after (pass@1 of exact next positions): not a point at 0, the records' interval
    none = ev.paired_difference([0.0] * 672, [0.0] * 672, binary=False)
    assert none.value == 0 and none.low < 0 < none.high and none == ev.newcombe_paired([0] * 672, [0] * 672)


def test_pass_at_1_estimate():
    e = ev.pass_at_1([[1, 0, 0, 0], [True, True, True, True], [0, 0, 0, 0]])
    assert e.outcomes == (0.25, 1.0, 0.0) and e.value == pytest.approx(1.25 / 3) and e.n == 3
    w = ev.wilson(1.25, 3)
    assert (e.low, e.high, e.kind) == (w.low, w.high, "rate") and 0 < e.low < e.value < e.high < 1
    assert str(e).startswith("41.7% [")
    assert ev.sampled_name("env/valid") == "pass@1/env/valid" and len(ev.SAMPLED_METRICS) == len(ev.STRICT_METRICS)


def test_curve_rows_carry_pass_at_1_when_measured(setup):
    _, _, _, results, _, _ = setup
    row = ev.curve_point([], 0, results)
    assert all(m in row for m in ev.STRICT_METRICS + ev.SAMPLED_METRICS)
    assert list(ev.curve_table([row]).columns[-10:]) == [f"{m} (%)" for m in ev.STRICT_METRICS + ev.SAMPLED_METRICS]
    greedy_only = {m: results[m] for m in ev.STRICT_METRICS}
    assert not any(m in ev.curve_point([], 0, greedy_only) for m in ev.SAMPLED_METRICS)


def test_config_checks_the_sampling_fields():
    with pytest.raises(ValueError, match="EvalConfig.samples"):
        ev.EvalConfig(samples=-1)
    with pytest.raises(ValueError, match="EvalConfig.sample_temperature"):
        ev.EvalConfig(sample_temperature=0.0)
    assert ev.EvalConfig().samples == 4  # pass@1 beside greedy unless asked for greedy only (samples=0)
    assert ev.EvalConfig(decoding="greedy", temperature=0.0).temperature == 0.0  # unused by greedy decoding
    for t in (0.0, 1e-45, 0.009):  # 1e-45 overflowed logits / T: NaN probabilities, not an error that says why
        with pytest.raises(ValueError, match=r"EvalConfig.temperature must be >= 0.01 for sampled decoding"):
            ev.EvalConfig(decoding="sampled", temperature=t)
        with pytest.raises(ValueError, match=r"EvalConfig.sample_temperature must be a finite number in \[0.01, inf\), got"):
            ev.EvalConfig(sample_temperature=t)
    assert ev.EvalConfig(decoding="sampled", temperature=0.01, sample_temperature=0.01).sample_temperature == 0.01


def test_cli_samples_and_sample_temperature(setup, tmp_path, capsys):
    model, policy, env, _, _, _ = setup
    model.save_pretrained(tmp_path / "model")
    for task, records in (("P", policy), ("A", env)):
        path = data.data_file(task, "test", tmp_path)
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert ev.cli([str(tmp_path / "model"), "--data-dir", str(tmp_path), "--max-policy", "2", "--max-env", "1",
                   "--max-new-tokens", str(BUDGET), "--selfplay-games", "0", "--samples", str(K),
                   "--sample-temperature", "0.7", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {m: out[m]["n"] for m in ev.SAMPLED_METRICS} == {m: 2 if "policy" in m else 1 for m in ev.SAMPLED_METRICS}
    assert "pass@1/policy/valid" in out and "policy/valid" in out
    with pytest.raises(ValueError, match="EvalConfig.samples"):  # before the model loads
        ev.cli([str(tmp_path / "missing"), "--samples", "-2"])


@pytest.mark.parametrize("argv, message", [
    (["--samples", "0", "--sample-temperature", "0.5"], "--sample-temperature has no effect with --samples 0 (greedy "
                                                        "only): give --samples K, or leave it out"),
    (["--temperature", "0.7"], "--temperature has no effect with greedy decoding (the default --decoding): give "
                               "--decoding sampled, or leave it out (pass@1 samples take --sample-temperature)")])
def test_cli_refuses_a_temperature_its_decoding_ignores(argv, message, capsys):
    """`eval --temperature 0.7` evaluated greedily (the decoding it did not ask to change) without a word;
    `--samples 0 --sample-temperature 0.5` dropped the temperature. Both are refused before the model loads, in
    one line and exit status 1, as a config check is (they printed argparse's whole usage text, exit 2)."""
    from rookworld_lib.lab.cli import main

    assert main(["eval", "no-such-model", *argv]) == 1
    assert capsys.readouterr().err == f"rookworld eval: error: {message}\n"
    with pytest.raises(ValueError, match="config.json not found"):  # the same values where they apply: on to the model
        ev.cli(["no-such-model", "--decoding", "sampled", "--temperature", "0.7", "--samples", "2",
                "--sample-temperature", "0.5"])


def test_an_evaluation_samples_pass_at_1_at_the_rollout_temperature_the_export_records(tmp_path):
    """`rookworld eval` reports pass@1 beside greedy by default, sampled at the temperature GRPO's
    rollouts used (recorded in the export's config.json), 1.0 for a model without one; a given one wins."""
    from rookworld_lib.core.train_grpo import ROLLOUT_TEMPERATURE_KEY, GRPOTrainConfig, GRPOTrainer, PromptItem

    assert ev.EvalConfig().samples == 4
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", block_size=64))
    assert ev.EvalConfig().for_model(model).sample_temperature == 1.0
    cfg = GRPOTrainConfig(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=2,
                          temperature=0.3, progress=False, report_to="none", seed=0, out_dir=str(tmp_path / "grpo"))
    trainer = GRPOTrainer(model, [PromptItem("P", "P: 1")] * 2, cfg, reward_funcs=lambda completions, **_: [0.0] * len(completions))
    trainer.train()
    export = trainer.export()
    assert json.loads((export / "config.json").read_text())[ROLLOUT_TEMPERATURE_KEY] == 0.3
    loaded = GPT.from_pretrained(export)
    assert ev.EvalConfig().for_model(loaded).sample_temperature == 0.3
    # an export of the run's checkpoint records it too (it was dropped: pass@1 of that export sampled at 1.0)
    from rookworld_lib.core.checkpoint import export_hf, latest_checkpoint
    again = GPT.from_pretrained(export_hf(latest_checkpoint(tmp_path / "grpo" / "checkpoints"), tmp_path / "ckpt-export"))
    assert again.meta[ROLLOUT_TEMPERATURE_KEY] == 0.3 and ev.EvalConfig().for_model(again).sample_temperature == 0.3
    assert ev.EvalConfig(sample_temperature=0.7).for_model(loaded).sample_temperature == 0.7
    # a bad value in config.json is the file's, named so (it was blamed on --sample-temperature, not given)
    for bad in (0, -1.0, float("nan"), "0.3", True, None):
        loaded.meta[ROLLOUT_TEMPERATURE_KEY] = bad
        with pytest.raises(ev.CheckpointFormatError, match=rf"^{export}/config.json: {ROLLOUT_TEMPERATURE_KEY} must be a "
                                                           r"finite number > 0, got"):
            ev.EvalConfig().for_model(loaded)
        assert ev.EvalConfig(sample_temperature=0.7).for_model(loaded).sample_temperature == 0.7  # given: it wins
    # a completion budget the block cannot hold beside any prompt (it was cut silently, the run printing it)
    with pytest.raises(ValueError, match=r"EvalConfig.max_new_tokens is 64: the model's block_size 64 holds"):
        ev.EvalConfig(max_new_tokens=64).for_model(model)


def test_cli_json_records_its_settings_and_says_a_pass_at_1_temperature_it_chose(setup, tmp_path, capsys):
    """--json held the metrics alone (nothing said how they were measured), and pass@1 of a model that
    records no rollout temperature was sampled at 1.0 with no hint that its GRPO export samples at its own."""
    model, policy, env, _, _, _ = setup
    model.save_pretrained(tmp_path / "model")
    for task, records in (("P", policy), ("A", env)):
        data.data_file(task, "test", tmp_path).write_text("".join(json.dumps(r) + "\n" for r in records))
    assert ev.cli([str(tmp_path / "model"), "--data-dir", str(tmp_path), "--max-policy", "2", "--max-env", "1",
                   "--max-new-tokens", str(BUDGET), "--selfplay-games", "0", "--samples", "2", "--json"]) == 0
    captured = capsys.readouterr()
    settings = json.loads(captured.out.strip().splitlines()[-1])["settings"]
    assert settings["model"] == str(tmp_path / "model") and settings["decoding"] == "greedy"
    assert (settings["samples"], settings["sample_temperature"], settings["max_new_tokens"]) == (2, 1.0, BUDGET)
    assert (settings["max_policy"], settings["max_env"], settings["layout"]) == (2, 1, "compact")
    assert "at T 1 (the model records no rollout temperature: to compare with a GRPO export, give its --sample-temperature)" in captured.err


@pytest.mark.parametrize("argv, message", [
    (["--selfplay-games", "0", "--selfplay-max-plies", "50"], "--selfplay-max-plies has no effect without self-play "
                                                              "(--selfplay-games 0): leave it out"),
    (["--every-checkpoint", "--selfplay-games", "3", "--max-mate", "2"], "--every-checkpoint evaluates the P: and A: suites "
                                                                        "only: --selfplay-games, --max-mate would be ignored"),
    (["--every-checkpoint", "--selfplay-max-plies", "9"], "--selfplay-max-plies has no effect without self-play "
                                                          "(--every-checkpoint runs the P: and A: suites only)")])
def test_cli_refuses_self_play_and_mate_options_nothing_uses(argv, message, capsys):
    from rookworld_lib.lab.cli import main

    assert main(["eval", "no-such-model", *argv]) == 1
    assert message in capsys.readouterr().err


def test_cli_refuses_pass_at_1_options_where_no_p_or_a_suite_runs(tmp_path, capsys):
    """`--max-policy 0 --max-env 0 --samples 8 --sample-temperature 0.5` said "pass@1 over 8 samples at T 0.5"
    and measured none: pass@1 is of the P: and A: suites."""
    from rookworld_lib.lab.cli import main

    assert main(["eval", "no-such-model", "--max-policy", "0", "--max-env", "0", "--samples", "8",
                 "--sample-temperature", "0.5"]) == 1
    assert ("--samples, --sample-temperature: pass@1 is measured on the P: and A: suites, and neither runs here"
            in capsys.readouterr().err)


def test_cli_takes_the_values_that_turn_off_what_a_mode_does_not_run(tmp_path, capsys):
    """`--samples 0` beside no P:/A: suite, `--selfplay-games 0` and `--max-mate 0` beside --every-checkpoint ask
    for what the run does: refused as void, scripts that always pass them broke."""
    from rookworld_lib.lab.cli import main

    assert main(["eval", "no-such-model", "--max-policy", "0", "--max-env", "0", "--samples", "0"]) == 1
    assert "config.json not found" in capsys.readouterr().err  # past the void checks, on to the model
    assert main(["eval", str(tmp_path / "run"), "--every-checkpoint", "--selfplay-games", "0", "--max-mate", "0"]) == 1
    assert "no such folder; --every-checkpoint takes a `rookworld sft` --out" in capsys.readouterr().err
