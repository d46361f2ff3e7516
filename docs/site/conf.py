"""Sphinx configuration of attnkit's API reference site: ``make docs`` (offline, warnings as errors).

The pages are generated first (:mod:`pages`): the README's sections, the reports, one page per registry
entry and the API pages; Sphinx then reads them with autodoc (Google-style docstrings via napoleon) and
myst-parser (Markdown). The theme is alabaster, which ships with Sphinx: nothing is downloaded.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pages  # noqa: E402

import attnkit  # noqa: E402

pages.generate()

project = "attnkit"
author = "The attnkit authors"
copyright = "the attnkit authors"
release = version = attnkit.__version__

root_doc = "generated/index"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode", "myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["generated/extra/**"]
html_extra_path = ["generated/extra"]
html_theme = "alabaster"
html_title = f"attnkit {release}"

autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
suppress_warnings = []
