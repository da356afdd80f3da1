"""Shared by every pytest run here, notebooks included: the test session's runs go to a temporary
folder, never into the repository's runs/, the library's cache is the session's own, and the notebooks
save their figures without PNG copies.

Notebook 05 keeps each run under $ROOKWORLD_RUNS_DIR (runs/ by default) and notebook 06 explores the
newest one there. This hook runs before any test module imports the library, so the library in this
process and the kernels nbval and the browser test start (they inherit the environment) all use one
folder of this process's own (each pytest-xdist worker has one), removed when the session ends.

$ROOKWORLD_PNG=0 (`plots.save_figure`): the PNG copy is all a kernel would start a browser for, about
5 s in each notebook. tests/test_plots.py renders PNGs itself, and test_pipeline.py a run's.
"""

import os
import shutil
import tempfile

import pytest

_RUNS = tempfile.mkdtemp(prefix="rookworld-test-runs-")
_CACHE_ENV = "ROOKWORLD_TEST_CACHE"


def pytest_configure(config):
    os.environ["ROOKWORLD_RUNS_DIR"] = _RUNS
    os.environ["ROOKWORLD_PNG"] = "0"
    # the library's cache (paths.cache_dir: the exports' tokenizer, the marks of data found valid) is the
    # session's own, made by the controller before its workers start (they inherit it), so that nothing an
    # earlier session or a user's runs left there decides what a test sees
    if _CACHE_ENV not in os.environ:
        os.environ[_CACHE_ENV] = tempfile.mkdtemp(prefix="rookworld-test-cache-")
    os.environ["XDG_CACHE_HOME"] = os.environ[_CACHE_ENV]


def pytest_unconfigure(config):
    shutil.rmtree(_RUNS, ignore_errors=True)
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller, after its workers
        shutil.rmtree(os.environ.pop(_CACHE_ENV), ignore_errors=True)


# The files that take 10 s or more in `make test` (pytest --durations=0 on 2 idle cores, 2026-11-28/29),
# longest first. `make test` (pytest-xdist, a file per worker, --no-loadscope-reorder) hands them
# out first, so that no long file is left for the end while the other worker idles; a stale list
# costs only wall time.
LONG_FILES = ("tests/test_faults.py", "tests/test_browser.py", "tests/test_faults_run.py", "tests/test_datagen.py",
              "notebooks/04_mfu_tuning.ipynb", "tests/test_faults_grpo.py", "tests/test_train_sft_distributed.py", "tests/test_data.py",
              "tests/test_pipeline.py", "tests/test_train_sft.py", "tests/test_distributed.py",
              "tests/test_fault_messages.py", "tests/test_figures_legible.py", "tests/test_sampling.py",
              "notebooks/02_forward_pass_health.ipynb")


@pytest.hookimpl(trylast=True)  # after -k / -m have deselected theirs
def pytest_collection_modifyitems(config, items):
    """Notebooks 05 and 06 run once per session: where the browser test runs one (in JupyterLab, on the
    same defaults, every cell checked for errors), nbval does not run it a second time. Without Chromium
    or Playwright that test module is skipped at collection, and nbval runs the notebooks.
    Then the LONG_FILES come first, longest first; every file keeps its own order of tests."""
    for test, notebook in (("test_notebook_05", "05_full_training.ipynb"), ("test_notebook_06", "06_lab.ipynb")):
        if any(item.nodeid.startswith(f"tests/test_browser.py::{test}") for item in items):
            twice = [item for item in items if item.nodeid.startswith(f"notebooks/{notebook}")]
            if twice:
                config.hook.pytest_deselected(items=twice)
                items[:] = [item for item in items if item not in twice]
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(LONG_FILES)))  # stable
