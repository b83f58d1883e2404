#!/usr/bin/env bash
# Visual check of the built book: serves _build/html on 127.0.0.1 and takes
# headless-Chromium screenshots of the landing page and chapter pages.
# It builds nothing: run `jupyter-book build -W .` first.
#
#   bash scripts/check_rendered_book.sh [OUTDIR] [PAGE ...]
#
# OUTDIR defaults to /tmp/book-shots. PAGEs are paths under _build/html; the
# default is index.html and chapters/01_rope_from_scratch.html. For each page it
# writes OUTDIR/<page>.png (1280 px wide) and OUTDIR/<page>.dom.html (the DOM
# after scripts ran), and prints what it found: rendered MathJax formulas,
# unrendered \( or $$ left in the text, rendered ipywidgets, and requests for
# files the book lacks. Hosts other than 127.0.0.1 are blocked (offline check).
# Exit status 1 if something is wrong.
# Look at the PNGs: equations should be typeset, widgets should show sliders,
# not empty boxes. Environment: BOOK_HTML (default <repo>/_build/html),
# CHROMIUM (default: first of chromium, chromium-browser, google-chrome found),
# PYTHON (default python3), WINDOW (default 1280,2400).
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
html="${BOOK_HTML:-$repo/_build/html}"
out="${1:-/tmp/book-shots}"
shift || true
pages=("$@")
[ ${#pages[@]} -gt 0 ] || pages=(index.html chapters/01_rope_from_scratch.html)
py="${PYTHON:-python3}"
window="${WINDOW:-1280,2400}"

if [ ! -f "$html/index.html" ]; then
  echo "no $html/index.html: build the book first (jupyter-book build -W .)" >&2
  exit 1
fi
browser="${CHROMIUM:-}"
if [ -z "$browser" ]; then
  for b in chromium chromium-browser google-chrome google-chrome-stable; do
    if command -v "$b" >/dev/null 2>&1; then browser="$b"; break; fi
  done
fi
if [ -z "$browser" ]; then
  echo "no chromium found (Debian/Ubuntu: apt-get install -y chromium), or set CHROMIUM=" >&2
  exit 1
fi
mkdir -p "$out"

port="$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$py" -m http.server "$port" --bind 127.0.0.1 --directory "$html" >"$out/http-server.log" 2>&1 &
server_pid=$!
profile="$(mktemp -d)"
cleanup() { kill "$server_pid" 2>/dev/null || true; rm -rf "$profile"; }
trap cleanup EXIT
for _ in $(seq 50); do
  if "$py" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/index.html', timeout=1)" 2>/dev/null; then
    break
  fi
  sleep 0.2
done

chrome() {
  # --virtual-time-budget lets MathJax and the widget manager finish before the shot;
  # --host-resolver-rules blocks every host but 127.0.0.1: the book must work offline.
  "$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --hide-scrollbars --user-data-dir="$profile" --virtual-time-budget=20000 \
    --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" \
    --window-size="$window" "$@" 2>>"$out/chromium.log"
}

status=0
for page in "${pages[@]}"; do
  name="$(echo "$page" | tr '/' '_')"
  name="${name%.html}"
  url="http://127.0.0.1:$port/$page"
  chrome --screenshot="$out/$name.png" "$url" >/dev/null
  chrome --dump-dom "$url" >"$out/$name.dom.html"
  "$py" - "$out/$name.dom.html" "$out/$name.png" "$page" <<'PY' || status=1
import re, sys
dom_path, png, page = sys.argv[1:]
dom = open(dom_path, encoding="utf-8").read()
# Text outside <script>/<style>/<pre>, to look for math that was not typeset.
text = re.sub(r"<(script|style|pre|textarea)\b.*?</\1>", "", dom, flags=re.S | re.I)
math = len(re.findall(r"<mjx-container\b", dom))
raw = len(re.findall(r"\\\(|\\\[|\$\$", re.sub(r"<[^>]+>", "", text)))
mjx_err = len(re.findall(r"<mjx-merror\b|data-mjx-error", dom))
views = len(re.findall(r"application/vnd\.jupyter\.widget-view\+json", dom))
rendered = len(re.findall(r'class="[^"]*\bwidget-subarea\b', dom))
sliders = len(re.findall(r'class="[^"]*\bwidget-(?:h|v)?slider\b', dom))
print(f"{page}: {png}")
print(f"  math typeset: {math}, raw TeX left: {raw}, MathJax errors: {mjx_err}")
print(f"  widget views: {views}, rendered: {rendered}, sliders: {sliders}")
bad = raw > 0 or mjx_err > 0 or rendered < views
if bad:
    print("  PROBLEM: untypeset math or widgets that did not render")
sys.exit(1 if bad else 0)
PY
done
# Files the pages asked for that the book does not have (favicon aside).
missing="$(grep -o '"GET [^"]*" 404' "$out/http-server.log" | grep -v favicon.ico | sort -u || true)"
if [ -n "$missing" ]; then
  echo "PROBLEM: requests for files missing from the built book:"
  echo "$missing" | sed 's/^/  /'
  status=1
fi
echo "screenshots in $out"
exit $status
