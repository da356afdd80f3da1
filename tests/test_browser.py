"""The notebooks in a real browser: JupyterLab 4 on a free local port, driven by Chromium (Playwright).

nbval checks that a notebook's code runs; only a browser shows what a user sees: that the live
training curves grow while SFT runs (widget messages reach the page during a long cell), that the
explorers of notebook 06 answer a slider, and that the page logs no JavaScript errors. JupyterLab
serves copies of the notebooks from a temporary folder (the repository's stay untouched);
screenshots go to the test's tmp_path and to runs/browser-test/ (git-ignored).

Cost (2 cores, shared with a second pytest-xdist worker): one JupyterLab server and one Chromium
serve both tests (`make test` runs a file on one xdist worker); the kernels compute on one thread each, as the xdist workers do
(a second thread only spins against the browser's rendering). Notebooks 05 and 06 run on their defaults:
these tests are the session's runs of them, in place of nbval's (conftest.py).
"""

from __future__ import annotations

import json
import os
import platform
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rookworld_lib.chess import data
from rookworld_lib.core.paths import REPO_ROOT
from rookworld_lib.lab.places import NOTEBOOKS_DIR
from rookworld_lib.lab import explore

CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
SCREENSHOTS = REPO_ROOT / "runs" / "browser-test"  # for a person to look at (the session's runs are temporary)
# Chromium on a machine without internet: no sandbox (root in containers), no GPU, and none of the
# background fetches (component updates, sync, QUIC probes) that would flood refused connections.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
# JupyterLab settings for a test: every cell kept in the DOM (the default windowing leaves cells out
# of view out of the DOM), and no news or update checks (the machine is offline).
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                         "checkForUpdates": False},
}


# skipped as a module: one line in the summary says why
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover
    pytest.skip("browser tests skipped: playwright is not installed", allow_module_level=True)
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(f"browser tests skipped: no Chromium at {CHROMIUM} (make chromium, or set CHROMIUM_PATH)",
                allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on copies of the notebooks; yields (base url, token, notebooks folder)."""
    root = tmp_path_factory.mktemp("lab")
    nbs = root / "notebooks"
    # kernel-ipc-*: the sockets of a kernel running there with ipc transport (not copyable, not notebooks)
    shutil.copytree(NOTEBOOKS_DIR, nbs, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "kernel-ipc-*"))
    settings = root / "settings"
    for name, value in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(value))
    port, token = free_port(), secrets.token_hex(16)
    # the kernels inherit this environment: no progress file of an enclosing `rookworld run`; one
    # compute thread per kernel (on 2 busy cores a second one spin-waits: ~25% more kernel CPU)
    env = {k: v for k, v in os.environ.items() if k != "ROOKWORLD_PROGRESS"} | {
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"), "OMP_NUM_THREADS": "1"}
    log = (root / "lab.log").open("w")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "jupyter"), "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
         "--allow-root", "--ServerApp.terminals_enabled=False", "--LabApp.extension_manager=readonly",
         f"--ServerApp.root_dir={nbs}", f"--LabApp.user_settings_dir={settings}",
         f"--LabApp.workspaces_dir={root / 'workspaces'}", "--LabApp.news_url=None"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"jupyter lab exited: {(root / 'lab.log').read_text()[-2000:]}")
                time.sleep(0.5)
        else:
            pytest.fail("jupyter lab did not answer within 60 s")
        yield url, token, nbs
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def browser():
    """One Chromium for the module's tests (each gets a context of its own: no shared storage)."""
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(lab, browser):
    """A Chromium page; JavaScript console errors and uncaught page errors are collected in page.errors
    (none is ignored: a fresh Lab on these notebooks logs none). Its kernels are shut down after."""
    url, token, _ = lab
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.errors = []
    pg.on("console", lambda m: m.type == "error" and pg.errors.append(f"console: {m.text} ({m.location})"))
    pg.on("pageerror", lambda e: pg.errors.append(f"pageerror: {e}"))
    yield pg
    context.close()
    # two cores: the next test's kernel should not share them with this one's idle kernel
    for kernel in json.load(urllib.request.urlopen(f"{url}/api/kernels?token={token}")):
        urllib.request.urlopen(urllib.request.Request(f"{url}/api/kernels/{kernel['id']}?token={token}", method="DELETE"))


def screenshot(page, tmp_path, name: str, top=None) -> Path:
    """Save a screenshot (with the element `top` scrolled to the top of the notebook, if given) in
    tmp_path and copy it to runs/browser-test/; print both paths."""
    if top is not None:
        top.evaluate("e => e.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(300)  # let plotly redraw what scrolled into view
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, SCREENSHOTS / path.name)
    print(f"screenshot: {path} (copy: {SCREENSHOTS / path.name})")
    return path


def open_notebook(page, lab, name: str) -> None:
    url, token, _ = lab
    # a workspace of its own: restoring an earlier test's tabs would reopen notebooks whose saved widget
    # outputs name models of a kernel that is gone
    page.goto(f"{url}/lab/workspaces/{name.split('.')[0]}/tree/{name}?token={token}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=60_000)
    # the kernel is up when the status bar says so (the toolbar's indicator reads idle before it connects)
    page.wait_for_selector(".jp-StatusBar-Widget:has-text('| Idle')", timeout=120_000)
    # opened on the kernel whose Python the notebook names, it is not marked modified (JupyterLab writes the
    # kernel's language_info into the notebook; the tab shows a change where that differs from the file's)
    if json.loads((lab[2] / name).read_text())["metadata"]["language_info"]["version"] == platform.python_version():
        assert page.locator(".lm-TabBar-tab.jp-mod-dirty").count() == 0, f"{name} opens marked modified"


def run_all(page) -> None:
    page.click(".lm-MenuBar-item:has-text('Run')")
    page.click(".lm-Menu-item:has-text('Run All Cells')")
    page.wait_for_function("() => [...document.querySelectorAll('.jp-InputPrompt')]"
                           ".some(e => e.textContent.includes('*'))", timeout=30_000)


def running(page) -> bool:
    return page.evaluate("() => [...document.querySelectorAll('.jp-InputPrompt')].some(e => e.textContent.includes('*'))")


def wait_done(page, timeout_s: float) -> None:
    page.wait_for_function("() => ![...document.querySelectorAll('.jp-InputPrompt')]"
                           ".some(e => e.textContent.includes('*'))", timeout=timeout_s * 1000, polling=250)


def saved_errors(page, lab, name: str) -> list[str]:
    """Save the notebook, then read its error outputs from disk (what the user's file holds)."""
    page.keyboard.press("Control+s")
    path = lab[2] / name
    deadline, nb = time.time() + 30, None
    while time.time() < deadline:
        try:
            nb = json.loads(path.read_text())
        except json.JSONDecodeError:  # Jupyter writes the file in place: a read can catch it half written
            nb = None
        else:
            if any(c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code"):
                break
        time.sleep(0.25)
    assert nb is not None, f"{name} did not read back as JSON within 30 s of saving"
    errors = [f"cell {i}: {o['ename']}: {o['evalue']}" for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
              for o in c.get("outputs", []) if o["output_type"] == "error"]
    unrun = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and c.get("execution_count") is None]
    return errors + [f"cells {unrun} did not run"] * bool(unrun)


def cell_plots(page, marker: str) -> list[int]:
    """Marker points drawn in each plotly plot of the (first) code cell whose text holds `marker`."""
    return page.evaluate("(m) => { const c = [...document.querySelectorAll('.jp-CodeCell')].find(c => c.textContent.includes(m));"
                         " return c ? [...c.querySelectorAll('.js-plotly-plot')].map("
                         "p => p.querySelectorAll('.scatterlayer .points path').length) : null; }", marker)


# What a reader sees cut off: an output (table, figure, text) wider than the output area that holds
# it, or a table wider than 1280 px. [cell index, what, its width, the room it had].
OVERFLOWS = """() => {
  const found = [];
  document.querySelectorAll('.jp-CodeCell').forEach((cell, i) => {
    cell.querySelectorAll('.jp-OutputArea-output').forEach(out => {
      const room = out.clientWidth;
      out.querySelectorAll('table, .js-plotly-plot .main-svg').forEach(e => {
        const w = e.getBoundingClientRect().width;
        if (w > room + 1 || (e.tagName === 'TABLE' && w > 1280)) found.push([i, e.tagName.toLowerCase(), Math.round(w), room]);
      });
    });
  });
  return found;
}"""


def output_text(page, marker: str) -> str:
    """The text of the outputs of the (first) code cell whose source holds `marker`."""
    return page.evaluate("(m) => { const c = [...document.querySelectorAll('.jp-CodeCell')].find("
                         "c => c.querySelector('.jp-InputArea').textContent.includes(m));"
                         " return c ? c.querySelector('.jp-OutputArea').innerText : null; }", marker)


def parameters_cell(nb: dict) -> dict:
    return next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))


def parameter(notebook: Path, name: str):
    """A value of the notebook's parameters cell (with what the test injected)."""
    values = {}
    exec("".join(parameters_cell(json.loads(notebook.read_text()))["source"]), values)
    return values[name]


# Records, in the page, each point count the SFT live plot (the first plotly plot) reaches while the
# SFT cell runs: a MutationObserver sees the DOM after every widget update (each SFT step is one, and
# the page may get several at once), where a poll from the test process would see only some of them.
RECORD_SFT_COUNTS = """() => {
  window.sftCounts = [];
  let cell = null;
  window.sftObserver = new MutationObserver(() => {
    if (!cell || !cell.isConnected)
      cell = [...document.querySelectorAll('.jp-CodeCell')].find(c => c.textContent.includes('sft_curves = LiveCurves'));
    if (!cell || !cell.querySelector('.jp-InputPrompt').textContent.includes('*')) return;
    const plot = document.querySelector('.js-plotly-plot');
    const n = plot ? plot.querySelectorAll('.scatterlayer .points path').length : 0;
    const counts = window.sftCounts;
    if (n > 0 && n !== counts[counts.length - 1]) counts.push(n);
  });
  window.sftObserver.observe(document.body, {childList: true, subtree: true});
}"""


def test_notebook_05_live_curves_in_jupyterlab(lab, page, tmp_path):
    t0 = time.time()
    open_notebook(page, lab, "05_full_training.ipynb")
    page.evaluate(RECORD_SFT_COUNTS)
    run_all(page)
    # the SFT cell's live plot is the first plotly plot: the page records its point counts while SFT
    # runs; here, a screenshot once it shows a few points, and the end of SFT
    shot = None
    while running(page) and time.time() - t0 < 400:
        counts, sft_running = page.evaluate("() => [window.sftCounts, [...document.querySelectorAll('.jp-CodeCell')]"
                                            ".some(c => c.textContent.includes('sft_curves = LiveCurves')"
                                            " && c.querySelector('.jp-InputPrompt').textContent.includes('*'))]")
        if shot is None and sft_running and counts and counts[-1] >= 3:
            shot = screenshot(page, tmp_path, "05_mid_sft_live_curve", top=page.locator(".js-plotly-plot").first)
        if counts and not sft_running:
            break
        time.sleep(0.25)
    counts = page.evaluate("() => { window.sftObserver.disconnect(); return window.sftCounts; }")
    wait_done(page, timeout_s=600)
    # each training curve is shown once: when training ends, its static copy takes the live plot's place
    sft_plots, grpo_plots = cell_plots(page, "sft_curves = LiveCurves"), cell_plots(page, "grpo_curves = LiveCurves")
    screenshot(page, tmp_path, "05_end_grpo_curves", top=page.locator(".jp-CodeCell:has-text('grpo_curves = LiveCurves')"))
    print(f"notebook 05 in the browser: {time.time() - t0:.0f} s; live SFT plot point counts seen: {counts}")
    assert len(counts) >= 2 and counts == sorted(counts), f"the SFT plot did not grow while SFT ran: {counts}"
    assert len(sft_plots) == 1 and sft_plots[0] >= counts[-1], f"the SFT curves, once, with every point: {sft_plots}"
    assert len(grpo_plots) == 1 and grpo_plots[0] > 0, f"the GRPO curves, once, with points: {grpo_plots}"
    for i, section in enumerate(page.locator(".jp-CodeCell:has(.js-plotly-plot)").all()):
        screenshot(page, tmp_path, f"05_figure_{i}", top=section)
    assert page.evaluate(OVERFLOWS) == [], "outputs cut off at the right (cell, element, width, room)"
    assert saved_errors(page, lab, "05_full_training.ipynb") == []
    assert page.errors == []


def test_notebook_06_explorers(lab, page, tmp_path):
    name = "06_lab.ipynb"
    if not (lab[2] / name).exists():
        pytest.skip(f"{name} does not exist yet")
    t0 = time.time()
    open_notebook(page, lab, name)
    run_all(page)
    wait_done(page, timeout_s=400)
    assert saved_errors(page, lab, name) == []
    # on its defaults, 06 explores the run notebook 05 just made here: its model and its GRPO completions
    loaded = output_text(page, "explore.load_model(")
    runs = Path(os.environ["ROOKWORLD_RUNS_DIR"])
    run = explore.latest_run(runs)
    assert run is not None and f"run: {run}" in loaded and f"model: {run}/training/final" in loaded, loaded
    assert "completions.jsonl:" in output_text(page, "explore.RolloutBrowser(")
    trained, _ = explore.load_model(None, run)
    record = data.load_split("P", "test").records[:1]
    greedy = explore.PositionExplorer(trained, record, 0, max_new_tokens=32).greedy
    assert greedy != explore.PositionExplorer(explore.load_model()[0], record, 0, max_new_tokens=32).greedy
    explorer = page.locator(".rw-position-explorer").first
    explorer.scroll_into_view_if_needed()
    board = page.locator(".rw-board").first
    before = board.inner_html()
    handle = page.locator(".rw-position-slider .ui-slider-handle, .rw-position-slider .noUi-handle").first
    handle.focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_function("(b) => document.querySelector('.rw-board').innerHTML !== b", arg=before, timeout=30_000)
    assert "<svg" in board.inner_html()
    screenshot(page, tmp_path, "06_position_explorer", top=explorer)
    groups = page.locator(".rw-group-inspector").first
    rows = groups.locator(".rw-group-table tr.rw-completion")
    assert rows.count() == parameter(lab[2] / name, "group_size")
    assert all(re.search(r"-?\d+\.\d+", rows.nth(i).inner_text()) for i in range(rows.count()))  # each has a reward
    screenshot(page, tmp_path, "06_group_inspector", top=groups)
    screenshot(page, tmp_path, "06_rollout_browser", top=page.locator(".rw-rollout-browser").first)
    assert page.evaluate(OVERFLOWS) == [], "outputs cut off at the right (cell, element, width, room)"
    assert greedy.strip()[:12] in " ".join(explorer.inner_text().split()), "the explorer shows another model's answer"
    print(f"notebook 06 in the browser: {time.time() - t0:.0f} s")
    assert page.errors == []
    # reopened after the kernel is gone, the saved notebook shows its explorers (their saved widget
    # state), never "Error displaying widget: model not found"
    url, token, _ = lab
    for kernel in json.load(urllib.request.urlopen(f"{url}/api/kernels?token={token}")):
        urllib.request.urlopen(urllib.request.Request(f"{url}/api/kernels/{kernel['id']}?token={token}", method="DELETE"))
    page.goto(f"{url}/lab/workspaces/reopened/tree/{name}?token={token}")
    for view in (".rw-position-explorer .rw-board svg", ".rw-group-inspector", ".rw-rollout-browser"):
        page.wait_for_selector(view, timeout=60_000)  # each explorer drawn from its saved state
    screenshot(page, tmp_path, "06_reopened", top=page.locator(".rw-position-explorer").first)
    assert "model not found" not in page.locator(".jp-NotebookPanel").inner_text()


@pytest.mark.heavy
@pytest.mark.skipif(os.environ.get("ROOKWORLD_HEAVY") != "1", reason="heavy: set ROOKWORLD_HEAVY=1")
@pytest.mark.parametrize("name", ["00_data_and_rewards.ipynb", "01_tokenizer_inspection.ipynb",
                                  "02_forward_pass_health.ipynb", "03_grpo_sign_validation.ipynb",
                                  "04_mfu_tuning.ipynb"])
def test_every_other_notebook_runs_and_reads_in_jupyterlab(lab, page, tmp_path, name):
    """Notebooks 00-04 as a reader sees them on their defaults: no error, nothing cut off at the right
    of the page (tables at most 1280 px), a screenshot of every cell that draws a figure."""
    open_notebook(page, lab, name)
    run_all(page)
    wait_done(page, timeout_s=900)
    assert saved_errors(page, lab, name) == []
    for i, cell in enumerate(page.locator(".jp-CodeCell:has(.js-plotly-plot), .jp-CodeCell:has(img)").all()):
        screenshot(page, tmp_path, f"{name[:2]}_figure_{i}", top=cell)
    assert page.evaluate(OVERFLOWS) == [], "outputs cut off at the right (cell, element, width, room)"
    assert page.errors == []
