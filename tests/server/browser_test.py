#!/usr/bin/env python3
"""The live page in Debian's Chromium, driven by playwright (no browser download: the
executable is /usr/bin/chromium, or QFLASH_CHROMIUM). A prompt is typed and generated; the text
streams in as spans coloured by token origin while tau, the accept profile and tokens/s update;
a screenshot is saved; the server is restarted and the page recovers by itself. No JavaScript
error at any time, and no console error except the refused connections while the server is down."""
import os
import time

from playwright.sync_api import sync_playwright

import pyserver

CHROMIUM = os.environ.get("QFLASH_CHROMIUM", "/usr/bin/chromium")


def main():
    a = pyserver.args()
    os.makedirs(a.out, exist_ok=True)
    port = pyserver.free_port()
    srv = pyserver.Server(a.server, port=port)
    res = pyserver.Results()
    console, page_errors = [], []
    down = []  # [start, end] of the outage

    def generate(page, max_tokens):
        page.fill("#prompt", "def parse_args(argv):\n")
        page.fill("#max-tokens", str(max_tokens))
        page.evaluate("""() => { window.__seen = [];
          new MutationObserver(() => window.__seen.push([document.getElementById('tokens').textContent,
                                                         document.getElementById('finish').textContent]))
            .observe(document.getElementById('tokens'), {childList: true, characterData: true, subtree: true}); }""")
        page.click("#go")
        page.wait_for_function("document.getElementById('finish').textContent !== '-'", timeout=120000)
        return page.evaluate("window.__seen")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.on("console", lambda m: console.append((time.time(), m.text)) if m.type == "error" else None)
        page.on("pageerror", lambda e: page_errors.append(str(e)))
        page.goto(srv.url + "/")

        def streams_coloured_tokens():
            page.wait_for_function("document.getElementById('status').textContent.includes('dflash2')", timeout=30000)
            seen = generate(page, 96)
            finish = page.text_content("#finish")
            assert finish in ("stop", "length"), finish
            # Updated while streaming: several token counts were shown before the finish was.
            counts = [int(t) for t, f in seen if f == "-" and t.isdigit()]
            assert len(set(counts)) >= 3, seen[:20]
            drafts, targets = page.locator("#output span.d").count(), page.locator("#output span.t").count()
            assert drafts > 0 and targets > 0, (drafts, targets)
            assert drafts + targets == int(page.text_content("#tokens")), (drafts, targets, page.text_content("#tokens"))
            assert float(page.text_content("#tau")) > 1.0
            assert float(page.text_content("#tps")) > 0
            assert page.locator("#profile div").count() >= 1
            page.screenshot(path=os.path.join(a.out, "live_page.png"), full_page=True)

        def survives_restart():
            down.append(time.time())
            srv.stop()
            page.wait_for_selector("#status.offline", timeout=15000)
            nonlocal_srv[0] = pyserver.Server(a.server, port=port)
            down.append(time.time())
            page.wait_for_function("!document.getElementById('status').classList.contains('offline') && "
                                   "document.getElementById('status').textContent.includes('dflash2')", timeout=15000)
            generate(page, 16)
            assert page.text_content("#finish") in ("stop", "length")
            assert page.locator("#output span").count() > 0

        def no_errors():
            assert not page_errors, page_errors
            outside = [m for t, m in console if not (len(down) == 2 and down[0] <= t <= down[1] + 3)]
            during = [m for t, m in console if m not in outside]
            assert not outside, outside
            assert all("ERR_CONNECTION_REFUSED" in m or "Failed to load resource" in m for m in during), during

        nonlocal_srv = [None]
        try:
            res.run("streams_coloured_tokens", streams_coloured_tokens)
            res.run("survives_restart", survives_restart)
            res.run("no_console_errors", no_errors)
        finally:
            browser.close()
            srv.stop()
            if nonlocal_srv[0]:
                nonlocal_srv[0].stop()
    res.finish()


if __name__ == "__main__":
    main()
