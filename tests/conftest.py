import os

import pytest
import torch

# Deterministic, CPU-friendly defaults for the whole suite: the cores are shared by pytest,
# Stockfish and the notebooks; under pytest-xdist (`make test` runs one worker per core, a test
# file or notebook per worker at a time) each worker computes on one thread.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def seeded():
    torch.manual_seed(0)
    return torch.Generator().manual_seed(0)
