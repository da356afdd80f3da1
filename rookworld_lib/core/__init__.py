"""The core: GPT-2, tokenizer, sampling, GRPO math and the training loops; text and reward functions, no chess."""
