import os

import pytest
import torch

# Deterministic, CPU-friendly defaults for the whole suite: two cores are shared by pytest,
# Stockfish and the notebooks.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def seeded():
    torch.manual_seed(0)
    return torch.Generator().manual_seed(0)
