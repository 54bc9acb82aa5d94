/* bootprof report: the summary's concurrency chart (busy CPUs and running rustc processes over time). Dragging
 * across it picks a time range for the rest of the page, as the process timeline does (a "bootprof:range" event
 * with [ns, ns] since the trace start; static/range.js); a range set elsewhere ("bootprof:range-set") is shaded
 * here. State for tests: the svg's data-pick ("<ns>-<ns>" or ""). */
(function () {
  "use strict";
  const svg = document.querySelector("svg.concurrency");
  if (!svg) return;
  const T0 = +svg.dataset.t0, T1 = +svg.dataset.t1, LEFT = +svg.dataset.left, PLOT = +svg.dataset.plot;
  const width = +svg.getAttribute("width");
  const pick = svg.querySelector("rect.pick");
  function xOf(ns) { return LEFT + (ns - T0) * PLOT / Math.max(T1 - T0, 1); }
  function nsOf(ev) {
    const r = svg.getBoundingClientRect();
    const px = (ev.clientX - r.left) * width / (r.width || width);
    return T0 + Math.min(Math.max(px - LEFT, 0), PLOT) * (T1 - T0) / PLOT;
  }
  function shade(range) {
    if (!range) { pick.setAttribute("width", 0); svg.dataset.pick = ""; return; }
    pick.setAttribute("x", xOf(range[0]).toFixed(1));
    pick.setAttribute("width", Math.max(xOf(range[1]) - xOf(range[0]), 1).toFixed(1));
    svg.dataset.pick = `${Math.round(range[0])}-${Math.round(range[1])}`;
  }
  let from = null;
  svg.addEventListener("mousedown", function (ev) { from = nsOf(ev); ev.preventDefault(); });
  window.addEventListener("mousemove", function (ev) {
    if (from === null) return;
    const to = nsOf(ev);
    shade([Math.min(from, to), Math.max(from, to)]);
  });
  window.addEventListener("mouseup", function (ev) {
    if (from === null) return;
    const to = nsOf(ev), a = Math.min(from, to), b = Math.max(from, to);
    from = null;
    const range = b - a > (T1 - T0) / 500 ? [a, b] : null;
    shade(range);
    // (through range.js, which tells every view, the process timeline too)
    if (window.bootprofRange) window.bootprofRange.set(range);
    else window.dispatchEvent(new CustomEvent("bootprof:range", {detail: range}));
  });
  window.addEventListener("bootprof:range-set", function (ev) { shade(ev.detail); });
})();
