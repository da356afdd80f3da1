"""rookworld_lib: a thin, inspectable library for GRPO on chess with GPT-2 language models.

Three layers, each a package, importing only downward (checked by import-linter in `make test`):

- ``rookworld_lib.core``: text, tokens and models, no chess. GPT-2 and its Hugging Face format
  (``model``), the tokenizer and task vocabulary, the fused LM head, sampling, GRPO math (``grpo``),
  and the SFT and GRPO training loops (``train_sft``, ``train_grpo`` on ``trainer``) with their
  checkpoint, distributed and metrics support. GRPO takes reward functions with TRL's signature.
- ``rookworld_lib.chess``: the chess tasks on the core. Formats (``tasks``), the Stockfish engine,
  verifiable rewards, data generation, conversion of the original data, the evaluation suite, and
  ``training`` (chess on the core's trainers; ``rookworld sft`` / ``grpo``).
- ``rookworld_lib.lab``: profiles and ``rookworld run``, plots, explorers, performance tools
  (FLOPs, MFU, tuning, bench), forward-pass health, the ``rookworld`` CLI.

Nothing here downloads anything at run time. Importing this package imports no layer.
"""

__version__ = "0.1.0"
