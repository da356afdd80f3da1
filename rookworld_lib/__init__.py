"""rookworld_lib: a thin, inspectable library for GRPO on chess with GPT-2 language models.

Modules in pipeline order (each does one job; nothing here downloads anything at run time):

- data: ``engine`` (Stockfish pool) -> ``datagen`` (games, Stockfish labels, P:/A: records) ->
  ``data`` (the schema and the validating loader); ``convert`` (original RookWorld data into the
  same records); ``tasks`` (the P:/A: formats).
- tokens: ``tokenizer`` (offline GPT-2 BPE).
- model: ``model`` (GPT-2 and its Hugging Face format), ``lm_head_loss`` (fused head
  and loss), ``health`` (forward-pass checks).
- SFT: ``train_sft`` on ``trainer`` (the loop SFT and GRPO share), with ``train_utils``,
  ``checkpoint`` and ``distributed``.
- rollouts: ``sampling`` (batched, KV-cached generation and log-probs).
- rewards: ``rewards`` (verifiable policy and environment rewards, TRL reward functions);
  ``reward_examples`` (notebook 00's demonstrations of what each reward gives).
- loss: ``grpo`` (GRPO math), ``train_grpo`` (the GRPO loop).
- evaluation: ``evaluate`` (chess metrics with intervals).
- speed: ``perf`` (FLOPs, MFU), ``tuning`` (notebook 04's matrix), ``bench`` (against transformers/TRL).
- figures and runs: ``plots``, ``workflow`` (notebook 05's profiles), ``pipeline``, ``paths``,
  ``config`` (config fields, CLI options and notebook parameter checks), ``cli`` (the ``rookworld``
  command).
"""

__version__ = "0.1.0"
