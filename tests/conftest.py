import os

import pytest
import torch

# Deterministic, CPU-friendly defaults for the whole suite: the cores are shared by pytest,
# Stockfish and the notebooks; under pytest-xdist (`make test` runs one worker per core, a test
# file or notebook per worker at a time) each worker computes on one thread, and so do the processes
# it starts (nbval's kernels, CLI and kill-and-resume children) unless a test sets their threads: two
# workers whose children each spin two OpenMP threads on two cores ran notebook 04's matrix 7x slower.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
else:
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def seeded():
    torch.manual_seed(0)
    return torch.Generator().manual_seed(0)
