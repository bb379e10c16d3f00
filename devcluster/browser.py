"""Headless Chromium (Debian's ``chromium``) for tests that look at a web UI the way a person would (issue 18).

Flags measured on this machine: without ``--virtual-time-budget`` Chromium captures MLflow's
loading placeholder, without ``--run-all-compositor-stages-before-draw`` the charts are blank. ``--no-sandbox``:
Chromium refuses to run as root otherwise (the test machine's user). A fresh ``--user-data-dir`` per call: no state
carries between captures.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from nuro.devcluster.install import ensure_packages

PACKAGE = {"chromium": "/usr/bin/chromium"}
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--virtual-time-budget=30000",
         "--run-all-compositor-stages-before-draw", "--window-size=1400,900")  # fmt: skip


def ensure_chromium() -> Path:
    """``chromium``, installed with apt-get (as root) when missing."""
    ensure_packages(packages=PACKAGE)
    return Path(shutil.which("chromium") or PACKAGE["chromium"])


def _run(url: str, *extra: str, timeout_s: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="nuro-chromium-") as profile:
        argv = [str(ensure_chromium()), *FLAGS, f"--user-data-dir={profile}", *extra, url]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)


def page_text(url: str, timeout_s: float = 90) -> str:
    """The rendered page's visible text (the DOM after its scripts ran, tags dropped, whitespace collapsed)."""
    res = _run(url, "--dump-dom", timeout_s=timeout_s)
    if res.returncode != 0:
        raise RuntimeError(f"chromium could not render {url}: {res.stderr[-1000:]}")
    body = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", res.stdout, flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body)))


def screenshot(url: str, out: Path, timeout_s: float = 90) -> Path:
    """A PNG of the rendered page at ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    res = _run(url, f"--screenshot={out}", timeout_s=timeout_s)
    if res.returncode != 0 or not out.exists():
        raise RuntimeError(f"chromium could not capture {url}: {res.stderr[-1000:]}")
    return out
