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

// The timeline opens on the stuck collective: the grid scrolls so that its column sits in the
// middle of what is visible beside the rank labels (which stay put, see web.css). Once the reader
// scrolls the grid, the live refresh keeps their position; paging or another group starts over.
var readerScroll = null;
var placedScroll = null;

function placeGrid() {
  var wrap = document.querySelector(".grid-wrap");
  if (!wrap) { return; }
  if (readerScroll !== null) {
    wrap.scrollLeft = readerScroll;
  } else {
    var stuck = wrap.querySelector("th.seq.stuck");
    if (stuck) {
      var labels = wrap.querySelector("thead th.who");
      var labelsWidth = labels ? labels.getBoundingClientRect().width : 0;
      var w = wrap.getBoundingClientRect(), s = stuck.getBoundingClientRect();
      var visible = wrap.clientWidth - labelsWidth;
      var offset = s.left - w.left - labelsWidth - (visible - s.width) / 2;
      wrap.scrollLeft = Math.max(0, wrap.scrollLeft + offset);
    }
  }
  placedScroll = wrap.scrollLeft;
  wrap.addEventListener("scroll", function () {
    // Our own placement fires a scroll event too: only a different position is the reader's.
    if (placedScroll === null || Math.abs(wrap.scrollLeft - placedScroll) >= 1) {
      readerScroll = wrap.scrollLeft;
      placedScroll = null;
    }
  });
}

document.addEventListener("DOMContentLoaded", placeGrid);
document.addEventListener("htmx:beforeRequest", function (evt) {
  var elt = evt.detail && evt.detail.elt;
  if (elt && elt.id !== "live") { readerScroll = null; }  // paging, a view, a group: a new window
});
document.addEventListener("htmx:afterSettle", function (evt) {
  var target = evt.detail && evt.detail.target;
  if (target && target.id !== "cell-detail") { placeGrid(); }
});
