"""Sphinx configuration: the spectest documentation (MyST Markdown pages, furo theme).

Build: ``pip install -e '.[docs]' && sphinx-build -W -n docs docs/_build/html`` (warnings are
errors, every cross-reference must resolve). Reference pages are generated from the code: options
from :data:`spectest.options.OPTIONS`, rules from :mod:`spectest.rules`, the results schema from
:data:`spectest.reporting.results.RESULTS_SCHEMA`, the CLI from its argument parsers
(sphinx-argparse), the API from docstrings (autodoc); the property-by-bug matrix is written by
``python -m tests.matrix`` and checked by the meta-tests.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

project = "spectest"
author = "the spectest developers"
extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
    "spectest_docs",
]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = "spectest"
autodoc_typehints = "none"  # types live in the signatures' docstrings; no network for intersphinx
autodoc_member_order = "bysource"
# Objects of other libraries (no intersphinx: CI reaches only the package registries).
nitpick_ignore_regex = [
    ("py:class", r"(torch|numpy|np|pytest|hypothesis|collections|typing|pathlib|argparse)\..*"),
    ("py:class", r"(Tensor|Generator|SearchStrategy|Callable|Any|Model|SamplingParams|EngineModel|PassRecord)"),
]
