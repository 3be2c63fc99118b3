# The documentation site (Sphinx): the pages of docs/ in Markdown (MyST), the
# Python API from the package's docstrings (autodoc over build/python) and
# the C++ API from the public headers (Doxygen XML through Breathe).
# scripts/docs.sh builds it into build/docs/html with warnings as errors.
import os
import sys

root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
build = os.environ.get("KILN_BUILD_DIR", os.path.join(root, "build"))
sys.path.insert(0, os.path.join(build, "python"))

project = "kiln"
author = "the kiln authors"
copyright = "2026, the kiln authors"
extensions = ["myst_parser", "sphinx.ext.autodoc", "breathe"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", ".venv", "api/doxygen"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
html_theme = "furo"
html_title = "kiln"
breathe_projects = {"kiln": os.environ.get("KILN_DOXYGEN_XML", os.path.join(build, "docs", "xml"))}
breathe_default_project = "kiln"
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
nitpicky = False
