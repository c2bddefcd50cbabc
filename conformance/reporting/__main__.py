"""Re-render a report directory, or take screenshots of its index.html.

    python -m conformance.reporting render REPORT_DIR [--baseline-backend NAME] [--triage-file PATH]
    python -m conformance.reporting screenshot REPORT_DIR [--out DIR] [--width 1400] [--height 2400]

``render`` rewrites report.json's derived fields (summary, causes, replay paths relative to the directory),
the reproducers in ``failures/``, summary.md and index.html from report.json, with the renderers of this
installation: how a report from an older run, or one moved from another machine, gets today's layout.

``screenshot`` loads index.html in headless Chromium (Debian's ``chromium`` package) at the given width and
writes ``<out>/index-<width>.png`` of the top of the page and ``<out>/index-<width>-full.png`` of all of it,
to look at the page as a person would. It also prints the page's scroll width: wider than the window means
something overflows.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
# Appended to a copy of the page only: writes the page's layout width into the DOM that --dump-dom prints.
MEASURE = ("<script>document.documentElement.setAttribute('data-scroll-width',"
           "String(document.documentElement.scrollWidth));</script>")


def find_browser() -> str | None:
    return next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)


def _chromium(browser: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                   "--no-first-run", "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def scroll_width(page: Path, width: int, browser: str | None = None) -> int:
    """The layout width of ``page`` in a ``width``-pixel window: more than ``width`` means it overflows."""
    browser = browser or find_browser()
    if browser is None:
        raise RuntimeError("no Chromium found (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "page.html"
        copy.write_text(page.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"), encoding="utf-8")
        proc = _chromium(browser, f"--window-size={width},1000", "--dump-dom", copy.as_uri())
    found = re.search(r'data-scroll-width="(\d+)"', proc.stdout)
    if not found:
        raise RuntimeError(f"Chromium did not lay out the page: {proc.stderr[-500:]}")
    return int(found.group(1))


def screenshot(page: Path, out: Path, width: int, height: int, browser: str | None = None) -> Path:
    browser = browser or find_browser()
    if browser is None:
        raise RuntimeError("no Chromium found (Debian: apt-get install chromium)")
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = _chromium(browser, f"--window-size={width},{height}", f"--screenshot={out.resolve()}", page.resolve().as_uri())
    if not out.exists():
        raise RuntimeError(f"Chromium wrote no screenshot: {proc.stderr[-500:]}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.reporting", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("render", help="rewrite summary.md, index.html and failures/ from report.json")
    p.add_argument("report_dir", type=Path)
    p.add_argument("--baseline-backend", help="backend the speedups are measured against")
    p.add_argument("--triage-file", help="triage file: signatures -> label and upstream link")
    p = sub.add_parser("screenshot", help="screenshots of index.html in headless Chromium")
    p.add_argument("report_dir", type=Path)
    p.add_argument("--out", type=Path, help="directory of the PNGs (default: the report directory)")
    p.add_argument("--width", type=int, default=1400)
    p.add_argument("--height", type=int, default=2400, help="height of the full-page screenshot")
    ns = parser.parse_args(argv)
    if ns.command == "render":
        from .. import report as rp
        from ..cli import write_run_dir
        from .triage import TriageFileError, load_triage_file
        try:
            report = rp.load(ns.report_dir)
            if ns.triage_file:
                load_triage_file(ns.triage_file)
        except (rp.ReportError, TriageFileError) as exc:
            print(f"render: {exc}", file=sys.stderr)
            return 2
        regressions = (report.get("baseline") or {}).get("regressions")
        write_run_dir(ns.report_dir, report, regressions, baseline_backend=ns.baseline_backend,
                      triage_file=ns.triage_file)
        print(f"rendered {ns.report_dir / 'index.html'} and {ns.report_dir / 'summary.md'}")
        return 0
    page = ns.report_dir / "index.html"
    if not page.is_file():
        print(f"screenshot: {page} does not exist", file=sys.stderr)
        return 2
    out = ns.out or ns.report_dir
    try:
        top = screenshot(page, out / f"index-{ns.width}.png", ns.width, 900)
        full = screenshot(page, out / f"index-{ns.width}-full.png", ns.width, ns.height)
        width = scroll_width(page, ns.width)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"screenshot: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {top} and {full}; layout width {width} px in a {ns.width} px window"
          + (" (overflows)" if width > ns.width else ""))
    return 0 if width <= ns.width else 1


if __name__ == "__main__":
    sys.exit(main())
