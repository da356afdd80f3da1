import pytest
import torch

from rookworld_lib.core.model import GPT, GPTConfig
from rookworld_lib.core.sampling import SamplingConfig, filter_logits, generate, sequence_logprobs


def sharp_model(seed=0, **kw):
    """A tiny GPT with a larger init, so its distributions are peaked like a trained model's."""
    torch.manual_seed(seed)
    m = GPT(GPTConfig.preset("tiny", block_size=128, **kw))
    with torch.no_grad():
        m.transformer.wte.weight.mul_(8.0)
    return m.eval()


def mixed_prompts(seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = [3, 11, 7, 1, 16]
    return [torch.randint(0, 50000, (n,), generator=g).tolist() for n in lengths]


def test_cached_logprobs_equal_full_forward_left_padded():
    model = sharp_model()
    prompts = mixed_prompts()
    ro = generate(model, prompts, SamplingConfig(max_new_tokens=20, seed=1))
    with torch.no_grad():
        full = sequence_logprobs(model, ro.prompt_ids, ro.tokens)
    diff = ((full - ro.logprobs) * ro.mask).abs().max().item()
    assert diff <= 1e-4
    assert torch.equal(ro.logprobs, ro.sampling_logprobs)  # no top-k/top-p: same distribution


def test_scoring_attends_to_every_completion_token_the_padding_token_too():
    """sequence_logprobs scores the completion as the model reads the whole text, one causal pass: a
    completion token equal to pad_id (GPT-2's EOT, sampled mid-answer when eos_id is None) is text to
    attend to, as the sampler attended to it, not padding to mask."""
    import torch.nn.functional as F

    from rookworld_lib.core.tokenizer import EOT_ID

    model = sharp_model()
    prompt, completion = [11, 12, 13], [5, EOT_ID, 7, 9, EOT_ID, 4]
    with torch.no_grad():
        ours = sequence_logprobs(model, [prompt], torch.tensor([completion]))
        logits = model(torch.tensor([prompt + completion[:-1]]))  # the plain causal forward, no mask
        want = F.log_softmax(logits[0, len(prompt) - 1:], dim=-1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
    assert torch.allclose(ours[0], want, atol=1e-5), (ours[0], want)


def test_padded_row_equals_unpadded_alone():
    model = sharp_model()
    prompts = mixed_prompts()
    batch = generate(model, prompts, SamplingConfig(max_new_tokens=12, temperature=0))
    for i, p in enumerate(prompts):
        alone = generate(model, [p], SamplingConfig(max_new_tokens=12, temperature=0))
        n = int(alone.mask[0].sum())
        assert batch.tokens[i, :n].tolist() == alone.tokens[0, :n].tolist()
        assert torch.allclose(batch.logprobs[i, :n], alone.logprobs[0, :n], atol=1e-4)


def test_greedy_matches_transformers_generate(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = sharp_model()
    model.save_pretrained(tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    prompts = mixed_prompts()
    ours = generate(model, prompts, SamplingConfig(max_new_tokens=16, temperature=0))
    P = max(map(len, prompts))
    ids = torch.full((len(prompts), P), 50256)
    att = torch.zeros((len(prompts), P), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.tensor(p)
        att[i, P - len(p):] = 1
    with torch.no_grad():
        out = hf.generate(input_ids=ids, attention_mask=att, do_sample=False, max_new_tokens=16,
                          pad_token_id=50256, eos_token_id=50256)
    theirs = out[:, P:]
    for i in range(len(prompts)):
        n = int(ours.mask[i].sum())
        assert ours.tokens[i, :n].tolist() == theirs[i, :n].tolist()


def test_each_row_stops_at_its_own_eos():
    model = sharp_model()
    prompts = mixed_prompts()
    free = generate(model, prompts, SamplingConfig(max_new_tokens=10, temperature=0))
    eos = int(free.tokens[0, 3])  # make row 0's 4th greedy token the end-of-sequence token
    ro = generate(model, prompts, SamplingConfig(max_new_tokens=10, temperature=0, eos_id=eos, pad_id=0))
    for i in range(len(prompts)):
        row = ro.tokens[i].tolist()
        if eos in free.tokens[i].tolist():
            k = free.tokens[i].tolist().index(eos)
            assert ro.mask[i].sum().item() == k + 1  # mask includes the first EOS
            assert ro.finished[i]
            assert all(t == 0 for t in row[k + 1:])  # padding afterwards
            assert not ro.mask[i, k + 1:].any()
            assert (ro.logprobs[i, k + 1:] == 0).all()
        else:
            assert not ro.finished[i] and ro.mask[i].all()
    k0 = free.tokens[0].tolist().index(eos)  # <= 3: the token may already occur earlier
    assert ro.finished[0] and ro.mask[0].sum() == k0 + 1
    assert ro.completion_ids(0) == free.tokens[0, :k0].tolist()
    assert ro.completion_ids(0, keep_eos=True) == free.tokens[0, :k0 + 1].tolist()


def test_seeded_generator_reproducible():
    model = sharp_model()
    prompts = mixed_prompts()
    a = generate(model, prompts, SamplingConfig(max_new_tokens=12, seed=7))
    b = generate(model, prompts, SamplingConfig(max_new_tokens=12, seed=7))
    c = generate(model, prompts, SamplingConfig(max_new_tokens=12, seed=8))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.tokens, c.tokens)


def test_group_layout_and_diversity():
    model = sharp_model()
    prompts = mixed_prompts()[:2]
    ro = generate(model, prompts, SamplingConfig(max_new_tokens=8, num_samples=4, temperature=1.5, seed=0))
    assert ro.tokens.shape[0] == 8 and ro.group_size == 4
    assert ro.prompt_ids == [prompts[0]] * 4 + [prompts[1]] * 4
    assert len({tuple(r) for r in ro.tokens[:4].tolist()}) > 1  # samples within a group differ


def test_top_k_one_and_tiny_top_p_are_greedy():
    model = sharp_model()
    prompts = mixed_prompts()
    greedy = generate(model, prompts, SamplingConfig(max_new_tokens=8, temperature=0))
    k1 = generate(model, prompts, SamplingConfig(max_new_tokens=8, top_k=1, seed=3))
    p0 = generate(model, prompts, SamplingConfig(max_new_tokens=8, top_p=1e-6, seed=3))
    assert torch.equal(greedy.tokens, k1.tokens) and torch.equal(greedy.tokens, p0.tokens)
    assert torch.allclose(k1.sampling_logprobs, torch.zeros_like(k1.sampling_logprobs), atol=1e-6)
    assert torch.allclose(k1.logprobs, greedy.logprobs, atol=1e-5)  # full-distribution log-probs


def test_filter_logits_top_p_keeps_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(filter_logits(logits, 0, 0.75))
    assert kept.tolist() == [[True, True, False, False]]
    kept = torch.isfinite(filter_logits(logits, 3, 1.0))
    assert kept.tolist() == [[True, True, True, False]]


def test_sampling_turns_dropout_off_and_restores_mode():
    model = sharp_model(dropout=0.5).train()
    prompts = mixed_prompts()
    a = generate(model, prompts, SamplingConfig(max_new_tokens=8, seed=1))
    b = generate(model, prompts, SamplingConfig(max_new_tokens=8, seed=1))
    assert model.training
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logprobs, b.logprobs)


def test_temperature_logprobs_match_scaled_forward():
    model = sharp_model()
    prompts = mixed_prompts()
    ro = generate(model, prompts, SamplingConfig(max_new_tokens=10, temperature=0.7, seed=2))
    with torch.no_grad():
        full = sequence_logprobs(model, ro.prompt_ids, ro.tokens, temperature=0.7)
    assert ((full - ro.logprobs) * ro.mask).abs().max().item() <= 1e-4


@pytest.mark.parametrize("field,value", [("max_new_tokens", 0), ("temperature", -1.0), ("top_k", -2),
                                         ("top_p", 0.0), ("num_samples", 0)])
def test_config_validation_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingConfig(**{field: value})


def test_prompt_too_long_for_block_size():
    model = sharp_model()
    with pytest.raises(ValueError, match="block_size"):
        generate(model, [[1] * 120], SamplingConfig(max_new_tokens=20))


def test_sample_categorical_matches_probabilities_chi_square():
    from rookworld_lib.core.sampling import sample_categorical

    g = torch.Generator().manual_seed(7)
    # 600 categories spread over three 256-blocks, including zeros and a dominant entry
    probs = torch.rand(600, generator=g) ** 4
    probs[::7] = 0.0
    probs[300] = 5.0
    probs = probs / probs.sum()
    # 50,000 draws: the sampler's cost is per draw (200,000 took 4-10 s). Two statistics, each failing
    # a correct sampler about once in a million seeds: Pearson's chi-square for deviations spread over
    # many cells, and the largest per-cell likelihood-ratio residual for a deviation in one or two
    # cells (an entry's mass handed to its neighbour across a block edge, extra mass on the last
    # entry), which the chi-square spreads over ~350 degrees of freedom and needed 200,000 draws to
    # see. Simulated on this distribution, every such fault the chi-square caught at 200,000 draws
    # (entry 255, 256, 257, 512 or 599 moved into a neighbour, half of entry 257 moved into 258, 0.2%
    # extra mass on entry 599, every entry shifted by one) fails here too, at 1.4 to 10 times the
    # residual's threshold.
    n = 50_000
    draws = sample_categorical(probs.expand(n, -1).contiguous(), torch.Generator().manual_seed(1))
    counts = torch.bincount(draws, minlength=600).double()
    assert counts[probs == 0].sum() == 0, "a zero-probability token was drawn"
    expected = probs.double() * n
    keep = expected >= 5  # the usual chi-square validity rule; pool the rest into one cell
    stat = (((counts[keep] - expected[keep]) ** 2) / expected[keep]).sum()
    rest_obs, rest_exp = counts[~keep].sum(), expected[~keep].sum()
    stat += (rest_obs - rest_exp) ** 2 / rest_exp
    dof = int(keep.sum())  # cells - 1, with the pooled cell counted
    # Wilson-Hilferty: chi2 quantile at 1 - 1e-6 (z = 4.75), so the test fails by chance once in a million
    z = 4.75
    crit = dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3
    assert stat < crit, (float(stat), crit)
    # per cell with at least 25 expected draws: the binomial likelihood-ratio statistic G (chi-square
    # with 1 dof, near-normal tails even for skewed cells); |residual| = sqrt(G) > 6 has probability
    # 2e-9 per cell: under 1e-6 over the ~260 cells tested
    big = expected >= 25
    o, e = counts[big], expected[big]
    g_stat = 2 * (torch.xlogy(o, o / e) + torch.xlogy(n - o, (n - o) / (n - e)))
    worst = int(big.nonzero()[g_stat.argmax()])
    assert g_stat.max().sqrt() < 6.0, (worst, float(counts[worst]), float(expected[worst]))


def test_sample_categorical_edges():
    from rookworld_lib.core.sampling import sample_categorical

    one_hot = torch.zeros(3, 50257)
    one_hot[0, 0] = 1.0
    one_hot[1, 50256] = 1.0
    one_hot[2, 12345] = 1e-30  # unnormalised, tiny mass
    assert sample_categorical(one_hot).tolist() == [0, 50256, 12345]
    # a row that is all mass on its last block's last real entry, drawn many times
    probs = torch.zeros(1000, 257)
    probs[:, 256] = 3.0
    probs[:, 3] = 1.0
    d = sample_categorical(probs, torch.Generator().manual_seed(0))
    assert set(d.tolist()) == {3, 256}
    assert 0.70 < (d == 256).double().mean() < 0.80
    # a vocabulary shorter than one block, and mass only in the partial last block of 50257
    small = torch.tensor([[0.0, 2.0, 0.0, 2.0, 0.0]]).expand(2000, -1).contiguous()
    ds = sample_categorical(small, torch.Generator().manual_seed(2))
    assert set(ds.tolist()) == {1, 3} and 0.45 < (ds == 1).double().mean() < 0.55
    tail = torch.zeros(500, 50257)
    tail[:, 50180] = 1.0
    tail[:, 50250] = 1.0
    dt = sample_categorical(tail, torch.Generator().manual_seed(3))
    assert set(dt.tolist()) == {50180, 50250}


def test_last_only_forward_equals_full_forward_last_position():
    torch.manual_seed(0)
    m = GPT(GPTConfig.preset("tiny")).eval()
    idx = torch.randint(0, 50257, (2, 9))
    full = m(idx)[:, -1:]
    last = m(idx, last_only=True)
    assert last.shape == (2, 1, 50257)
    torch.testing.assert_close(last, full, rtol=0, atol=1e-5)


def test_logits_from_equals_full_forward_tail():
    torch.manual_seed(0)
    m = GPT(GPTConfig.preset("tiny")).eval()
    idx = torch.randint(0, 50257, (2, 9))
    full = m(idx)
    tail = m(idx, logits_from=4)
    assert tail.shape == (2, 5, 50257)
    torch.testing.assert_close(tail, full[:, 4:], rtol=0, atol=1e-5)


def _decode_parity(device, mode, autocast_dtype=None, atol=1e-4):
    model = sharp_model().to(device)
    prompts = mixed_prompts()
    cfg = dict(max_new_tokens=24, num_samples=3, seed=5)
    ctx = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else torch.autocast(device.type,
                                                                                                   enabled=False)
    with ctx:
        ref = generate(model, prompts, SamplingConfig(decode="dynamic", **cfg))
        got = generate(model, prompts, SamplingConfig(decode=mode, **cfg))
    assert torch.equal(got.mask, ref.mask)
    assert torch.equal(got.tokens, ref.tokens)
    assert ((got.logprobs - ref.logprobs) * ref.mask).abs().max().item() <= atol
    return ref, got


def test_static_decode_equals_dynamic_decode():
    # fixed shapes, attention over the whole cache with unwritten slots masked, tensor write index
    _decode_parity(torch.device("cpu"), "static")


def test_cuda_graph_decode_needs_cuda():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        generate(sharp_model(), [[1, 2, 3]], SamplingConfig(max_new_tokens=4, decode="cuda_graph"))
    with pytest.raises(ValueError, match="decode"):
        SamplingConfig(decode="graph")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("mode", ["static", "cuda_graph"])
def test_gpu_decode_modes_equal_dynamic(mode):
    _decode_parity(torch.device("cuda"), mode)


def _bf16_onpolicy_gap(device, mode):
    """Largest |sampled log-prob - rescored log-prob| under bf16 autocast. Rounding differs between
    the cached decode and the full pass, so tokens can differ from an fp32 run; what GRPO needs is
    that the sampler's log-probs match a scoring pass of the same tokens."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", block_size=128)).to(device).eval()
    with torch.autocast(device.type, dtype=torch.bfloat16):
        ro = generate(model, mixed_prompts(), SamplingConfig(max_new_tokens=24, num_samples=3, seed=5, decode=mode))
        full = sequence_logprobs(model, ro.prompt_ids, ro.tokens)
    assert ro.mask.any()
    return ((full.float() - ro.logprobs) * ro.mask).abs().max().item()


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_cpu_bf16_autocast_sampled_logprobs_match_scoring(mode):
    assert _bf16_onpolicy_gap(torch.device("cpu"), mode) < 0.05


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("mode", ["dynamic", "static", "cuda_graph"])
def test_gpu_bf16_autocast_sampled_logprobs_match_scoring(mode):
    # cuda_graph: replays reuse casts made inside the graph (autocast's cache is off while capturing)
    assert _bf16_onpolicy_gap(torch.device("cuda"), mode) < 0.05


# ------------------------------------------------------------------------------------------
# Top-k / top-p against transformers' logits processors
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("top_k", [0, 50, 1000])
def test_filter_logits_keeps_exactly_what_transformers_warpers_keep(top_k):
    """TopKLogitsWarper then TopPLogitsWarper (generate's order) on a full GPT-2 vocabulary: the
    same tokens survive in every row. Summing the nucleus mass from the top in float32 dropped a
    boundary token transformers keeps (2-15% of rows at top_p 0.9-0.95, nearly all at 0.99 here)."""
    lp = pytest.importorskip("transformers.generation.logits_process")
    g = torch.Generator().manual_seed(top_k)
    logits = torch.randn(32, 50257, generator=g) * 4.0
    logits[:8] = logits[:8] * 0.25  # flatter rows: long nuclei
    logits[8:12, :3] = 30.0  # near one-hot rows, with ties at the top
    for top_p in (0.5, 0.9, 0.95, 0.99, 1.0):
        want = logits
        if top_k:
            want = lp.TopKLogitsWarper(top_k)(None, want)
        if top_p < 1.0:
            want = lp.TopPLogitsWarper(top_p)(None, want)
        got = filter_logits(logits, top_k, top_p)
        assert torch.equal(torch.isfinite(got), torch.isfinite(want)), (top_k, top_p)
        torch.testing.assert_close(got[torch.isfinite(got)], logits[torch.isfinite(got)], rtol=0, atol=0)


# ------------------------------------------------------------------------------------------
# Bad sampler input: what is wrong, which argument, the allowed range
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("prompts, match", [
    ([[1, 2, 50257]], r"prompts\[0\]\[2\] = 50257 is outside the model's vocabulary: token ids must be in \[0, 50257\)"),
    ([[5], [3, -1]], r"prompts\[1\]\[1\] = -1 is outside .* \[0, 50257\)"),
    ("P: 8/8/8/8/8/8/8/8 w - - 0 1", r"prompts is a string; pass token ids"),
    (["P: 8/8/8"], r"prompts\[0\] is a string .* pass token ids"),
    ([[1.0, 2.7]], r"prompts\[0\]\[0\] is 1.0 \(float\); token ids must be integers in \[0, 50257\)"),
    ([torch.tensor([1.0, 2.0])], r"prompts\[0\] has dtype torch.float32; token ids must be integers"),
    (torch.ones(2, 3), r"2-D \(num_prompts, length\) of integer ids"),
    ([[1, True]], r"prompts\[0\]\[1\] is True"),
    ([3, 4], r"prompts\[0\] is a single id"),
    ([], r"prompts is empty"),
    ([[1], []], r"prompts\[1\] is empty"),
])
def test_bad_prompts_get_a_clear_message(prompts, match):
    with pytest.raises(ValueError, match=match):
        generate(sharp_model(), prompts, SamplingConfig(max_new_tokens=2))


def test_prompts_as_tensors_and_numpy_are_accepted():
    np = pytest.importorskip("numpy")
    model = sharp_model()
    cfg = SamplingConfig(max_new_tokens=3, temperature=0)
    want = generate(model, [[1, 2, 3], [4, 5, 6]], cfg).tokens
    for prompts in (torch.tensor([[1, 2, 3], [4, 5, 6]]), [torch.tensor([1, 2, 3]), np.array([4, 5, 6])],
                    [[torch.tensor(1), np.int64(2), 3], (4, 5, 6)]):
        assert torch.equal(generate(model, prompts, cfg).tokens, want)


@pytest.mark.parametrize("field", ["eos_id", "pad_id"])
def test_token_ids_of_the_config_must_lie_in_the_vocabulary(field):
    with pytest.raises(ValueError, match=rf"SamplingConfig.{field} = 50300 is outside the model's vocabulary: "
                                         r"it must be in \[0, 50257\)"):
        generate(sharp_model(), [[1, 2]], SamplingConfig(max_new_tokens=2, **{field: 50300}))
    for bad in (-2 if field == "eos_id" else -1, 2.0, True):
        with pytest.raises(ValueError, match=f"SamplingConfig.{field} must be a token id"):
            SamplingConfig(**{field: bad})


@pytest.mark.parametrize("eos_id", [None, -1])
def test_no_eos_decodes_every_row_to_the_budget(eos_id):
    """eos_id None (or sampling.NO_EOS = -1, the benchmarks' choice) is the one way to say "never stop"."""
    model = sharp_model()
    greedy = generate(model, mixed_prompts(), SamplingConfig(max_new_tokens=12, temperature=0))
    first = greedy.tokens[0, 0].item()  # make row 0's first greedy token the EOS: with it, row 0 stops at once
    assert generate(model, mixed_prompts(), SamplingConfig(max_new_tokens=12, temperature=0, eos_id=first)).finished[0]
    ro = generate(model, mixed_prompts(), SamplingConfig(max_new_tokens=12, temperature=0, eos_id=eos_id))
    assert ro.mask.all() and not ro.finished.any() and ro.tokens.shape == (5, 12)


@pytest.mark.parametrize("mode", ["dynamic", "static", pytest.param("cuda_graph", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA graphs need a GPU"))])
def test_prompt_plus_new_tokens_may_fill_block_size_plus_one(mode):
    """The last new token is never fed back, so prompt + max_new_tokens = block_size + 1 fits (as in
    transformers' generate); the rescoring pass runs the same block_size positions. (cuda_graph:
    the capture's spare slot is then the last decode step's own slot.)"""
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", block_size=32)).eval()
    if mode == "cuda_graph":
        model = model.cuda()
    prompts = [list(range(1, 21)), list(range(5, 12))]  # longest prompt: 20 tokens
    ro = generate(model, prompts, SamplingConfig(max_new_tokens=13, seed=0, eos_id=50000, decode=mode))
    assert ro.tokens.shape == (2, 13) and ro.mask.all()
    with torch.no_grad():
        full = sequence_logprobs(model, ro.prompt_ids, ro.tokens)
    assert ((full - ro.logprobs) * ro.mask).abs().max().item() <= 1e-4
    with pytest.raises(ValueError, match=r"20 tokens\) \+ max_new_tokens \(14\) - 1 = 33 positions exceed the "
                                         r"model's block_size 32; allowed: prompt length \+ max_new_tokens <= 33"):
        generate(model, prompts, SamplingConfig(max_new_tokens=14, decode=mode))
    with pytest.raises(ValueError, match=r"the longest prompt \(40 tokens\) is longer than the model's block_size 32 "
                                         r"\(its learned positions\): no completion fits"):
        generate(model, [list(range(1, 41))], SamplingConfig(max_new_tokens=1, decode=mode))


def test_full_block_greedy_matches_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", block_size=32))
    with torch.no_grad():
        model.transformer.wte.weight.mul_(8.0)
    model.eval().save_pretrained(tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    prompt = list(range(100, 120))
    ours = generate(model, [prompt], SamplingConfig(max_new_tokens=13, temperature=0, eos_id=50000))
    with torch.no_grad():
        out = hf.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, 20, dtype=torch.long),
                          do_sample=False, max_new_tokens=13, pad_token_id=50256, eos_token_id=50000)
    assert out.shape[1] == 33  # transformers generates up to block_size + 1 tokens
    n = int(ours.mask[0].sum())
    assert ours.tokens[0, :n].tolist() == out[0, 20:20 + n].tolist()


@pytest.mark.parametrize("slow_threads", [1, 2])
def test_small_cpu_decode_runs_on_the_faster_thread_count(monkeypatch, slow_threads):
    """The first generate of a batch shape times throwaway decode steps on torch's threads and on
    one; every decode step of that call and of later calls runs on the faster, with no new timing,
    and torch's setting is restored afterwards. A big step is never probed. The probe's clock is a
    fake that the decode steps advance, so a loaded machine cannot reorder the two counts."""
    import types

    from rookworld_lib.core import sampling

    state, clock = {"threads": 2}, [0.0]
    monkeypatch.setattr(sampling, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(torch, "get_num_threads", lambda: state["threads"])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: state.update(threads=n))
    monkeypatch.setattr(sampling, "_DECODE_THREADS", {})
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=32))
    real_forward, calls = model.forward, []

    def forward(idx, *args, **kwargs):  # decode steps (one token) on the slow count are slow
        if idx.size(1) == 1:
            calls.append(state["threads"])
            clock[0] += 0.02 if state["threads"] == slow_threads else 0.001
        return real_forward(idx, *args, **kwargs)

    monkeypatch.setattr(model, "forward", forward)
    fast = 3 - slow_threads
    cfg = SamplingConfig(max_new_tokens=6, temperature=0, eos_id=sampling.NO_EOS)
    generate(model, [[1, 2, 3]] * 4, cfg)
    assert calls == [2, 1, 2, 1] + [fast] * 5  # the probe, then 5 decode steps after the prefill
    assert state["threads"] == 2
    calls.clear()
    generate(model, [[4, 5, 6]] * 4, cfg)
    assert calls == [fast] * 5  # the same shape: the choice is kept, nothing is timed again
    calls.clear()
    generate(model, [[1, 2, 3]] * 2, cfg)
    assert calls == [2, 1, 2, 1] + [fast] * 5  # another batch shape is timed for itself
    calls.clear()  # under deterministic algorithms: one thread, never timed (another process may choose otherwise)
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    generate(model, [[1, 2, 3]] * 3, cfg)
    assert calls == [1] * 5 and state["threads"] == 2
    monkeypatch.setattr(sampling, "SINGLE_THREAD_DECODE_FLOPS", 0)  # every step "big": torch's threads, no probe
    calls.clear()
    generate(model, [[1, 2, 3]] * 5, cfg)
    assert calls == [2] * 5



def test_fused_scoring_matches_the_logits_path():
    from rookworld_lib.core.grpo import entropy_from_logits

    model = sharp_model()
    prompts = mixed_prompts()
    ro = generate(model, prompts, SamplingConfig(max_new_tokens=9, seed=3))
    lp_logits, logits = sequence_logprobs(model, ro.prompt_ids, ro.tokens, 0.8, return_logits=True)
    lp_fused, entropy = sequence_logprobs(model, ro.prompt_ids, ro.tokens, 0.8, return_entropy=True)
    torch.testing.assert_close(lp_fused, lp_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, entropy_from_logits(logits, 0.8), rtol=1e-5, atol=1e-5)
    lp_fused.sum().backward()  # gradients reach the model through the fused head
    assert model.transformer.wte.weight.grad is not None and model.transformer.h[0].attn.c_attn.weight.grad is not None


def test_a_full_block_prompt_with_one_new_token_decodes(monkeypatch):
    # one new token means no decode step: nothing for the thread probe to time (it once built a
    # cache one slot past block_size here and raised)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=16))
    ro = generate(model, [list(range(16))], SamplingConfig(max_new_tokens=1, temperature=0))
    assert ro.tokens.shape == (1, 1)
    assert ro.tokens[0, 0].item() == model(torch.tensor([list(range(16))]))[0, -1].argmax().item()


def test_top_p_at_an_exact_boundary_keeps_what_transformers_keeps():
    # four equal logits, top_p 0.75: the lowest token's ascending mass is exactly 0.25 = 1 - top_p, and
    # TopPLogitsWarper drops it (<=), keeping three
    lp = pytest.importorskip("transformers.generation.logits_process")
    x = torch.zeros(1, 4)
    want = torch.isfinite(lp.TopPLogitsWarper(0.75)(None, x.clone()))
    assert torch.equal(torch.isfinite(filter_logits(x, 0, 0.75)), want) and int(want.sum()) == 3


def test_a_zero_probability_token_is_never_drawn_even_at_u_zero(monkeypatch):
    from rookworld_lib.core.sampling import sample_categorical

    # inverse CDF: the first index whose cumulative probability exceeds u, so u = 0 gives index 1 of [0, 1, 0]
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.zeros(a[0], dtype=k.get("dtype")))
    assert sample_categorical(torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])).tolist() == [1, 2]


def test_a_zero_probability_token_is_never_drawn_even_at_the_top_of_u(monkeypatch):
    """The other end: u just below the row's total. A block's mass is a float32 sum and the search inside
    it a float64 cumulative sum, which can end below that mass; u past its end then runs the search off
    the block's last token with mass, onto the zeros after it."""
    from rookworld_lib.core.sampling import sample_categorical

    g = torch.Generator().manual_seed(0)
    while True:  # a one-block row whose float32 sum exceeds its float64 sum, zero from column 200 on
        row = torch.rand(1, 256, generator=g)
        row[0, 200:] = 0.0
        if row.sum(dtype=torch.float32).double() > row.double().sum():
            break
    top = 1 - 2**-53  # the largest float64 below 1, what torch.rand may return
    monkeypatch.setattr(torch, "rand", lambda size, **k: torch.full(size, top, dtype=k.get("dtype")))
    assert sample_categorical(row).tolist() == [199]  # the last token with mass, never one of the zeros


def test_filtered_samples_carry_log_probs_at_the_sampling_temperature():
    # Rollout.logprobs: log softmax(logits / T) over the whole vocabulary at the drawn token, with top-k
    # or top-p on as without (TRL scores the old policy so); sequence_logprobs is that, tested apart
    model = sharp_model()
    for cfg in (SamplingConfig(max_new_tokens=8, temperature=0.7, top_k=50, seed=1),
                SamplingConfig(max_new_tokens=8, temperature=1.6, top_p=0.9, seed=2)):
        ro = generate(model, [[1, 2, 3], [400, 5000]], cfg)
        with torch.no_grad():
            full = sequence_logprobs(model, ro.prompt_ids, ro.tokens, temperature=cfg.temperature)
        assert ((full - ro.logprobs) * ro.mask).abs().max().item() <= 1e-4


def test_prefill_counts_prompt_tokens_not_padding_and_eos_must_be_a_token_of_the_model():
    model = sharp_model()
    ro = generate(model, [[1, 2, 3], [4]], SamplingConfig(max_new_tokens=2, seed=0))
    assert ro.stats["prefill_tokens"] == 4
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        generate(model, [[1, 2]], SamplingConfig(max_new_tokens=2, eos_id=model.config.vocab_size))


_ONE_NEW = SamplingConfig(max_new_tokens=1, temperature=0)


@pytest.mark.parametrize("call, match, boundary", [
    pytest.param(lambda m: generate(m, None, _ONE_NEW),
                 r"^generate: prompts must be a list of token-id lists, got NoneType$",
                 lambda m: generate(m, [[5]], _ONE_NEW), id="prompts-none"),
    pytest.param(lambda m: generate(m, 464, _ONE_NEW),  # one token id, not a batch of prompts
                 r"^generate: prompts must be a list of token-id lists, got int$",
                 lambda m: generate(m, [[464]], _ONE_NEW), id="prompts-int"),
    pytest.param(lambda m: generate(m, [[5], None], _ONE_NEW),
                 r"^generate: prompts\[1\] must be a list of token ids, got NoneType$",
                 lambda m: generate(m, [[5], [6]], _ONE_NEW), id="prompt-row-none"),
    pytest.param(lambda m: sequence_logprobs(m, [[5, 6], []], torch.zeros(2, 1, dtype=torch.long)),
                 r"^prompt 1 is empty; every prompt needs at least one token$",
                 lambda m: sequence_logprobs(m, [[5, 6], [7]], torch.zeros(2, 1, dtype=torch.long)), id="score-empty-prompt"),
    pytest.param(lambda m: sequence_logprobs(m, [[5, 6]], torch.zeros(1, 0, dtype=torch.long)),
                 r"^sequence_logprobs: completion_tokens has no columns; there is nothing to score$",
                 lambda m: sequence_logprobs(m, [[5, 6]], torch.zeros(1, 1, dtype=torch.long)), id="score-no-columns"),
])
def test_bad_generate_and_scoring_arguments_name_the_argument(call, match, boundary):
    model = sharp_model()
    with pytest.raises(ValueError, match=match):
        call(model)
    with torch.no_grad():
        boundary(model)  # the nearest good value passes the same check


def test_scoring_no_prompts_is_refused_by_name_not_by_an_empty_max():
    """sequence_logprobs over an empty batch (a GRPO minibatch or a caller's filter that kept no rows) says
    that no prompt was given, not Python's "max() arg is an empty sequence"; one prompt scores."""
    model = sharp_model()
    with pytest.raises(ValueError, match=r"^no prompts; pass at least one$"):
        sequence_logprobs(model, [], torch.zeros(0, 1, dtype=torch.long))
    with torch.no_grad():
        assert sequence_logprobs(model, [[5]], torch.zeros(1, 1, dtype=torch.long)).shape == (1, 1)


def test_a_model_with_nan_weights_and_a_config_that_is_no_samplingconfig_are_refused():
    """NaN weights "sampled" token 0 at every step with NaN log-probs, without a word; a dict of the config's
    fields failed as "'dict' object has no attribute 'num_samples'"."""
    model = GPT(GPTConfig.preset("tiny", block_size=16))
    with pytest.raises(ValueError, match=r"^generate: config must be a SamplingConfig \(SamplingConfig\(\*\*fields\)\), got dict$"):
        generate(model, [[1, 2]], {"max_new_tokens": 2})
    torch.nn.init.constant_(model.transformer.wte.weight, float("nan"))
    for temperature in (0.0, 1.0):
        with pytest.raises(ValueError, match=r"^generate: the model's logits for the prompts are NaN"):
            generate(model, [[1, 2]], SamplingConfig(max_new_tokens=2, temperature=temperature))
