// Part of ropetut (not vendored). Loaded after require.min.js and before
// embed-amd.js on pages that hold widgets (see nb_ipywidgets_js in _config.yml).
//
// embed-amd.js (the ipywidgets HTML manager) finds its Font Awesome files
// (widget icons) next to the URL RequireJS gives each of its modules; by default
// that is a folder beside the page, which does not exist. Point those module
// URLs, and the manager's asset path, at book/_static/jupyter-widgets/, where
// the font files are vendored, so the book serves them itself.
(function () {
  var s = document.currentScript;
  if (!s || !s.src || !window.requirejs) return;
  // s.src looks like ".../_static/widgets-require-config.js?v=1234"
  var base = s.src.replace(/[?#].*$/, "").replace(/[^\/]*$/, "");
  var dir = "jupyter-widgets/";
  window.__jupyter_widgets_assets_path__ = base + dir;
  window.requirejs.config({
    baseUrl: base,
    paths: {
      "@jupyter-widgets/base": dir + "base",
      "@jupyter-widgets/controls": dir + "controls",
      "@jupyter-widgets/html-manager": dir + "html-manager",
      "@jupyter-widgets/html-manager/dist/libembed-amd": dir + "libembed-amd"
    }
  });
})();
