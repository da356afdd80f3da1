"""rookworld_lib: a thin, inspectable library for GRPO on chess with GPT-2 language models.

Modules, one job each: tokenizer, model, sampling, tasks, engine, data, rewards, grpo, train,
evaluate, perf, checkpoint, plots, cli. Nothing here downloads anything at run time.
"""

__version__ = "0.1.0"
