"""Checks on the built Jupyter Book (``_build/html``).

These tests read the HTML that ``jupyter-book build -W .`` wrote; they build
nothing themselves and are skipped when the book has not been built. They check
that the landing page links every chapter in ``_toc.yml`` under its title, that
chapter pages have their images, and that MathJax and the ipywidgets manager are
served from the book's own ``_static/`` folder (the book must work offline).

Standard library + pytest + pyyaml (which comes with jupyter-book) only.
"""

from __future__ import annotations

import html
import json
import posixpath
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
INDEX = HTML / "index.html"
CHAPTER = HTML / "chapters" / "01_rope_from_scratch.html"

# Script tags that load these must point at local files: nothing from a CDN.
MATHJAX_MARKERS = ("mathjax", "tex-chtml", "tex-svg", "tex-mml")
WIDGET_MARKERS = ("require", "embed-amd", "html-manager", "jupyter-widgets")

_MD_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.+?)\s*#*\s*$")
_META_REFRESH = re.compile(
    r"""<meta[^>]+http-equiv=["']?refresh["']?[^>]*content=["'][^"']*url=([^"'>]+)""",
    re.IGNORECASE,
)


@pytest.fixture(scope="module", autouse=True)
def _require_built_book():
    if not INDEX.exists():
        pytest.skip("book not built: run `jupyter-book build -W .` first")


class _Page(HTMLParser):
    """Collects links (href, text), image sources, script sources, and text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[tuple[str, str]] = []
        self.imgs: list[str] = []
        self.scripts: list[str] = []
        self.text: list[str] = []
        self._a_href: str | None = None
        self._a_text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "a":
            self._a_href = a.get("href") or ""
            self._a_text = []
        elif tag == "img" and a.get("src"):
            self.imgs.append(a["src"])
        elif tag == "script" and a.get("src"):
            self.scripts.append(a["src"])

    def handle_endtag(self, tag):
        if tag == "a" and self._a_href is not None:
            self.links.append((self._a_href, " ".join("".join(self._a_text).split())))
            self._a_href = None

    def handle_data(self, data):
        self.text.append(data)
        if self._a_href is not None:
            self._a_text.append(data)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def _landing_page() -> Path:
    """index.html, or the page it redirects to (Jupyter Book writes a redirect
    to the root page of the table of contents)."""
    page = INDEX
    for _ in range(3):
        m = _META_REFRESH.search(page.read_text(encoding="utf-8"))
        if not m:
            return page
        page = (page.parent / unquote(html.unescape(m.group(1)).strip())).resolve()
        assert page.exists(), f"{INDEX} redirects to a missing page: {page}"
    return page


def _norm(text: str) -> str:
    """Lower-case words only, so Markdown/TeX markup and HTML rendering of a
    title compare equal (e.g. `code`, *em*, $x$ vs. \\(x\\))."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # [text](url) -> text
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


def _toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    files: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for key in ("parts", "chapters", "sections"):
                for child in node.get(key) or []:
                    walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(toc)
    return files


def _source(docname: str) -> Path:
    for suffix in ("", ".ipynb", ".md"):
        path = ROOT / f"{docname}{suffix}"
        if path.is_file():
            return path
    raise AssertionError(f"_toc.yml lists {docname!r} but no .ipynb or .md exists for it")


def _first_heading(lines) -> str | None:
    in_fence = False
    for line in lines:
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
            continue
        if not in_fence:
            m = _MD_HEADING.match(line)
            if m:
                return m.group(2)
    return None


def _title(docname: str) -> str:
    src = _source(docname)
    if src.suffix == ".ipynb":
        nb = json.loads(src.read_text(encoding="utf-8"))
        for cell in nb.get("cells", []):
            if cell.get("cell_type") == "markdown":
                source = cell.get("source", "")
                if isinstance(source, list):
                    source = "".join(source)
                heading = _first_heading(source.splitlines())
                if heading:
                    return heading
        raise AssertionError(f"{src} has no markdown heading to title it")
    text = src.read_text(encoding="utf-8")
    text = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.S)  # front matter
    heading = _first_heading(text.splitlines())
    assert heading, f"{src} has no markdown heading to title it"
    return heading


def _chapters() -> list[tuple[str, str]]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    root = toc.get("root")
    return [(f, _title(f)) for f in _toc_files() if f != root]


def _local_target(page: Path, src: str) -> Path | None:
    """The file a relative URL on `page` points at, or None if it is remote."""
    parts = urlsplit(src)
    if parts.scheme or parts.netloc or src.startswith("//"):
        return None
    rel = unquote(parts.path)
    if rel.startswith("/"):
        return HTML / rel.lstrip("/")
    return Path(posixpath.normpath((page.parent / rel).as_posix()))


def _check_local_scripts(page: Path, markers) -> list[str]:
    """Script srcs on `page` that match `markers`; asserts each is a local
    file under _static/ that exists."""
    found = []
    for src in _parse(page).scripts:
        if not any(m in src.lower() for m in markers):
            continue
        found.append(src)
        assert "cdn" not in src.lower() and "://" not in src and not src.startswith("//"), (
            f"{page.relative_to(HTML)} loads {src} from the network, not from the book"
        )
        target = _local_target(page, src)
        assert target is not None and "_static" in target.parts, (
            f"{page.relative_to(HTML)}: {src} is not under _static/"
        )
        assert target.is_file(), f"{page.relative_to(HTML)}: {src} -> missing {target}"
    return found


def _has_widget_state(docname: str) -> bool:
    src = _source(docname)
    if src.suffix != ".ipynb":
        return False
    nb = json.loads(src.read_text(encoding="utf-8"))
    state = nb.get("metadata", {}).get("widgets", {})
    state = state.get("application/vnd.jupyter.widget-state+json", {})
    return bool(state.get("state"))


def test_index_has_title_and_links_every_chapter():
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    landing = _landing_page()
    page = _parse(landing)
    text = " ".join(" ".join(page.text).split())
    assert config["title"] in text, f"book title {config['title']!r} not on {landing}"

    link_texts = {}
    for href, label in page.links:
        target = _local_target(landing, href)
        if target is not None:
            key = target.relative_to(HTML).as_posix() if target.is_relative_to(HTML) else None
            link_texts.setdefault(key, []).append(_norm(label))

    chapters = _chapters()
    assert chapters, "_toc.yml lists no chapters"
    for docname, title in chapters:
        key = f"{docname}.html"
        assert key in link_texts, f"landing page has no link to {key} ({title!r})"
        assert any(_norm(title) in label for label in link_texts[key]), (
            f"landing page links {key}, but not under its title {title!r}: {link_texts[key]}"
        )


def test_chapter_page_has_images_that_exist():
    assert CHAPTER.exists(), f"{CHAPTER} was not built"
    imgs = _parse(CHAPTER).imgs
    assert imgs, f"{CHAPTER.relative_to(HTML)} has no <img>"
    assert "<img" in CHAPTER.read_text(encoding="utf-8")
    for src in imgs:
        if src.startswith("data:"):
            continue
        target = _local_target(CHAPTER, src)
        assert target is not None, f"{CHAPTER.relative_to(HTML)} loads image {src} from the network"
        assert target.is_file(), f"{CHAPTER.relative_to(HTML)}: image {src} -> missing {target}"


def test_mathjax_is_served_locally():
    pages = [_landing_page(), CHAPTER] + [HTML / f"{d}.html" for d, _ in _chapters()]
    seen = []
    for page in dict.fromkeys(pages):
        if page.exists():
            seen += _check_local_scripts(page, MATHJAX_MARKERS)
    assert seen, "no page loads MathJax (expected on pages with equations)"


def test_widget_manager_is_served_locally():
    with_state = [d for d, _ in _chapters() if _has_widget_state(d)]
    if not with_state:
        pytest.skip("no chapter stores ipywidgets state, so no page loads the widget manager")
    for docname in with_state:
        page = HTML / f"{docname}.html"
        srcs = _check_local_scripts(page, WIDGET_MARKERS)
        assert any("embed-amd" in s for s in srcs), f"{page.relative_to(HTML)} has widget state but no embed-amd.js"
        assert any("require" in s for s in srcs), f"{page.relative_to(HTML)} has widget state but no require.js"
        body = page.read_text(encoding="utf-8")
        assert "application/vnd.jupyter.widget-state+json" in body, (
            f"{page.relative_to(HTML)}: widget state was not embedded"
        )
