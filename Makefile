# The two commands a user needs: `make test` and `make run`. Both create or refresh .venv first
# and install Stockfish where it is missing.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The CPU build of torch 2.13.0 lies on these machines; a looser spec would pull GBs of CUDA wheels.
TORCH_SPEC ?= torch==2.13.0
PROFILE ?= auto
# pytest-xdist workers for `make test` (one per core on the 2-core machines; a notebook's cells stay on one worker)
TEST_WORKERS ?= 2

.PHONY: setup stockfish chromium test test-fast test-fault run lab docs-figures clean

setup: $(STAMP) stockfish chromium
	@# the library's own bytecode, refreshed where a source changed: where PYTHONDONTWRITEBYTECODE is set (as on the CI
	@# machines), every process would otherwise compile it anew (0.5 s of each CLI command, worker and kernel)
	@$(PY) -m compileall -q rookworld_lib
	@$(PY) -c 'import sys, torch, rookworld_lib; from rookworld_lib.chess.engine import find_stockfish; \
	print(f"make setup: done: .venv (python {sys.version.split()[0]}, torch {torch.__version__}, rookworld_lib {rookworld_lib.__version__},", \
	      f"kernel RookWorld (.venv)), Stockfish {find_stockfish()}; the CLI is .venv/bin/rookworld (or source .venv/bin/activate)")' 

$(STAMP): pyproject.toml uv-overrides.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# uv resolves the same versions as pip (pip freeze compared; less what uv-overrides.txt leaves out, which says
	@# why) and installs them in ~40 s instead of ~135 s; it
	@# is given pip's find-links (PIP_FIND_LINKS, else pip's config: where the CPU torch wheel lies). Bytecode is
	@# compiled at install, as pip does: where PYTHONDONTWRITEBYTECODE is set, every process would otherwise
	@# recompile torch. pip is the fallback.
	$(PY) -m pip install -q uv && UV_FIND_LINKS="$${PIP_FIND_LINKS:-$$($(PY) -m pip config get global.find-links 2>/dev/null)}" \
	  $(VENV)/bin/uv pip install -q --compile-bytecode --override uv-overrides.txt \
	  --python $(PY) "$(TORCH_SPEC)" -e ".[dev]" \
	  || { echo "uv failed: installing with pip" >&2; $(PY) -m pip install -q "$(TORCH_SPEC)" && $(PY) -m pip install -q -e ".[dev]"; }
	@# the notebooks' kernel, inside .venv (no per-user kernel that would point at one clone)
	$(PY) -m ipykernel install --sys-prefix --name rookworld --display-name "RookWorld (.venv)" >/dev/null
	@# JupyterLab saves widget state with the notebook: a saved notebook reopened shows its explorers, not "model not found"
	@mkdir -p $(VENV)/share/jupyter/lab/settings && echo '{"@jupyter-widgets/jupyterlab-manager:plugin": {"saveState": true}}' \
	  > $(VENV)/share/jupyter/lab/settings/overrides.json
	@touch $(STAMP)

stockfish:
	@if [ -n "$$STOCKFISH_PATH" ]; then \
	  [ -x "$$STOCKFISH_PATH" ] || { echo "STOCKFISH_PATH=$$STOCKFISH_PATH is not an executable file" >&2; exit 1; }; \
	elif command -v stockfish >/dev/null 2>&1 || [ -x /usr/games/stockfish ]; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "Installing Stockfish (Debian package)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq stockfish >/dev/null; \
	elif command -v apt-get >/dev/null 2>&1 && command -v sudo >/dev/null 2>&1; then \
	  echo "Installing Stockfish (Debian package, via sudo)"; \
	  sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq stockfish >/dev/null; \
	else \
	  echo "Stockfish is required but was not found and cannot be installed here." >&2; \
	  echo "Install it with 'sudo apt-get install -y stockfish' (Debian/Ubuntu)," >&2; \
	  echo "'conda install -c conda-forge stockfish', or 'brew install stockfish', or set STOCKFISH_PATH." >&2; \
	  exit 1; \
	fi

# Chromium renders the PNG copies of figures (kaleido) and runs the real-browser test (Playwright).
# Optional: where it cannot be installed, figures stay HTML-only and the browser test skips, saying why.
chromium:
	@if [ -n "$$CHROMIUM_PATH" ] || command -v chromium >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "Installing Chromium (Debian package)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	    || echo "Chromium could not be installed: PNG figures and the browser test are skipped" >&2; \
	else \
	  echo "Chromium not found (sudo apt-get install -y chromium, or set CHROMIUM_PATH): PNG figures and the browser test are skipped" >&2; \
	fi

# Lint (ruff), the layer contract (import-linter; both configured in pyproject.toml), then the library tests plus every numbered notebook
# under nbval, in one pytest run over TEST_WORKERS processes (pytest-xdist).
test: setup
	$(VENV)/bin/ruff check rookworld_lib tests notebooks
	$(VENV)/bin/lint-imports
	$(PY) -m pytest tests notebooks --nbval-lax -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test-fast: setup
	$(PY) -m pytest tests -p no:cacheprovider

test-fault: setup
	$(PY) -m pytest tests -m fault -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# Execute the numbered notebooks headless (papermill) into runs/<timestamp>/, with a report.
run: setup
	$(VENV)/bin/rookworld run --profile $(PROFILE)

# The learning-curve figures of docs/learning_curve.md, redrawn from docs/learning_curve.json.
docs-figures: setup
	$(PY) -c 'import json, shutil, tempfile; from rookworld_lib.lab.places import DOCS_DIR; \
	from rookworld_lib.lab.plots import learning_curve_figure, save_figure; \
	c = {k: v["rows"] for k, v in json.loads((DOCS_DIR / "learning_curve.json").read_text()).items()}; d = tempfile.mkdtemp(); \
	[shutil.copy(save_figure(learning_curve_figure(c, x=x), f"learning_curve_{x}", d).with_suffix(".png"), DOCS_DIR) \
	 for x in ("tokens", "train_wall_s")]'

# JupyterLab at the repository root: notebooks/ and runs/ (reports, executed notebooks, figures) side
# by side; the notebooks open on the 'RookWorld (.venv)' kernel. The git filter strips outputs on commit
# (.gitattributes already names it, so installing it changes no tracked file).
# as root (in a container, say) Jupyter refuses to start without --allow-root
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

lab: setup
	$(VENV)/bin/nbstripout --install --attributes .gitattributes
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=$(CURDIR) $(ALLOW_ROOT) notebooks/00_data_and_rewards.ipynb

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
