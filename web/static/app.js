// Flightdeck web: the little behaviour htmx attributes cannot say under a strict CSP
// (htmx trigger filters like [document.visibilityState === 'visible'] need eval, which the CSP
// forbids). Vendored htmx: htmx.org 2.0.11, dist/htmx.min.js (see web/README.md).
"use strict";

// Pause polling while the tab is hidden: elements marked data-poll issue no request then.
document.addEventListener("htmx:beforeRequest", function (evt) {
  var elt = evt.detail && evt.detail.elt;
  if (document.visibilityState !== "visible" && elt && elt.hasAttribute("data-poll")) {
    evt.preventDefault();
  }
});

// After a cell's detail arrives, move keyboard focus to it so the reader lands on what they asked for.
document.addEventListener("htmx:afterSwap", function (evt) {
  var target = evt.detail && evt.detail.target;
  if (target && target.id === "cell-detail") {
    var heading = target.querySelector("#cell-heading");
    if (heading) { heading.focus(); }
  }
});
