import math
import statistics

import torch

from rookworld_lib.lab import health
from rookworld_lib.core.model import GPT, GPTConfig, lm_loss


def tiny():
    torch.manual_seed(0)
    return GPT(GPTConfig.preset("tiny", block_size=64))


def test_params_by_module_sums_to_total():
    m = tiny()
    counts = health.params_by_module(m)
    assert sum(counts.values()) == m.num_params()
    assert counts["wte"] == 50257 * 64 and counts["wpe"] == 64 * 64
    assert "lm_head" not in counts  # tied to wte, counted once
    assert counts["h.0.attn"] == 64 * 192 + 192 + 64 * 64 + 64


def test_init_stats_follow_gpt2_init():
    """Notebook 02's init table against GPT-2's init written out here (nanoGPT's _init_weights): N(0, 0.02)
    for embeddings and Linear weights, 0.02 / sqrt(2 n_layer) for the residual projections, zero biases,
    LayerNorm gains one. Biases and LayerNorms were not checked (their expected spread is 0)."""
    m = tiny()
    rows = health.init_stats(m)
    assert [r["name"] for r in rows] == [n for n, _ in m.named_parameters()]
    for r in rows:
        kind = r["name"].split(".")[-2:]
        if kind == ["c_proj", "weight"]:
            want = 0.02 / math.sqrt(2 * m.config.n_layer)
        elif kind[0] in ("wte", "wpe", "c_attn", "c_fc") and kind[1] == "weight":
            want = 0.02
        else:
            want = 0.0
        assert r["expected_std"] == want, r
        if want:
            assert abs(r["std"] - want) / want < 0.15 and abs(r["mean"]) < want / 4, r
        else:  # a bias or a LayerNorm parameter: constant
            assert r["std"] == 0 and r["mean"] == (1.0 if kind[0].startswith("ln") and kind[1] == "weight" else 0.0), r
    # the spread is the sample standard deviation (n - 1), as statistics.stdev gives it
    with torch.no_grad():
        m.transformer.ln_f.weight.copy_(torch.arange(m.config.n_embd, dtype=torch.float32))
    row = next(r for r in health.init_stats(m) if r["name"] == "transformer.ln_f.weight")
    assert math.isclose(row["std"], statistics.stdev(range(m.config.n_embd)), rel_tol=1e-6)


def test_logits_stats_counts_nonfinite():
    x = torch.tensor([[1.0, float("nan"), -2.0, float("inf")]])
    s = health.logits_stats(x)
    assert s["nonfinite"] == 2 and s["min"] == -2.0 and s["max"] == 1.0
    # a diverged model, every logit NaN: the case the count exists for (it raised on the empty selection)
    s = health.logits_stats(torch.full((1, 2, 3), float("nan")))
    assert s["nonfinite"] == 6 and all(math.isnan(s[k]) for k in ("min", "max", "mean", "std"))


def test_init_loss_and_causality():
    m = tiny().eval()
    idx = torch.randint(0, 50257, (2, 32))
    s = health.init_loss(m, idx)
    assert s["uniform"] == math.log(50257) and abs(s["loss"] - s["uniform"]) < 0.2
    # a model over a smaller vocabulary (a compact one) is near-uniform over its own tokens
    torch.manual_seed(0)
    small = GPT(GPTConfig.preset("tiny", block_size=64, vocab_size=500)).eval()
    assert health.init_loss(small, torch.randint(0, 500, (2, 32)))["uniform"] == math.log(500)
    c = health.causality_violation(m, idx, 10)
    assert c["max_change_before"] == 0.0 and c["max_change_after"] > 0
    # the changed token's own position moves first: "after" counts it (at the last position it is all there is)
    with torch.no_grad():
        changed = idx.clone()
        changed[:, 10] = (changed[:, 10] + 1) % 50257
        at = (m(idx)[:, 10] - m(changed)[:, 10]).abs().max().item()
    assert at > 0 and c["max_change_after"] >= at and health.causality_violation(m, idx, 31)["max_change_after"] > 0


def test_grad_norms_cover_every_block():
    m = tiny()
    g = health.grad_norms_by_layer(m, torch.randint(0, 50257, (2, 16)))
    assert set(g) == {"wte", "wpe", "h.0", "h.1", "ln_f"}
    assert all(v > 0 and math.isfinite(v) for v in g.values())
    # each group's L2 norm, as torch computes it over that group's gradients (the same batch, seeded)
    m.eval()  # no dropout: both backward passes see the same network
    idx = torch.randint(0, 50257, (2, 16))
    g = health.grad_norms_by_layer(m, idx)
    lm_loss(m(idx[:, :-1]), idx[:, 1:]).backward()
    grads = {k: [] for k in g}
    for name, p in m.named_parameters():
        parts = name.split(".")
        grads[".".join(parts[1:3] if parts[1] == "h" else parts[1:2])].append(p.grad.flatten())  # tied head: no lm_head
    for k, v in g.items():
        assert math.isclose(v, torch.linalg.vector_norm(torch.cat(grads[k]).double()).item(), rel_tol=1e-6), k


def test_memory_by_phase_accounting():
    m = tiny()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    idx = torch.randint(0, 50257, (2, 16))
    mem = health.memory_by_phase(m, idx, opt)
    assert mem["grads"] == mem["params"]  # one fp32 gradient per fp32 parameter
    assert mem["optimizer_state"] == 2 * mem["params"]  # AdamW's two moments
    assert mem["activations"] > 0 and mem["batch"] == 2 * 2 * 16 * 8
    # activations are what autograd saved besides the parameters (a linear layer saves its weight too):
    # they grow with the batch, so twice the rows hold twice the bytes (up to the batch-free position ids)
    twice = health.memory_by_phase(m, torch.randint(0, 50257, (4, 16)), opt)["activations"]
    assert abs(twice - 2 * mem["activations"]) <= 1e-3 * mem["activations"], (twice, mem["activations"])


def test_health_measures_with_dropout_off_and_puts_the_mode_back():
    """A GPT is built in train mode: with dropout 0.1 the causality check saw logits before the changed token move
    by 0.68 (a false leak) and init_loss differed call to call."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", dropout=0.1))
    idx = torch.randint(0, model.config.vocab_size, (2, 17))
    assert model.training
    assert health.causality_violation(model, idx, 8)["max_change_before"] < 1e-5
    assert health.init_loss(model, idx)["loss"] == health.init_loss(model, idx)["loss"]
    assert model.training  # the caller's mode, put back
