// Layout measurement for scripts/check_rendered_book.sh. The script's HTTP server injects this
// file before </body> of every page it serves. Once the page has loaded, MathJax has typeset and
// the widgets have rendered, it measures what a reader would have to scroll sideways for, or
// cannot see at all, and writes the result as JSON into <pre id="rendered-book-measure" hidden>,
// which `chromium --dump-dom` then returns.
//
// The reading column is article.bd-article's content box. With every folded block (<details>)
// opened for the measurement (and MathJax's invisible assistive MathML out of the way), it reports:
//   code    each notebook code cell (div.cell_input pre): wide when its text is wider than its
//           box (scrollWidth > clientWidth + 1), i.e. it scrolls sideways, or when the box runs
//           past the column;
//   output  each visible item of a cell output (a child of div.cell_output: text in a pre, i.e.
//           stream, text/plain, stderr or code shown as output; table; image; widget; math):
//           wide when the item, or a scrolling or clipping box inside it, holds content wider
//           than its box, or when the item runs past the column;
//   math    each display equation (mjx-container[display="true"], the box that scrolls): wide
//           when the typeset equation is wider than that box, or when the box is cut by the
//           div.math around it (which hides overflow, so it never scrolls) or the column;
//   edge    every other element of the article (tables, code blocks outside cells, inline math,
//           figures, anything) that runs past the column's right edge, or that scrolls or clips
//           sideways with content wider than its box; outermost offenders only, and none that
//           is, holds or sits in an offender counted above;
//   image   every image drawn at less than half of its natural width (its text shrinks with it).
// Each offender comes with its nearest heading, its first characters, and its geometry.
(function () {
  "use strict";
  var OUT_ID = "rendered-book-measure";
  var SLACK = 1; // px: sub-pixel rounding
  var IMAGE_MIN_SCALE = 0.5;

  function sleep(ms) {
    return new Promise(function (r) { setTimeout(r, ms); });
  }

  function loaded() {
    if (document.readyState === "complete") return Promise.resolve();
    return new Promise(function (r) { window.addEventListener("load", function () { r(); }); });
  }

  function mathjaxDone() {
    var mj = window.MathJax;
    if (mj && mj.startup && mj.startup.promise) return mj.startup.promise.catch(function () {});
    return Promise.resolve();
  }

  // The widget manager (embed-amd.js) renders each widget view after load, asynchronously.
  async function widgetsDone() {
    var views = document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]').length;
    for (var i = 0; i < 50 && views > 0; i++) {
      if (document.querySelectorAll(".widget-subarea").length >= views) break;
      await sleep(100);
    }
  }

  function clean(text, n) {
    text = (text || "").replace(/\u00b6|#$/g, "").replace(/\s+/g, " ").trim();
    return text.length > n ? text.slice(0, n - 1) + "\u2026" : text;
  }

  // The nearest heading above el: the heading of the innermost section that holds it.
  function sectionOf(el) {
    for (var s = el; s && s !== document.body; s = s.parentElement) {
      if (s.tagName === "SECTION") {
        var h = s.querySelector(":scope > h1, :scope > h2, :scope > h3, :scope > h4, :scope > h5, :scope > h6");
        if (h) return clean(h.textContent, 80);
      }
    }
    return "(top)";
  }

  // The TeX source of a typeset equation (MathJax 3), else its assistive MathML's text.
  function texOf(mj) {
    try {
      var items = window.MathJax.startup.document.getMathItemsWithin(mj);
      if (items.length) return items[0].math;
    } catch (e) { /* not MathJax 3 */ }
    var assist = mj.querySelector("mjx-assistive-mml");
    return assist ? assist.textContent : mj.textContent;
  }

  function scrollsX(el) {
    var ox = getComputedStyle(el).overflowX;
    return ox === "auto" || ox === "scroll";
  }

  function clipsX(el) {
    var ox = getComputedStyle(el).overflowX;
    return ox !== "visible";
  }

  function overflowOf(el) {
    return el.scrollWidth - el.clientWidth;
  }

  function visible(el) {
    var r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0 && getComputedStyle(el).visibility !== "hidden";
  }

  function describe(el, kind, col, extra) {
    var r = el.getBoundingClientRect();
    var d = {
      kind: kind,
      section: sectionOf(el),
      text: clean(el.tagName === "IMG" ? (el.getAttribute("alt") || el.getAttribute("src")) : el.textContent, 60),
      tag: el.tagName.toLowerCase() + (el.className && typeof el.className === "string"
        ? "." + el.className.trim().split(/\s+/).slice(0, 3).join(".") : ""),
      top: Math.round(r.top + window.scrollY),
      left: Math.round(r.left + window.scrollX),
      width: Math.round(r.width),
      right_past_column: Math.round(r.right - col.right),
      folded: !!el.closest("details[data-rbm-opened]"),
    };
    for (var k in extra) d[k] = extra[k];
    return d;
  }

  // The scrolling or clipping boxes inside el (el included) whose content is wider than the box.
  function overflowingBoxes(el) {
    var found = [];
    var all = [el].concat(Array.prototype.slice.call(el.querySelectorAll("*")));
    for (var i = 0; i < all.length; i++) {
      var b = all[i];
      if (!visible(b) || !clipsX(b)) continue;
      if (b.tagName === "MJX-ASSISTIVE-MML") continue;
      var over = overflowOf(b);
      if (over > SLACK) found.push({ box: b, over: over });
    }
    return found;
  }

  function measure() {
    var article = document.querySelector("article.bd-article") || document.querySelector("[role=main]") || document.body;
    var opened = [];
    article.querySelectorAll("details:not([open])").forEach(function (d) {
      d.setAttribute("data-rbm-opened", "");
      d.open = true;
      opened.push(d);
    });
    // MathJax's assistive MathML (for screen readers) is clipped to nothing but still counts in
    // its box's scrollWidth: every inline formula would look cut off. Out of the way meanwhile.
    var hideAssistive = document.createElement("style");
    hideAssistive.textContent = "mjx-assistive-mml { display: none !important; }";
    document.head.appendChild(hideAssistive);
    var ar = article.getBoundingClientRect();
    var cs = getComputedStyle(article);
    var col = {
      left: ar.left + parseFloat(cs.paddingLeft) + parseFloat(cs.borderLeftWidth),
      right: ar.right - parseFloat(cs.paddingRight) - parseFloat(cs.borderRightWidth),
    };
    col.width = col.right - col.left;
    var res = {
      title: document.title,
      window: { inner: window.innerWidth, client: document.documentElement.clientWidth },
      column: { left: Math.round(col.left), width: Math.round(col.width) },
      code: { total: 0, wide: [] },
      output: { total: 0, types: {}, wide: [] },
      math: { total: 0, wide: [] },
      edge: { wide: [] },
      image: { total: 0, small: [] },
      page_scroll_x: document.documentElement.scrollWidth - document.documentElement.clientWidth,
    };
    var counted = new Set();

    // The width of one character of code, which decides how many columns fit: it depends on the
    // monospace font the machine has (DejaVu Sans Mono, Liberation Mono, Menlo, ...).
    var anyPre = article.querySelector("div.cell_input pre") || article.querySelector("pre");
    if (anyPre) {
      var probe = document.createElement("span");
      probe.textContent = "0".repeat(100);
      anyPre.appendChild(probe);
      res.code_char_px = Math.round(probe.getBoundingClientRect().width) / 100;
      res.code_columns = Math.floor((anyPre.clientWidth - parseFloat(getComputedStyle(anyPre).paddingLeft)
        - parseFloat(getComputedStyle(anyPre).paddingRight)) / (probe.getBoundingClientRect().width / 100));
      anyPre.removeChild(probe);
    }

    function pastColumn(el) {
      return el.getBoundingClientRect().right - col.right;
    }

    // Code cells.
    article.querySelectorAll("div.cell_input").forEach(function (ci) {
      var pre = ci.querySelector("pre");
      if (!pre) return;
      res.code.total += 1;
      var over = overflowOf(pre);
      var past = pastColumn(pre);
      if (over > SLACK || past > SLACK) {
        res.code.wide.push(describe(pre, "code", col, { overflow: over, content_width: pre.scrollWidth, box_width: pre.clientWidth }));
        counted.add(pre);
      }
    });

    // Cell outputs: each visible child of div.cell_output is one output item: text (a pre:
    // stream, text/plain, stderr, code shown as output), table, image, widget, math or other.
    function outputType(item) {
      if (item.classList.contains("widget-subarea") || item.querySelector(".widget-subarea")) return "widget";
      if (item.querySelector("pre") || item.tagName === "PRE") return "text";
      if (item.querySelector("table") || item.tagName === "TABLE") return "table";
      if (item.tagName === "IMG" || item.querySelector("img, svg")) return "image";
      if (item.querySelector("mjx-container")) return "math";
      return "other";
    }
    article.querySelectorAll("div.cell_output").forEach(function (co) {
      Array.prototype.forEach.call(co.children, function (item) {
        if (item.tagName === "SCRIPT" || item.tagName === "STYLE" || !visible(item)) return;
        var type = outputType(item);
        res.output.total += 1;
        res.output.types[type] = (res.output.types[type] || 0) + 1;
        var boxes = overflowingBoxes(item);
        var past = pastColumn(item);
        if (boxes.length || past > SLACK) {
          var over = boxes.reduce(function (m, b) { return Math.max(m, b.over); }, 0);
          var box = boxes.length ? boxes[0].box : item;
          res.output.wide.push(describe(item, "output", col, {
            type: type, overflow: over, content_width: box.scrollWidth, box_width: box.clientWidth,
            scroller: box === item ? "" : box.tagName.toLowerCase(),
          }));
          counted.add(item);
        }
      });
    });

    // Display equations: the mjx-container is the box that scrolls (overflow: auto); div.math
    // around it hides overflow, so a container wider than div.math is cut, never scrolled.
    article.querySelectorAll('mjx-container[display="true"]').forEach(function (mj) {
      if (!visible(mj)) return;
      res.math.total += 1;
      var over = overflowOf(mj);
      var r = mj.getBoundingClientRect();
      var clip = 0;
      for (var p = mj.parentElement; p && p !== article; p = p.parentElement) {
        if (clipsX(p)) clip = Math.max(clip, r.right - p.getBoundingClientRect().right);
      }
      var past = r.right - col.right;
      if (over > SLACK || clip > SLACK || past > SLACK) {
        res.math.wide.push(describe(mj, "math", col, {
          text: clean(texOf(mj), 60),
          overflow: over, clipped_by_parent: Math.round(clip), content_width: mj.scrollWidth, box_width: mj.clientWidth,
        }));
        counted.add(mj);
      }
    });

    // Anything past the column's right edge that no scrolling box inside the article holds.
    function walk(el) {
      for (var c = el.firstElementChild; c; c = c.nextElementSibling) {
        // MathJax's assistive MathML is clipped to nothing: screen readers only.
        if (c.tagName === "SCRIPT" || c.tagName === "STYLE" || c.tagName === "MJX-ASSISTIVE-MML" || c.id === OUT_ID) continue;
        if (!visible(c)) { if (getComputedStyle(c).display === "contents") walk(c); continue; }
        var past = pastColumn(c);
        var clips = clipsX(c);
        var over = clips ? overflowOf(c) : 0;
        if (past > SLACK || over > SLACK) {
          var already = false;
          counted.forEach(function (k) { if (k === c || k.contains(c) || c.contains(k)) already = true; });
          if (!already) {
            res.edge.wide.push(describe(c, "edge", col, {
              how: past > SLACK ? "past" : scrollsX(c) ? "scrolls" : "cut",
              overflow: over, content_width: c.scrollWidth, box_width: c.clientWidth,
            }));
          }
          continue; // its descendants are part of this offender
        }
        if (clips) {
          // Its own box holds its content, but a box inside it may still scroll: a code
          // block in a dropdown (sphinx-design cards hide overflow). The outermost such box
          // is the offender.
          var inner = overflowingBoxes(c).filter(function (o) { return o.box !== c; });
          inner.forEach(function (o) {
            var outer = inner.some(function (p) { return p.box !== o.box && p.box.contains(o.box); });
            var seen = false;
            counted.forEach(function (k) { if (k === o.box || k.contains(o.box) || o.box.contains(k)) seen = true; });
            if (outer || seen) return;
            res.edge.wide.push(describe(o.box, "edge", col, {
              how: scrollsX(o.box) ? "scrolls" : "cut",
              overflow: o.over, content_width: o.box.scrollWidth, box_width: o.box.clientWidth,
            }));
          });
          continue;
        }
        walk(c);
      }
    }
    walk(article);

    // Images drawn much smaller than their natural size.
    article.querySelectorAll("img").forEach(function (img) {
      if (!visible(img) || !img.naturalWidth) return;
      res.image.total += 1;
      var scale = img.getBoundingClientRect().width / img.naturalWidth;
      if (scale < IMAGE_MIN_SCALE) {
        res.image.small.push(describe(img, "image", col, {
          scale: Math.round(scale * 100) / 100, natural_width: img.naturalWidth,
          drawn_width: Math.round(img.getBoundingClientRect().width),
        }));
      }
    });

    hideAssistive.remove();
    opened.forEach(function (d) { d.open = false; d.removeAttribute("data-rbm-opened"); });
    return res;
  }

  function write(obj) {
    var pre = document.getElementById(OUT_ID) || document.createElement("pre");
    pre.id = OUT_ID;
    pre.hidden = true;
    pre.textContent = JSON.stringify(obj);
    document.body.appendChild(pre);
  }

  loaded()
    .then(mathjaxDone)
    .then(widgetsDone)
    .then(function () { return document.fonts ? document.fonts.ready : null; })
    .then(function () { return sleep(500); }) // layout settles (fonts, late reflows)
    .then(function () { write(measure()); })
    .catch(function (e) { write({ error: String(e && e.stack || e) }); });
})();
