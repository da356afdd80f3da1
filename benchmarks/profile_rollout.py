"""Where a GRPO rollout's time goes on a GPU (a diagnostic, not a test: pytest does not collect it).

    python benchmarks/profile_rollout.py [--rows 2048] [--new-tokens 128] [--decode cuda_graph]

Samples `rows` completions from a randomly initialised GPT-2 124M under bf16 autocast, prints
generated tokens/s, then profiles one more rollout and prints the CUDA kernels that took longest.
"""

from __future__ import annotations

import argparse
import time

import torch

from rookworld_lib.core.model import GPT, GPTConfig
from rookworld_lib.core.sampling import SamplingConfig, generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--decode", default="cuda_graph")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--attn-impl", default="sdpa", help="sdpa or math (explicit softmax(QK^T)V)")
    ap.add_argument("--pad-vocab", type=int, default=1, help="pad the vocabulary to a multiple of this")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("gpt2", attn_impl=args.attn_impl,
                                 pad_vocab_to_multiple=args.pad_vocab)).cuda().eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 50000, (args.prompt_len,), generator=g).tolist()
               for _ in range(args.rows // args.group_size)]
    cfg = SamplingConfig(max_new_tokens=args.new_tokens, num_samples=args.group_size, eos_id=-1, seed=0,
                         decode=args.decode)

    def rollout():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return generate(model, prompts, cfg)

    rollout()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ro = rollout()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    n = int(ro.mask.sum())
    print(f"{args.rows} rows x {args.new_tokens} tokens, decode={args.decode}, attn={args.attn_impl}, vocab "
          f"padded to x{args.pad_vocab}: {dt:.3f} s, {n / dt:,.0f} tok/s, "
          f"{dt / args.new_tokens * 1e3:.2f} ms per decode step")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        rollout()
        torch.cuda.synchronize()
    try:
        table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=args.top, max_name_column_width=60)
    except (AttributeError, KeyError, ValueError):  # older torch names it cuda time
        table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=args.top, max_name_column_width=60)
    print(table)


if __name__ == "__main__":
    main()
