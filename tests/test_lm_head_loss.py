import pytest
import torch
import torch.nn.functional as F

from rookworld_lib.core.lm_head_loss import (CPU_CHUNK_ROWS, DEVICE_CHUNK_ROWS, default_chunk_rows, linear_token_logprobs,
                                         linear_cross_entropy)
from rookworld_lib.core.model import GPT, GPTConfig, lm_loss


def reference(hidden, weight, targets):
    return F.cross_entropy((hidden @ weight.t()).reshape(-1, weight.size(0)).double(),
                           targets.reshape(-1), ignore_index=-1)


@pytest.mark.parametrize("chunk_rows", [1, 7, 64, 1000])
def test_loss_and_gradients_match_float64_reference(chunk_rows):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 11, 16, generator=g, dtype=torch.float64)
    weight = torch.randn(300, 16, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 300, (3, 11), generator=g)
    targets[0, :4] = -1  # ignored positions
    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ours = linear_cross_entropy(h1.float(), w1.float(), targets, chunk_rows=chunk_rows)
    ref = reference(h2, w2, targets)
    (ours * 2.5).backward()
    (ref * 2.5).backward()
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours.double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-4, atol=1e-6)


def test_all_ignored_is_nan_like_cross_entropy():
    loss = linear_cross_entropy(torch.randn(2, 4, requires_grad=True), torch.randn(5, 4),
                                torch.full((2,), -1))
    assert torch.isnan(loss)
    assert torch.isnan(F.cross_entropy(torch.randn(2, 5), torch.full((2,), -1), ignore_index=-1))


def test_shape_mismatch_is_named():
    with pytest.raises(ValueError, match="disagree"):
        linear_cross_entropy(torch.randn(2, 3, 4), torch.randn(5, 4), torch.zeros(2, 4, dtype=torch.long))


@pytest.mark.parametrize("pad", [1, 64])
def test_gpt_forward_with_targets_equals_lm_loss_and_its_gradients(pad):
    torch.manual_seed(0)
    m = GPT(GPTConfig.preset("tiny", pad_vocab_to_multiple=pad))
    idx = torch.randint(0, 50257, (2, 17))
    x, y = idx[:, :-1], idx[:, 1:]
    fused = m(x, targets=y)
    fused.backward()
    fused_grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    plain = lm_loss(m(x), y)
    plain.backward()
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
    for n, p in m.named_parameters():
        torch.testing.assert_close(fused_grads[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)


def test_bf16_autocast_close_to_fp32():
    torch.manual_seed(0)
    m = GPT(GPTConfig.preset("tiny"))
    idx = torch.randint(0, 50257, (2, 9))
    ref = m(idx[:, :-1], targets=idx[:, 1:]).item()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = m(idx[:, :-1], targets=idx[:, 1:])
    loss.backward()
    assert loss.dtype == torch.float32
    assert abs(loss.item() - ref) < 0.05
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_under_autocast_the_fused_head_multiplies_in_the_autocast_dtype():
    """Under autocast the fused head's matmul runs in bf16 as the unfused head's `hidden @ weight.T` does
    there, so its loss is that of the bf16 logits (to float32 summation order), not of float32 ones."""
    g = torch.Generator().manual_seed(2)
    h, w = torch.randn(64, 32, generator=g), torch.randn(500, 32, generator=g)
    t = torch.randint(0, 500, (64,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = linear_cross_entropy(h, w, t, chunk_rows=16).item()
        logits = h @ w.t()
    assert logits.dtype == torch.bfloat16
    want, fp32 = F.cross_entropy(logits.float(), t).item(), F.cross_entropy(h @ w.t(), t).item()
    assert abs(want - fp32) > 1e-4  # the two precisions are told apart at this size
    assert abs(fused - want) < 3e-5, (fused, want, fp32)


def test_token_logprobs_under_autocast_off_the_cpu_give_the_gradient_of_their_own_logits(monkeypatch):
    """Off the CPU (simulated here: no reused float32 buffer) the fused scorer's matmul runs in bf16 under
    autocast, and GRPO's backward runs after the autocast block: it must recompute the logits as the forward
    made them. At GPT-2's logit scale (raw logits near -60) a float32 recomputation against the forward's
    bf16 log-sum-exp gave a softmax summing to up to 1.05 and a gradient 21% off float32's (plain bf16
    autograd: 1.6%)."""
    from rookworld_lib.core import lm_head_loss
    from rookworld_lib.core.grpo import token_logprobs
    monkeypatch.setattr(lm_head_loss, "_logits_buffer", lambda *a, **k: None)
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(16, 64, generator=g), torch.randn(4000, 64, generator=g)
    h[:, 0], w[:, 0] = 1.0, -60.0
    tok = torch.randint(0, 4000, (16,), generator=g)
    grads = {}
    for name in ("fused", "autograd bf16", "float32"):
        hh = h.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name != "float32"):
            lp = linear_token_logprobs(hh, w, tok)[0] if name == "fused" else token_logprobs((hh @ w.t()).float()[None], tok[None])
        lp.sum().backward()  # outside the autocast block, as train_grpo's update
        grads[name] = hh.grad
    err = {n: ((grads[n] - grads["float32"]).norm() / grads["float32"].norm()).item() for n in grads}
    assert err["autograd bf16"] > 1e-3  # the precisions are told apart at this size
    assert err["fused"] < 1.5 * err["autograd bf16"], err


def test_bf16_inputs_without_autocast():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(6, 8, generator=g).bfloat16().requires_grad_()
    w = torch.randn(40, 8, generator=g).bfloat16().requires_grad_()
    t = torch.randint(0, 40, (6,), generator=g)
    loss = linear_cross_entropy(h, w, t, chunk_rows=4)
    loss.backward()
    assert h.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.bfloat16
    h64, w64 = (x.detach().double().requires_grad_() for x in (h, w))
    ref = reference(h64, w64, t)
    assert abs(loss.item() - ref.item()) < 0.05
    # the mixed-precision path's gradients (the gpu profile's), summed over both chunks, against float64 autograd
    ref.backward()
    for ours, want in ((h.grad, h64.grad), (w.grad, w64.grad)):
        assert (ours.double() - want).abs().max().item() < 3e-2 * want.abs().max().item()


def test_no_grad_skips_the_gradient_work(monkeypatch):
    # Under torch.no_grad (validation losses) the chunk loop must not form logit gradients.
    calls = []
    real_scatter = torch.Tensor.scatter_add_

    def counting(self, *a, **k):
        calls.append(1)
        return real_scatter(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "scatter_add_", counting)
    h = torch.randn(6, 8, requires_grad=True)
    w = torch.randn(50, 8, requires_grad=True)
    t = torch.randint(0, 50, (6,))
    with torch.no_grad():
        no_grad_loss = linear_cross_entropy(h, w, t, chunk_rows=4)
    assert calls == []
    torch.testing.assert_close(no_grad_loss, linear_cross_entropy(h, w, t, chunk_rows=4).detach())
    assert calls  # with grad on, the gradient path ran


def test_default_chunking_spans_several_chunks_and_matches_reference():
    # The CPU default (CPU_CHUNK_ROWS) must split this batch, so the gradient of the head weight
    # is accumulated across chunks; ignored targets straddle a chunk boundary.
    assert default_chunk_rows(torch.device("cpu")) == CPU_CHUNK_ROWS
    assert default_chunk_rows(torch.device("meta")) == DEVICE_CHUNK_ROWS
    rows = 2 * CPU_CHUNK_ROWS + 37
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(rows, 12, generator=g, dtype=torch.float64)
    weight = torch.randn(90, 12, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 90, (rows,), generator=g)
    targets[CPU_CHUNK_ROWS - 5:CPU_CHUNK_ROWS + 5] = -1
    h1, w1 = hidden.float().requires_grad_(), weight.float().requires_grad_()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ours = linear_cross_entropy(h1, w1, targets)
    ref = reference(h2, w2, targets)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(ours.double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h1.grad.double(), h2.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(w1.grad.double(), w2.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("chunk_rows,temperature", [(1, 1.0), (7, 0.7), (1000, 1.3)])
def test_token_logprobs_entropies_and_gradients_match_float64_reference(chunk_rows, temperature):
    from rookworld_lib.core.grpo import entropy_from_logits, token_logprobs

    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(3, 11, 16, generator=g, dtype=torch.float64)
    weight = torch.randn(300, 16, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, 300, (3, 11), generator=g)
    upstream = torch.randn(3, 11, generator=g, dtype=torch.float64)
    h1, w1 = hidden.float().requires_grad_(), weight.float().requires_grad_()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    lp, ent = linear_token_logprobs(h1, w1, tokens, temperature, chunk_rows=chunk_rows)
    logits = h2 @ w2.t()
    ref_lp, ref_ent = token_logprobs(logits, tokens, temperature), entropy_from_logits(logits.detach(), temperature)
    assert lp.shape == ent.shape == tokens.shape and lp.dtype == torch.float32 and not ent.requires_grad
    torch.testing.assert_close(lp.double(), ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent, rtol=1e-5, atol=1e-5)
    (lp.double() * upstream).sum().backward()
    (ref_lp * upstream).sum().backward()
    torch.testing.assert_close(h1.grad.double(), h2.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w1.grad.double(), w2.grad, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="disagree"):
        linear_token_logprobs(h1, w1, tokens[:, :-1])


def test_model_scores_tokens_fused_as_from_its_logits():
    # a padded vocabulary: the fused scores cover the real tokens only, as the logits do
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=300, pad_vocab_to_multiple=64))
    idx = torch.randint(0, 300, (2, 12))
    tokens = torch.randint(0, 300, (2, 7))
    from rookworld_lib.core.grpo import token_logprobs

    lp, ent = model(idx, logits_from=5, score_tokens=tokens, temperature=0.9)
    logits = model(idx, logits_from=5)
    assert logits.shape[-1] == 300
    torch.testing.assert_close(lp, token_logprobs(logits, tokens, 0.9), rtol=1e-5, atol=1e-5)


def test_torch_compile_breaks_the_graph_at_the_fused_head_and_matches_eager():
    """Under torch.compile the fused loss and log-probs run eagerly (one graph break each, as
    torch.compiler.disable gives): the compiled graphs hold none of the chunk loop, and the loss,
    the scored log-probs and every gradient equal eager mode's. (Eager mode never imports dynamo:
    test_core_layer.)"""
    import torch._dynamo
    import torch._dynamo.testing

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=300))
    x, y = torch.randint(0, 300, (2, 12)), torch.randint(0, 300, (2, 12))

    def run(m):
        model.zero_grad()
        loss = m(x, targets=y)
        lp, _ = m(x, logits_from=4, score_tokens=y[:, 4:])
        (loss + lp.sum()).backward()
        return loss.detach(), lp.detach(), [p.grad.clone() for p in model.parameters()]

    eager = run(model)
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounter()
    compiled = run(torch.compile(model, backend=counter))
    torch.testing.assert_close(compiled[0], eager[0], rtol=0, atol=0)
    torch.testing.assert_close(compiled[1], eager[1], rtol=0, atol=0)
    for a, b in zip(compiled[2], eager[2]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # dynamo stops at the fused loss and at the fused log-probs (their frames in lm_head_loss.py) and
    # hands each to eager mode
    for kwargs in (dict(targets=y), dict(logits_from=4, score_tokens=y[:, 4:])):
        explained = torch._dynamo.explain(model)(x, **kwargs)
        breaks = [b for b in explained.break_reasons if b.graph_break]
        assert len(breaks) == 1, explained.break_reasons
        assert any(f.filename.endswith("lm_head_loss.py") for f in breaks[0].user_stack), breaks[0].user_stack
    assert counter.frame_count >= 1
    torch._dynamo.reset()


_G = torch.Generator().manual_seed(3)
_H, _W = torch.randn(2, 3, 4, generator=_G, dtype=torch.float64), torch.randn(5, 4, generator=_G, dtype=torch.float64)
_Y = torch.tensor([[0, 4, 2], [1, 1, 3]])


@pytest.mark.parametrize("kwargs, match", [
    (dict(chunk_rows=0), r"^linear_cross_entropy: chunk_rows must be >= 1, got 0$"),
    (dict(chunk_rows=-64), r"^linear_cross_entropy: chunk_rows must be >= 1, got -64$"),
    (dict(targets=_Y.t()), r"^linear_cross_entropy: hidden \(2, 3, 4\) and targets \(3, 2\) disagree$"),
], ids=["chunk-rows-0", "chunk-rows-negative", "targets-transposed"])
def test_linear_cross_entropy_names_a_bad_chunk_size_or_shape(kwargs, match):
    args = dict(hidden=_H, weight=_W, targets=_Y)
    with pytest.raises(ValueError, match=match):
        linear_cross_entropy(**{**args, **kwargs})
    # the smallest chunk is accepted, and is torch's cross-entropy of the logits
    assert linear_cross_entropy(**args, chunk_rows=1).item() == pytest.approx(reference(_H, _W, _Y).item(), rel=1e-6)


@pytest.mark.parametrize("chunk_rows", [0, -1])
def test_token_logprobs_refuse_a_chunk_size_below_one(chunk_rows):
    """A chunk of fewer than one row is refused, as linear_cross_entropy refuses it: 0 once fell back to the
    default in silence and -1 returned the outputs' uninitialised memory (a range with a negative step runs
    no chunk)."""
    h, w, t = torch.randn(2, 3, 8), torch.randn(11, 8), torch.randint(0, 11, (2, 3))
    with pytest.raises(ValueError, match=rf"^linear_token_logprobs: chunk_rows must be >= 1, got {chunk_rows}$"):
        linear_token_logprobs(h, w, t, chunk_rows=chunk_rows)
    lp, _ = linear_token_logprobs(h, w, t, chunk_rows=1)  # the smallest chunk: torch's log-softmax of the logits
    torch.testing.assert_close(lp, torch.log_softmax(h @ w.T, -1).gather(-1, t[..., None])[..., 0])

