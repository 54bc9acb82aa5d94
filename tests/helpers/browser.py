"""One headless Chromium for the whole test run, spoken to over the DevTools protocol (tornado's websocket, which
comes with dask); each use gets a page of its own in a browser context of its own (no storage, cache or history
shared with another test's page), closed after it.

Starting Chromium costs about a second here; the suite once started it about 30 times. A page in its own context
proves what a browser of its own proved."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import pytest

CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
#: The page size of a browser window the tests lay pages out in, unless a test asks for another.
WINDOW = (1300, 1000)


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium is not installed (Debian package 'chromium'; make system-deps installs it)")
    return path


class CDP:
    """A minimal Chrome DevTools Protocol client over one websocket."""

    def __init__(self, ws):
        self.ws, self.next_id = ws, 0
        self.events: list[dict] = []        # the events that came while waiting for answers
        self.dialogs: list[str] = []        # the messages of alerts the page raised (each dismissed at once)

    async def call(self, method: str, timeout: float = 60.0, **params):
        """Send ``method`` and wait up to ``timeout`` s for its answer (a page whose main thread is busy answers
        an evaluation only when it is done)."""
        self.next_id += 1
        await self.ws.write_message(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(await asyncio.wait_for(self.ws.read_message(), timeout))
            if "method" in msg:
                self.events.append(msg)
                if msg["method"] == "Page.javascriptDialogOpening":       # (an open alert would hold the page)
                    self.dialogs.append(msg["params"].get("message", ""))
                    await self.ws.write_message(json.dumps({"id": 10**9 + len(self.dialogs),
                                                            "method": "Page.handleJavaScriptDialog",
                                                            "params": {"accept": True}}))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def js(self, expression: str, timeout: float = 60.0):
        result = await self.call("Runtime.evaluate", timeout=timeout, expression=expression, returnByValue=True,
                                 awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def event(self, method: str, timeout: float = 60.0) -> dict:
        """Wait for the next event ``method`` (answers to no call)."""
        while True:
            found = next((e for e in self.events if e["method"] == method), None)
            if found is not None:
                self.events.remove(found)
                return found
            msg = json.loads(await asyncio.wait_for(self.ws.read_message(), timeout))
            if "method" in msg:
                self.events.append(msg)

    async def wait_for(self, expression: str, timeout: float = 30.0):
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while loop.time() < end:
            try:
                if await self.js(expression):
                    return
            except RuntimeError:  # the page is still loading (no document.body yet)
                pass
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {expression}")

    async def click(self, selector: str):
        """A real mouse click (press and release) at the centre of the element."""
        box = await self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                            f" e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect();"
                            f" return [r.x + Math.min(r.width / 2, 40), r.y + r.height / 2]; }})()")
        for kind in ("mousePressed", "mouseReleased"):
            await self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    async def load(self, url: str, budget_ms: int):
        """Navigate to ``url``, wait for its load, then let its timers run to the end of ``budget_ms`` of virtual
        time (no wall-clock wait: what a view does a second or more after load happens, as in ``--dump-dom
        --virtual-time-budget``)."""
        await self.call("Page.navigate", url=url)
        await self.wait_for("document.readyState === 'complete'")
        await self.call("Emulation.setVirtualTimePolicy", policy="pauseIfNetworkFetchesPending", budget=budget_ms)
        await self.event("Emulation.virtualTimeBudgetExpired")
        await self.call("Emulation.setVirtualTimePolicy", policy="advance")     # (real time again)

    async def dom(self) -> str:
        return await self.js("document.documentElement.outerHTML")

    async def screenshot(self, path: Path, full_page: bool = True):
        shot = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=full_page)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))


class Browser:
    """A headless Chromium started once; :meth:`run` gives a scenario a fresh page."""

    def __init__(self):
        self.profile = tempfile.mkdtemp(prefix="bootprof-chromium-")
        self.proc = subprocess.Popen([chromium(), *CHROME_FLAGS, f"--user-data-dir={self.profile}",
                                      "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
                                      "about:blank"], stderr=subprocess.PIPE, text=True, encoding="utf-8",
                                     errors="replace",
                                     # (its own temporary files go with the profile, not into the machine's /tmp)
                                     env=dict(os.environ, TMPDIR=self.profile))
        port = None
        for line in self.proc.stderr:
            m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if m:
                port = m.group(1)
                break
        if port is None:
            self.close()
            pytest.fail("chromium did not start its DevTools endpoint")
        # (what Chromium says later is read and dropped, so that a full pipe never holds it)
        import threading
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()
        self.http = f"http://127.0.0.1:{port}"
        version = json.loads(urllib.request.urlopen(f"{self.http}/json/version", timeout=30).read())
        self.ws_url = version["webSocketDebuggerUrl"]

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def run(self, scenario, window: tuple[int, int] = WINDOW):
        """``await scenario(cdp)`` against a fresh page (its own browser context) of ``window`` pixels."""
        from tornado.websocket import websocket_connect

        async def main():
            browser = CDP(await websocket_connect(self.ws_url, max_message_size=1 << 28))
            context = (await browser.call("Target.createBrowserContext"))["browserContextId"]
            target = (await browser.call("Target.createTarget", url="about:blank",
                                         browserContextId=context))["targetId"]
            try:
                page = CDP(await websocket_connect(f"{self.ws_url.split('/devtools/')[0]}/devtools/page/{target}",
                                                   max_message_size=1 << 28))
                try:
                    await page.call("Emulation.setDeviceMetricsOverride", width=window[0], height=window[1],
                                    deviceScaleFactor=1, mobile=False)
                    await page.call("Page.enable")
                    return await scenario(page)
                finally:
                    page.ws.close()
            finally:
                with contextlib.suppress(Exception):
                    await browser.call("Target.closeTarget", targetId=target)
                    await browser.call("Target.disposeBrowserContext", browserContextId=context)
                browser.ws.close()

        return asyncio.run(main())

    def dump_dom(self, url: str, window: tuple[int, int] = WINDOW, budget_ms: int = 10_000,
                 screenshot: Path | None = None) -> str:
        """The page's DOM once it has loaded and run ``budget_ms`` of virtual time (and its first screen saved to
        ``screenshot``)."""
        async def scenario(cdp: CDP) -> str:
            await cdp.load(url, budget_ms)
            if screenshot is not None:
                await cdp.screenshot(screenshot, full_page=False)
            return await cdp.dom()

        return self.run(scenario, window)


#: Where the tests keep what a person may want to look at after a run (screenshots of every report page).
ARTIFACTS = Path(__import__("os").environ.get("BOOTPROF_TEST_ARTIFACTS",
                                              Path(__file__).resolve().parents[2] / "runs" / "test-artifacts"))
#: Virtual milliseconds each page's timers run for after its load, before its errors are read.
VIRTUAL_MS = 5000


def pages_without_errors(browser: Browser, report_dir: Path, shots: str) -> dict[str, list[str]]:
    """Open every HTML page of a report: the errors each logged (exceptions, console errors, failed loads), by page;
    a full-page screenshot of each goes to ``ARTIFACTS/<shots>/<page>.png``."""
    out = ARTIFACTS / shots
    found: dict[str, list[str]] = {}

    async def scenario(cdp: CDP):
        for domain in ("Runtime", "Log"):
            await cdp.call(f"{domain}.enable")
        for page in sorted(report_dir.glob("*.html")):
            cdp.events.clear()
            # (the timers run to the end of a virtual time budget: what a view throws a second or more after load is
            # caught too; mutation once unseen: a page that threw at 1 s passed)
            await cdp.load(page.as_uri(), VIRTUAL_MS)
            await cdp.js("1")                   # (collects what the page logged meanwhile)
            errors = []
            for e in cdp.events:
                p = e.get("params", {})
                if e["method"] == "Runtime.exceptionThrown":
                    errors.append(p["exceptionDetails"].get("exception", {}).get("description") or p["exceptionDetails"]["text"])
                elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                    errors.append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
                elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
                    errors.append(p["entry"]["text"])
            found[page.name] = errors
            await cdp.screenshot(out / f"{page.stem}.png")

    browser.run(scenario)
    return found


SPEEDSCOPE = Path(__file__).resolve().parents[2] / ".venv" / "speedscope" / "node_modules" / "speedscope" / "dist" / "release"


def speedscope_titles(browser: Browser, files: list[Path], tmp_path: Path) -> dict[str, str | None]:
    """Open each file in speedscope (the npm package, which ``make test`` installs), both served over HTTP on loopback
    (``#profileURL=``); returns per file name the page title, which speedscope sets to ``<profile name> - speedscope``
    once it has imported the file, or ``alert: <message>`` when it raised an alert instead (a file it cannot
    import)."""
    import functools
    import http.server
    import threading

    if not (SPEEDSCOPE / "index.html").exists():
        pytest.fail(f"speedscope is not installed at {SPEEDSCOPE} (make test installs it with npm)")
    root = tmp_path / "served"
    root.mkdir()
    (root / "speedscope").symlink_to(SPEEDSCOPE, target_is_directory=True)
    for f in files:
        shutil.copyfile(f, root / f.name)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    titles: dict[str, str | None] = {}

    async def scenario(cdp: CDP):
        for f in files:
            cdp.dialogs.clear()
            await cdp.call("Page.navigate", url="about:blank")     # (a new document for each file, not a hash change)
            await cdp.wait_for("location.href === 'about:blank'")
            await cdp.call("Page.navigate", url=f"{base}/speedscope/index.html#profileURL={base}/{f.name}")
            # speedscope imports on the page's main thread, and an evaluation is answered only after that: each may
            # wait out the deadline
            loop = asyncio.get_running_loop()
            end, title = loop.time() + 300, None
            while loop.time() < end and not cdp.dialogs:
                title = await cdp.js("document.title", timeout=max(1.0, end - loop.time()))
                if title and title.endswith(" - speedscope"):
                    break
                await asyncio.sleep(0.1)
            titles[f.name] = f"alert: {cdp.dialogs[0]}" if cdp.dialogs else title

    try:
        browser.run(scenario)
        return titles
    finally:
        server.shutdown()
        server.server_close()
