"""The documentation site builds with warnings as errors, as `make docs` builds it: every page in
the nav, every link between pages, every included results file and every API reference page."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_docs_build_strictly(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's end-of-life banner
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (site / "index.html").is_file()
    assert (site / "methods" / "index.html").is_file()
    # Docstring tables render as tables: the hook table a method author reads, the Swin key map
    assert "<td><code>server_step</code></td>" in (site / "reference" / "methods" / "index.html").read_text()
    assert (
        "<td><code>patch_embed.norm.*</code></td>"
        in (site / "reference" / "models" / "index.html").read_text()
    )
