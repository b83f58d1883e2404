#!/usr/bin/env bash
# Check of the built book as a reader sees it: serves _build/html on 127.0.0.1, opens every book
# page in headless Chromium at a 1400 px window (scrollbars hidden: a 784 px text column) and
# measures its layout. It builds nothing: run
# `jupyter-book build -W .` first.
#
#   bash scripts/check_rendered_book.sh [OUTDIR] [PAGE ...]
#
# OUTDIR defaults to /tmp/book-shots. PAGEs are paths under _build/html; the default is every
# book page (index.html, book/*.html, chapters/*.html, ...; not genindex, py-modindex, search,
# _static, _sources, _images; a page that only redirects, as index.html does, is checked at its
# target). The server injects scripts/rendered_book_measure.js into each page; once MathJax has
# typeset and the widgets have rendered, it measures, with every folded block opened:
#   - code cells (div.cell_input pre) whose text is wider than their box (they scroll sideways);
#   - cell outputs (text, code, tables, images, math, widgets) wider than the column, or holding
#     a box that scrolls sideways;
#   - display equations (mjx-container[display="true"], the box that scrolls) wider than that box,
#     or cut off by the div.math around them;
#   - any other element (tables, code blocks outside cells, inline math, figures) that runs past
#     the right edge of the text column (article.bd-article), or scrolls or is cut off sideways;
#   - images drawn at less than half of their natural width (their text shrinks with them).
# It prints one line per page, every offender (page, section, first characters, by how much) and
# the totals, e.g. `wide code cells: 147 of 204`. It also checks, as before, that the math is
# typeset (no \( or $$ left, no MathJax errors), that every ipywidget rendered, and that no page
# asks for a file the book lacks. Hosts other than 127.0.0.1 are blocked (offline check).
# Exit status 1 if anything is found.
# OUTDIR gets <page>.png (a screenshot of the top of each page), <page>.dom.html (the DOM after
# scripts ran) and measure.json (every measurement); look at the PNGs too.
# Environment: BOOK_HTML (default <repo>/_build/html), CHROMIUM (default: first of chromium,
# chromium-browser, google-chrome found), PYTHON (default python3), WINDOW (default 1400,2400),
# JOBS (pages measured at once, default 4), SHOTS (0: no screenshots, default 1),
# SKIP_WITHOUT_BROWSER (1: with no Chromium, say the check was skipped and exit 0).
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
html="${BOOK_HTML:-$repo/_build/html}"
measure_js="$repo/scripts/rendered_book_measure.js"
out="${1:-/tmp/book-shots}"
shift || true
pages=("$@")
py="${PYTHON:-python3}"
window="${WINDOW:-1400,2400}"
jobs="${JOBS:-4}"
shots="${SHOTS:-1}"

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
if [ -z "$browser" ] && [ "${SKIP_WITHOUT_BROWSER:-0}" = 1 ]; then   # .ci/run's way
  echo "rendered book check skipped: no chromium (apt-get install -y chromium)"
  exit 0
fi
if [ -z "$browser" ]; then
  echo "no chromium found (Debian/Ubuntu: apt-get install -y chromium), or set CHROMIUM=" >&2
  exit 1
fi
mkdir -p "$out"
rm -f "$out"/*.dom.html "$out"/*.png "$out/measure.json"

# The book's pages; a page that only redirects (index.html -> book/intro.html) is replaced by its
# target.
if [ ${#pages[@]} -eq 0 ]; then
  mapfile -t pages < <("$py" - "$html" <<'PY'
import os, re, sys
root = sys.argv[1]
skip_dirs = {"_static", "_sources", "_images", "_downloads", "_panels_static", ".doctrees"}
skip_pages = {"genindex.html", "py-modindex.html", "search.html"}
pages = []
for d, dirs, files in os.walk(root):
    rel = os.path.relpath(d, root)
    dirs[:] = sorted(x for x in dirs if not (x in skip_dirs or x.startswith(".")))
    for f in sorted(files):
        if f.endswith(".html") and not (rel == "." and f in skip_pages):
            pages.append(os.path.normpath(os.path.join(rel, f)))
out = []
for p in pages:
    text = open(os.path.join(root, p), encoding="utf-8", errors="replace").read(4096)
    m = re.search(r'http-equiv="Refresh"\s+content="\d+;\s*url=([^"]+)"', text, re.I)
    if m and len(text) < 1024:
        p = os.path.normpath(os.path.join(os.path.dirname(p), m.group(1).split("#")[0]))
    if p not in out:
        out.append(p)
print("\n".join(out))
PY
)
fi

port="$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
# A static server that puts the measuring script before </body> of every HTML page it serves;
# its log (stderr) records every request, for the missing-files check below.
"$py" - "$port" "$html" "$measure_js" >"$out/http-server.log" 2>&1 <<'PY' &
import functools, http.server, io, sys
port, root, js_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
js = open(js_path, encoding="utf-8").read()
tag = ('<script id="rendered-book-measure-script">\n' + js.replace("</", "<\\/") + "\n</script>\n").encode()

class Handler(http.server.SimpleHTTPRequestHandler):
    def send_head(self):
        path = self.translate_path(self.path)
        if not path.endswith(".html"):
            return super().send_head()
        try:
            with open(path, "rb") as f:
                body = f.read()
        except OSError:
            return super().send_head()  # answers 404, logged
        i = body.rfind(b"</body>")
        body = body[:i] + tag + body[i:] if i >= 0 else body + tag
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)

handler = functools.partial(Handler, directory=root)
http.server.ThreadingHTTPServer(("127.0.0.1", port), handler).serve_forever()
PY
server_pid=$!
profiles="$(mktemp -d)"
cleanup() { kill "$server_pid" 2>/dev/null || true; rm -rf "$profiles"; }
trap cleanup EXIT
for _ in $(seq 50); do
  if "$py" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/index.html', timeout=1)" 2>/dev/null; then
    break
  fi
  sleep 0.2
done

chrome() {
  # $1: a profile directory of its own (pages are measured in parallel).
  # --virtual-time-budget lets MathJax, the widget manager and the measurement finish first;
  # --host-resolver-rules blocks every host but 127.0.0.1: the book must work offline.
  local profile="$1"
  shift
  "$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --hide-scrollbars --user-data-dir="$profile" --virtual-time-budget=20000 \
    --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" \
    --window-size="$window" "$@"
}

check_page() {
  local page="$1" name profile url
  name="$(echo "$page" | tr '/' '_')"
  name="${name%.html}"
  profile="$(mktemp -d -p "$profiles")"
  url="http://127.0.0.1:$port/$page"
  chrome "$profile" --dump-dom "$url" >"$out/$name.dom.html" 2>>"$out/chromium.$name.log" || true
  if [ "$shots" != 0 ]; then
    chrome "$profile" --screenshot="$out/$name.png" "$url" >/dev/null 2>>"$out/chromium.$name.log" || true
  fi
  rm -rf "$profile"
}

start=$SECONDS
# At most $jobs pages at once; wait for the page jobs only (the server is a job too).
page_pids=()
for page in "${pages[@]}"; do
  while [ "$(jobs -pr | wc -l)" -gt "$jobs" ]; do sleep 0.2; done
  check_page "$page" &
  page_pids+=($!)
done
for pid in "${page_pids[@]}"; do wait "$pid" || true; done
cat "$out"/chromium.*.log >"$out/chromium.log" 2>/dev/null || true
rm -f "$out"/chromium.*.log

status=0
"$py" - "$out" "${pages[@]}" <<'PY' || status=1
import html, json, os, re, sys
out, pages = sys.argv[1], sys.argv[2:]
MEASURE = re.compile(r'<pre id="rendered-book-measure"[^>]*>(\{.*?)</pre>', re.S)
INJECTED = re.compile(r'<script id="rendered-book-measure-script">.*?</script>', re.S)
KINDS = ("code", "output", "math", "edge", "image")
total = {k: [0, 0] for k in KINDS}
out_types, out_types_wide = {}, {}
offenders, problems, everything = [], [], {}
bad = False

def where(page, o):
    fold = " (folded)" if o.get("folded") else ""
    return f"{page} | {o['section']}{fold} | y={o['top']}"

for page in pages:
    name = page.replace("/", "_")
    name = name[: -len(".html")] if name.endswith(".html") else name
    dom_path = os.path.join(out, name + ".dom.html")
    dom = open(dom_path, encoding="utf-8").read() if os.path.exists(dom_path) else ""
    dom = INJECTED.sub("", dom)  # the measuring script itself, as the server injected it
    found = MEASURE.findall(dom)
    # Typeset math and widgets (the checks this script made before it measured layout).
    text = re.sub(r"<(script|style|pre|textarea)\b.*?</\1>", "", dom, flags=re.S | re.I)
    math = len(re.findall(r"<mjx-container\b", dom))
    raw = len(re.findall(r"\\\(|\\\[|\$\$", re.sub(r"<[^>]+>", "", text)))
    mjx_err = len(re.findall(r"<mjx-merror\b|data-mjx-error", dom))
    views = len(re.findall(r"application/vnd\.jupyter\.widget-view\+json", dom))
    rendered = len(re.findall(r'class="[^"]*\bwidget-subarea\b', dom))
    typeset = f"math typeset {math}, raw TeX {raw}, MathJax errors {mjx_err}; widgets rendered {rendered}/{views}"
    if raw > 0 or mjx_err > 0 or rendered < views:
        problems.append(f"{page}: untypeset math or widgets that did not render ({typeset})")
        bad = True
    m = json.loads(html.unescape(found[-1])) if found else {
        "error": "not measured: the page did not load, or its scripts did not finish in the time budget"}
    everything[page] = m
    if "error" in m:
        problems.append(f"{page}: {m['error']}")
        print(f"{page}: NOT MEASURED; {typeset}")
        bad = True
        continue
    counts = {"code": (len(m["code"]["wide"]), m["code"]["total"]),
              "output": (len(m["output"]["wide"]), m["output"]["total"]),
              "math": (len(m["math"]["wide"]), m["math"]["total"]),
              "edge": (len(m["edge"]["wide"]), 0),
              "image": (len(m["image"]["small"]), m["image"]["total"])}
    for k, (n, t) in counts.items():
        total[k][0] += n
        total[k][1] += t
    for t, n in m["output"]["types"].items():
        out_types[t] = out_types.get(t, 0) + n
    for x in m["output"]["wide"]:
        out_types_wide[x["type"]] = out_types_wide.get(x["type"], 0) + 1
    scroll = m["page_scroll_x"]
    print(f"{page}: wide code cells {counts['code'][0]}/{counts['code'][1]}, "
          f"wide outputs {counts['output'][0]}/{counts['output'][1]}, "
          f"clipped equations {counts['math'][0]}/{counts['math'][1]}, "
          f"other wide blocks {counts['edge'][0]}, "
          f"small images {counts['image'][0]}/{counts['image'][1]}; {typeset}"
          + (f"; THE PAGE scrolls sideways by {scroll} px" if scroll > 0 else ""))
    if scroll > 0:
        problems.append(f"{page}: the whole page scrolls sideways by {scroll} px")
    bad = bad or scroll > 0 or any(n for n, _ in counts.values())
    for x in m["code"]["wide"]:
        offenders.append(f"  wide code cell     {where(page, x)} | +{x['overflow']} px "
                         f"({x['content_width']} in {x['box_width']}) | {x['text']}")
    for x in m["output"]["wide"]:
        past = f", {x['right_past_column']} px past the column" if x["right_past_column"] > 1 else ""
        offenders.append(f"  wide output        {where(page, x)} | {x['type']} +{x['overflow']} px "
                         f"({x['content_width']} in {x['box_width']}{past}) | {x['text']}")
    for x in m["math"]["wide"]:
        how = (f"cut off by {x['clipped_by_parent']} px" if x["clipped_by_parent"] > 1 else
               f"scrolls by {x['overflow']} px ({x['content_width']} in {x['box_width']})")
        offenders.append(f"  clipped equation   {where(page, x)} | {how} | {x['text']}")
    for x in m["edge"]["wide"]:
        how = {"past": f"{x['right_past_column']} px past the column's right edge",
               "scrolls": f"scrolls by {x['overflow']} px ({x['content_width']} in {x['box_width']})",
               "cut": f"cut off by {x['overflow']} px ({x['content_width']} in {x['box_width']})"}[x["how"]]
        offenders.append(f"  wide block         {where(page, x)} | {x['tag']} {how} | {x['text']}")
    for x in m["image"]["small"]:
        offenders.append(f"  small image        {where(page, x)} | drawn at {x['scale']} of its size "
                         f"({x['drawn_width']} of {x['natural_width']} px) | {x['text']}")

with open(os.path.join(out, "measure.json"), "w", encoding="utf-8") as f:
    json.dump(everything, f, indent=1, ensure_ascii=False)
if offenders:
    print("offenders (page | section | y offset in the page | by how much | first characters):")
    print("\n".join(offenders))
for p in problems:
    print("PROBLEM: " + p)
measured = [m for m in everything.values() if "column" in m]
def uniq(key):
    return ", ".join(str(v) for v in sorted({key(m) for m in measured if key(m) is not None})) or "?"
print(f"pages: {len(pages)} ({len(measured)} measured), window {uniq(lambda m: m['window']['inner'])} px, "
      f"text column {uniq(lambda m: m['column']['width'])} px, code {uniq(lambda m: m.get('code_char_px'))} px "
      f"a character ({uniq(lambda m: m.get('code_columns'))} columns in a cell)")
by_type = ", ".join(f"{t} {out_types_wide.get(t, 0)} of {n}" for t, n in sorted(out_types.items()))
print(f"wide code cells: {total['code'][0]} of {total['code'][1]}")
print(f"wide outputs: {total['output'][0]} of {total['output'][1]} ({by_type})")
print(f"clipped equations: {total['math'][0]} of {total['math'][1]}")
print(f"other blocks past the column, scrolling or cut off (tables, code, ...): {total['edge'][0]}")
print(f"images drawn below half their natural width: {total['image'][0]} of {total['image'][1]}")
n = sum(v[0] for v in total.values())
print(f"layout problems in all: {n}" + (" (PROBLEM: a reader scrolls sideways, or misses content)" if n else ""))
sys.exit(1 if bad else 0)
PY
# Files the pages asked for that the book does not have (favicon aside).
missing="$(grep -o '"GET [^"]*" 404' "$out/http-server.log" | grep -v favicon.ico | sort -u || true)"
if [ -n "$missing" ]; then
  echo "PROBLEM: requests for files missing from the built book:"
  echo "$missing" | sed 's/^/  /'
  status=1
fi
echo "checked ${#pages[@]} pages in $((SECONDS - start)) s; screenshots, DOMs and measure.json in $out"
exit $status
