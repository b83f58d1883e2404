#!/usr/bin/env bash
# Re-create the vendored browser assets in book/_static/ (MathJax 3, RequireJS,
# the ipywidgets HTML manager) so the built book loads nothing from a CDN.
# Needs node/npm and network access to the npm registry. Run from anywhere:
#   bash scripts/vendor_book_assets.sh
# See book/_static/VENDORED.md for what is copied and under which license.
set -euo pipefail

MATHJAX_VERSION=3.2.2
REQUIREJS_VERSION=2.3.8
HTML_MANAGER_VERSION=1.0.6     # the version myst-nb 1.x points its CDN default at
TERSER_VERSION=5.36.0

repo="$(cd "$(dirname "$0")/.." && pwd)"
static="$repo/book/_static"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cd "$work"
npm pack --silent "mathjax@$MATHJAX_VERSION" "requirejs@$REQUIREJS_VERSION" \
  "@jupyter-widgets/html-manager@$HTML_MANAGER_VERSION" >/dev/null
for f in *.tgz; do mkdir -p "${f%.tgz}" && tar xzf "$f" -C "${f%.tgz}"; done
mj="$work/mathjax-$MATHJAX_VERSION/package"
rq="$work/requirejs-$REQUIREJS_VERSION/package"
hm="$work/jupyter-widgets-html-manager-$HTML_MANAGER_VERSION/package"

# MathJax: the TeX->CommonHTML combined component, the woff-v2 fonts it loads,
# and the TeX extensions its autoloader may fetch on demand (not all-packages.js).
rm -rf "$static/mathjax"
mkdir -p "$static/mathjax/output/chtml/fonts" "$static/mathjax/input/tex/extensions"
cp "$mj/es5/tex-chtml.js" "$static/mathjax/"
cp -r "$mj/es5/output/chtml/fonts/woff-v2" "$static/mathjax/output/chtml/fonts/"
find "$mj/es5/input/tex/extensions" -maxdepth 1 -name '*.js' ! -name all-packages.js \
  -exec cp {} "$static/mathjax/input/tex/extensions/" \;
cp "$mj/LICENSE" "$static/mathjax/LICENSE"

# RequireJS (AMD loader the widget bundle needs), minified; terser keeps the @license header.
npm exec --yes --package "terser@$TERSER_VERSION" -- \
  terser "$rq/require.js" --compress --mangle --comments some -o "$static/require.min.js"

# ipywidgets HTML manager (AMD build: base + controls + output + html-manager in one file)
# and the Font Awesome woff2 files its CSS references (for widget icons).
rm -rf "$static/jupyter-widgets"
mkdir -p "$static/jupyter-widgets"
cp "$hm/dist/embed-amd.js" "$static/embed-amd.js"
cp "$hm/dist/"*.woff2 "$static/jupyter-widgets/"
cp "$hm/LICENSE" "$static/jupyter-widgets/LICENSE"
cp "$hm/dist/embed.js.LICENSE.txt" "$static/jupyter-widgets/THIRD-PARTY-LICENSES.txt"

du -sh "$static"
