#!/usr/bin/env python3
"""Render an HTML report in headless Chromium, save a screenshot, and check that it is not blank.

    python scripts/check_report_render.py SWEEP/report/report.html [--png shot.png]

Exit 0 when the page rendered with content (enough non-background pixels and more than one
colour), 1 when the screenshot is blank, 2 when Chromium is missing or fails. The browser runs
offline with background networking off, as on a machine with no network.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-quic")


def find_browser() -> str | None:
    return next((p for b in BROWSERS if (p := shutil.which(b))), None)


def screenshot(html: Path, png: Path, width: int = 1200, height: int = 2400, timeout: float = 120) -> None:
    browser = find_browser()
    if browser is None:
        raise FileNotFoundError("no Chromium found (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        cmd = [browser, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
               f"--screenshot={png}", html.resolve().as_uri()]
        subprocess.run(cmd, check=True, capture_output=True, timeout=timeout)


def blank_report(png: Path) -> dict:
    """Fraction of pixels that differ from the page background, and the number of distinct colours."""
    import matplotlib.image as mpimg
    import numpy as np

    img = mpimg.imread(str(png))[..., :3]
    flat = (img.reshape(-1, 3) * 255).round().astype(np.int32)
    background = np.median(flat, axis=0)
    ink = float((np.abs(flat - background).sum(axis=1) > 30).mean())
    colours = len(np.unique(flat[:: max(1, len(flat) // 200_000)], axis=0))
    return {"ink_fraction": ink, "colours": colours, "blank": ink < 0.01 or colours < 8}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("html", type=Path)
    ap.add_argument("--png", type=Path, help="where to keep the screenshot (default: next to the HTML)")
    args = ap.parse_args(argv)
    if not args.html.is_file():
        print(f"error: {args.html} is not a file", file=sys.stderr)
        return 2
    png = args.png or args.html.with_name(args.html.stem + "-screenshot.png")
    try:
        screenshot(args.html, png)
    except (FileNotFoundError, subprocess.SubprocessError) as err:
        print(f"error: Chromium could not render {args.html}: {err}", file=sys.stderr)
        return 2
    rep = blank_report(png)
    state = "BLANK" if rep["blank"] else "ok"
    print(f"{state}: {png} — {rep['ink_fraction']:.1%} of pixels drawn, {rep['colours']} colours")
    return 1 if rep["blank"] else 0


if __name__ == "__main__":
    sys.exit(main())
