// Part of ropetut (not vendored). Loaded just before embed-amd.js on pages that
// hold widgets: it tells the ipywidgets HTML manager where its Font Awesome
// files live (book/_static/jupyter-widgets/), so widget icons are served by the
// book itself instead of being looked up next to a CDN module URL.
(function () {
  var s = document.currentScript;
  if (s && s.src) {
    // s.src looks like ".../_static/widgets-assets-path.js?v=1234"
    window.__jupyter_widgets_assets_path__ =
      s.src.replace(/[?#].*$/, "").replace(/[^\/]*$/, "") + "jupyter-widgets/";
  }
})();
