#!/usr/bin/env bash
# Builds the documentation site from docs/ into build/docs/html with Sphinx:
# the Markdown pages (MyST), the Python API from the package's docstrings
# (autodoc, importing build/python) and the C++ API from include/kiln/
# (Doxygen XML through Breathe). Warnings are errors: a link to a page or a
# heading that does not exist, a docstring that does not parse, a header
# that Breathe cannot render. CI runs it after the test suite.
#   bash scripts/docs.sh [--screenshot PNG]
# --screenshot also draws the home page with headless Chromium (Debian's
# chromium, installed when missing) into PNG.
set -euo pipefail
cd "$(dirname "$0")/.."
shot=""
if [ "${1:-}" = --screenshot ]; then
  shot=$(realpath -m "${2:?--screenshot needs a file name}")
fi
extra=(doxygen)
[ -n "$shot" ] && extra+=(chromium)
bash scripts/build.sh python/all  # the package that autodoc imports (scripts/setup.sh first)
bash scripts/setup.sh "${extra[@]}" > /dev/null
.venv/bin/pip install -q --disable-pip-version-check -r docs/requirements.txt
rm -rf build/docs
mkdir -p build/docs
(cat docs/Doxyfile; echo "OUTPUT_DIRECTORY = build/docs") | doxygen -
KILN_BUILD_DIR="$PWD/build" KILN_DOXYGEN_XML="$PWD/build/docs/xml" \
  .venv/bin/python -m sphinx -W --keep-going -q -b html docs build/docs/html
echo "docs: built build/docs/html/index.html ($(find build/docs/html -name '*.html' | wc -l) pages), no warnings"
if [ -n "$shot" ]; then
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1600 \
    --screenshot="$shot" "file://$PWD/build/docs/html/index.html" 2> /dev/null
  echo "docs: the home page drawn into $shot"
fi
