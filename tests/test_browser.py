"""The notebooks in JupyterLab, in a real browser (Debian's Chromium driven by Playwright).

A JupyterLab server on 127.0.0.1 (a free port, a token) serves copies of the notebooks with small
parameters; each is opened in headless Chromium and run with Run > Run All Cells, as a person would.
Notebook 05 is the exception: tests/test_lab.py runs it with papermill and reads its runs closely (its
explorer, the doctor's, is the one checked here on notebook 06).
The test checks that the explorers were drawn in the page, that moving a slider or changing a picker
changes what they show, that the quickstart's live monitor updated while it trained and that its Stop
button ended the run (the notebook then went on). Each test is its notebook's run in the suite: it also
checks, in the notebook saved from the page, what nbval checks (every code cell ran, none raised), and
nbval's own run of that notebook is then left out (the root conftest.py). Screenshots go to
``runs/browser/``. The server, its kernels and the browser are ended whatever happens.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from asrlab.runner import declared_parameters, notebook_params

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "runs" / "browser"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return (
            "no Chromium on this machine: install Debian's (apt-get install -y chromium), which .ci/run does "
            "when it can; this test never downloads a browser of its own"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (pip install -e '.[dev]')"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")

# Small runs, the same nbval gets: each notebook's whole story in well under a minute on 2 cores
PARAMS = {
    p.stem: notebook_params(ROOT / "notebooks" / "params" / "small.yaml", p.stem, declared_parameters(p))
    for p in sorted((ROOT / "notebooks").glob("*.ipynb"))
}

ERRORS_JS = """() => [...document.querySelectorAll('.jp-OutputArea-output')].map(o => o.textContent)
  .filter(t => t.includes('Traceback (most recent call last)'))"""
DONE_JS = """() => {
  const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(p => p.textContent.trim());
  return prompts.length > 0 && prompts.every(t => /^\\[\\d+\\]:$/.test(t));
}"""
FIRST_RAN_JS = """() => {
  const p = document.querySelector('.jp-CodeCell .jp-InputArea-prompt');
  return p !== null && /^\\[\\d+\\]:$/.test(p.textContent.trim());
}"""
BUSY_JS = """() => [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].some(p => p.textContent.includes('*'))"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 serving the parameterized copies; yields (base URL, token, folder)."""
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    from asrlab.train.launch import kill_tree

    work = tmp_path_factory.mktemp("lab")
    for src in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = parameterize_notebook(load_notebook_node(str(src)), PARAMS[src.stem])
        nbformat.write(nb, work / src.name)
    settings = work / ".settings" / "@jupyterlab"
    # no news pop-up; the notebook's kernel starts without asking; every cell stays in the page (JupyterLab
    # otherwise skips drawing cells out of view, whose outputs then read empty)
    for ext, name, values in (
        ("apputils-extension", "notification", {"fetchNews": "false", "checkForUpdates": False}),
        ("notebook-extension", "tracker", {"autoStartDefaultKernel": True, "windowingMode": "none"}),
    ):
        (settings / ext).mkdir(parents=True, exist_ok=True)
        (settings / ext / f"{name}.jupyterlab-settings").write_text(json.dumps(values))
    port, token = _free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k != "ASRLAB_WIDGETS"}  # auto: widgets in a front end
    env.update(
        ASRLAB_RUNS=str(work / "runs"),
        ASRLAB_FIGURES=str(work / "figures"),
        PYTHONUNBUFFERED="1",
        JUPYTERLAB_SETTINGS_DIR=str(work / ".settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(work / ".workspaces"),
        JUPYTER_RUNTIME_DIR=str(work / ".runtime"),
    )
    log = open(work / "server.log", "w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={work}",
            "--ServerApp.allow_root=True",
            "--ServerApp.port_retries=0",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=work,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                assert server.poll() is None, (work / "server.log").read_text()[-2000:]
                assert time.time() < deadline, "JupyterLab did not answer in 90 s"
                time.sleep(0.5)
        yield base, token, work
    finally:
        kill_tree(server.pid)  # the server, its kernels and what they started
        server.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def browser(lab):
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(lab, browser):
    """A fresh page per notebook; afterwards the page is closed and every kernel shut down."""
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        yield pg
    finally:
        pg.close()
        end_sessions(lab)


def _api(lab, path: str, method: str = "GET", body: dict | None = None):
    base, token, _ = lab
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        f"{base}{path}?token={token}", data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read()
    return json.loads(text) if text else None


def end_sessions(lab) -> None:
    for s in _api(lab, "/api/sessions"):
        _api(lab, f"/api/sessions/{s['id']}", "DELETE")


def start_kernel(lab, name: str) -> str:
    """The notebook's session and kernel, started by the server before the page opens (the page finds
    the session by the notebook's path). Left to the page, JupyterLab may start a kernel and replace it a
    moment later while the page connects to the first one; cells then queue on a kernel that is gone."""
    session = _api(
        lab,
        "/api/sessions",
        "POST",
        {"path": f"{name}.ipynb", "name": f"{name}.ipynb", "type": "notebook", "kernel": {"name": "python3"}},
    )
    return session["kernel"]["id"]


def server_log(lab, chars: int = 3000) -> str:
    return (lab[2] / "server.log").read_text()[-chars:]


def kernel_of(lab, name: str) -> str | None:
    """The id of the kernel the server's session for this notebook runs, if any."""
    for s in _api(lab, "/api/sessions"):
        if s["path"].endswith(f"{name}.ipynb"):
            return s["kernel"]["id"]
    return None


def settled_kernel(lab, name: str, quiet_s: float = 5, timeout_s: float = 90) -> str:
    """The notebook's kernel once nothing changes it: the session's kernel and the only kernel running, the
    same for ``quiet_s``. JupyterLab may replace the kernel of a session just after the page has opened it
    (a kernel started, the first shut down a moment later); cells sent before that queue on a kernel that
    is gone."""
    deadline, seen, since = time.time() + timeout_s, None, time.time()
    while True:
        kernels = [k["id"] for k in _api(lab, "/api/kernels")]
        now = (kernel_of(lab, name), tuple(kernels))
        if now != seen:
            seen, since = now, time.time()
        elif now[0] is not None and kernels == [now[0]] and time.time() - since >= quiet_s:
            return now[0]
        assert time.time() < deadline, f"{name}: its kernel did not settle in {timeout_s} s: {seen}"
        time.sleep(0.5)


def open_and_run_all(page, lab, name: str) -> None:
    """Open the notebook in its own workspace and, once its kernel has settled, Run > Run All Cells, until
    its first code cell has run on that kernel.

    Should the first cell not run within 90 s, or the kernel have been replaced meanwhile, the sessions
    are ended and the notebook opened once more."""
    base, token, _ = lab
    for attempt in range(3):
        start_kernel(lab, name)
        page.goto(f"{base}/lab/workspaces/{name}/tree/{name}.ipynb?token={token}&reset")
        page.wait_for_selector(".jp-NotebookPanel", timeout=60_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
        if page.locator(".jp-Dialog").count():  # a kernel picker, should the session above not have been found
            page.locator(".jp-Dialog .jp-mod-accept").first.click()
        kernel = settled_kernel(lab, name)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        try:
            page.wait_for_function(FIRST_RAN_JS, timeout=90_000)
            ran = True
        except Exception:
            ran = False
        if ran and kernel_of(lab, name) == kernel:
            return
        page.screenshot(path=str(SHOTS / f"{name}_not_started_{attempt}.png"))
        page.keyboard.press("Escape")
        end_sessions(lab)
    pytest.fail(
        f"{name}: Run All did not run on a settled kernel (screenshots in {SHOTS}); the server said:\n"
        + server_log(lab)
    )


def wait_done(page, name: str, timeout_s: float) -> None:
    """Until every code cell has run; fails with the traceback as soon as a cell raised."""
    deadline, idle_since = time.time() + timeout_s, None
    while True:
        errors = page.evaluate(ERRORS_JS)
        if errors:
            page.screenshot(path=str(SHOTS / f"{name}_failed.png"), full_page=True)
            pytest.fail(f"{name} raised:\n" + "\n".join(errors)[-3000:])
        if page.evaluate(DONE_JS):
            return
        idle_since = None if page.evaluate(BUSY_JS) else (idle_since or time.time())
        assert idle_since is None or time.time() - idle_since < 10, f"{name}: nothing runs, yet not every cell ran"
        assert time.time() < deadline, f"{name} did not finish in {timeout_s} s"
        time.sleep(1)


def saved_and_clean(page, lab, name: str, timeout_s: float = 60) -> None:
    """What nbval checks, read from the notebook the page saves (File > Save Notebook): every code cell ran
    (it has an execution count) and none raised (no error output)."""
    path = lab[2] / f"{name}.ipynb"
    before, cells = path.stat().st_mtime_ns, len(nbformat.read(path, as_version=4).cells)
    page.get_by_role("menuitem", name="File", exact=True).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Save Notebook$")).first.click()
    deadline = time.time() + timeout_s
    saved = None  # until the file changed and was written to its end (not read between truncation and write)
    while saved is None:
        assert time.time() < deadline, f"{name}: the page did not save the notebook in {timeout_s} s"
        if path.stat().st_mtime_ns != before:
            try:
                saved = nbformat.read(path, as_version=4).cells
            except nbformat.reader.NotJSONError:
                pass
        if saved is None:
            time.sleep(0.3)
    assert len(saved) == cells, f"{name}: the saved notebook has {len(saved)} cells, the one served {cells}"
    code = [c for c in saved if c.cell_type == "code"]
    raised = [
        f"cell {i}: {o.ename}: {o.evalue}" for i, c in enumerate(code) for o in c.outputs if o.output_type == "error"
    ]
    assert not raised, f"{name}: " + "; ".join(raised)
    unrun = [i for i, c in enumerate(code) if c.execution_count is None]
    assert not unrun, f"{name}: code cells {unrun} of {len(code)} did not run"


def shown(locator):
    """``locator`` scrolled into view (JupyterLab skips drawing cells out of view, whose text then reads empty)."""
    locator.wait_for(timeout=60_000)
    locator.scroll_into_view_if_needed()
    return locator


def picture(locator) -> str:
    """The src of an explorer's image, once the browser has decoded it (a drawn figure, not an empty tag)."""
    img = locator.locator("img").first
    img.wait_for(state="visible", timeout=30_000)
    deadline = time.time() + 30  # a figure being swapped for the next is briefly undecoded: wait for it, not fail
    while not (src := img.evaluate("i => i.complete && i.naturalWidth > 0 ? i.getAttribute('src') : null")):
        assert time.time() < deadline, "the figure was not drawn"
        time.sleep(0.2)
    return src


def changes(page, read, act, what: str, timeout_s: float = 30, before=None) -> None:
    """``act()`` must change what ``read()`` returns (from ``before``, if given), within ``timeout_s``."""
    before = read() if before is None else before
    act()
    deadline = time.time() + timeout_s
    while read() == before:
        assert time.time() < deadline, f"{what}: nothing changed"
        time.sleep(0.3)


def slide(page, explorer, key: str = "Home") -> None:
    handle = explorer.locator(".noUi-handle").first
    handle.focus()
    page.keyboard.press(key)


def shoot(page, locator, name: str) -> None:
    locator.scroll_into_view_if_needed()
    locator.screenshot(path=str(SHOTS / f"{name}.png"))


@pytest.mark.executes_notebook("00_quickstart")
def test_quickstart_monitor_stop_button_and_utterance_browser(lab, page):
    open_and_run_all(page, lab, "00_quickstart")
    monitor = page.locator(".asrlab-monitor")
    try:
        monitor.wait_for(timeout=180_000)
    except Exception:
        page.screenshot(path=str(SHOTS / "00_quickstart_no_monitor.png"), full_page=True)
        pytest.fail("the monitor was not drawn in 180 s; the server said:\n" + server_log(lab))
    seen = []
    deadline = time.time() + 180
    while len({s for s in seen if "step <b>0</b>" not in s}) < 2:  # two redraws while it trains
        assert time.time() < deadline, f"the monitor did not update twice: {seen}"
        status = monitor.locator(".asrlab-monitor-status").inner_html()
        if "training" in status and (not seen or seen[-1] != status):
            seen.append(status)
        time.sleep(0.5)
    picture(monitor)
    shoot(page, monitor, "00_quickstart_monitor")
    monitor.get_by_role("button", name="Stop").click()
    wait_done(page, "00_quickstart", 300)
    saved_and_clean(page, lab, "00_quickstart")
    assert "stopped" in shown(monitor).locator(".asrlab-monitor-status").inner_text()
    results = json.loads((lab[2] / "runs" / "00_quickstart" / "results.json").read_text())
    assert 0 < results["steps"] < PARAMS["00_quickstart"]["max_steps"]  # the notebook went on with the model it had
    browser = shown(page.locator(".asrlab-utterances"))
    assert browser.locator("audio").count() == 1
    first = picture(browser)
    text = lambda: browser.locator("table.asrlab-utt").first.inner_text()  # noqa: E731
    changes(page, text, lambda: browser.locator("select").last.select_option(index=1), "picking another utterance")
    changes(page, lambda: picture(browser), lambda: None, "the fbank of the utterance picked", before=first)
    shoot(page, browser, "00_quickstart_utterances")


def explorer_after_run_all(page, lab, name: str, selector: str, timeout_s: float, says: str):
    """Run the notebook to its end (every cell run, none raised); its explorer ``selector``, in view, checked
    to say ``says``."""
    open_and_run_all(page, lab, name)
    wait_done(page, name, timeout_s)
    saved_and_clean(page, lab, name)
    explorer = shown(page.locator(selector).first)
    assert says in explorer.inner_text()
    return explorer


@pytest.mark.executes_notebook("01_stalls")
def test_stalls_explorer(lab, page):
    explorer = explorer_after_run_all(page, lab, "01_stalls", ".asrlab-stalls", 400, "finished its data")  # case A
    detail = lambda: explorer.locator(".asrlab-rank").inner_text()  # noqa: E731
    changes(page, detail, lambda: explorer.get_by_role("button", name="rank 1").click(), "picking rank 1")
    assert "MainThread" in detail()
    changes(page, lambda: picture(explorer), lambda: slide(page, explorer), "zooming the timeline")
    shoot(page, explorer, "01_stalls_explorer")


@pytest.mark.executes_notebook("02_gpu_utilization")
def test_sweep_explorer(lab, page):
    explorer = explorer_after_run_all(page, lab, "02_gpu_utilization", ".asrlab-sweep", 300, "recommended")
    changes(
        page,
        lambda: picture(explorer),
        lambda: explorer.locator("select").first.select_option(index=1),
        "picking another measure",
    )
    shoot(page, explorer, "02_gpu_utilization_explorer")


@pytest.mark.executes_notebook("03_nan_analysis")
def test_nan_explorer(lab, page):
    explorer = explorer_after_run_all(page, lab, "03_nan_analysis", ".asrlab-numerics", 400, "first non-finite step")
    picture(explorer)
    bars = lambda: explorer.locator("img").first.get_attribute("src")  # noqa: E731
    changes(page, bars, lambda: slide(page, explorer, "End"), "moving the step slider")
    trace = lambda: explorer.locator("img").last.get_attribute("src")  # noqa: E731
    changes(page, trace, lambda: explorer.locator("select").first.select_option(index=1), "picking another module")
    shoot(page, explorer, "03_nan_analysis_explorer")


@pytest.mark.executes_notebook("04_resume")
def test_resume_explorer(lab, page):
    explorer = explorer_after_run_all(
        page, lab, "04_resume", ".asrlab-resume", 300, "asrlab: seek to the saved position"
    )
    table = lambda: explorer.locator("table").inner_text()  # noqa: E731
    before = table()
    changes(page, lambda: picture(explorer), lambda: slide(page, explorer), "moving the step slider")
    # the figure and the table are two widgets updated one after the other: wait for the table too
    changes(page, table, lambda: None, "the table at the step picked", before=before)
    shoot(page, explorer, "04_resume_explorer")


@pytest.mark.executes_notebook("06_your_run")
def test_your_run_explorers(lab, page):
    explorer = explorer_after_run_all(page, lab, "06_your_run", ".asrlab-doctor", 400, "what asrlab doctor says")
    text = lambda: explorer.locator("pre").inner_text()  # noqa: E731
    assert text().startswith("STALLED: rank 1 has waited")  # the first run: a data worker hung
    changes(page, text, lambda: explorer.locator("select").first.select_option(label="a rank raises"), "picking a run")
    assert text().startswith("CRASHED: rank 1 failed")
    stalls = shown(page.locator(".asrlab-stalls").first)
    picture(stalls)  # each rank's phases over time, drawn
    detail = lambda: stalls.locator(".asrlab-rank").inner_text()  # noqa: E731
    changes(page, detail, lambda: stalls.get_by_role("button", name="rank 1").click(), "picking rank 1")
    shoot(page, explorer, "06_your_run_doctor")
    shoot(page, stalls, "06_your_run_stalls")
