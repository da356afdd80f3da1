"""Shared by every pytest run here, notebooks included: the test session's runs go to a temporary
folder, never into the repository's runs/.

Notebook 05 keeps each run under $ROOKWORLD_RUNS_DIR (runs/ by default) and notebook 06 explores the
newest one there. This hook runs before any test module imports the library, so the library in this
process and the kernels nbval and the browser test start (they inherit the environment) all use one
folder of this process's own (each pytest-xdist worker has one), removed when the session ends.
"""

import os
import shutil
import tempfile

_RUNS = tempfile.mkdtemp(prefix="rookworld-test-runs-")


def pytest_configure(config):
    os.environ["ROOKWORLD_RUNS_DIR"] = _RUNS


def pytest_unconfigure(config):
    shutil.rmtree(_RUNS, ignore_errors=True)
