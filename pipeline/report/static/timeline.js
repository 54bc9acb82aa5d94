/* bootprof process timeline (the report's Processes section): fold and zoom the SVG that processes.py draws.
 *
 * Rows are processes in tree order (parents before their children). Clicking the name of a row marked with
 * a triangle folds its descendants away (and unfolds them again); the rows below move up. Dragging across
 * the bars picks a time range: the bars are redrawn for that range, the tick labels follow, and the range goes
 * to the rest of the page (a "bootprof:range" event with [ns, ns] since the trace start, or null for the whole
 * build; static/range.js). "whole build" goes back. A range set elsewhere ("bootprof:range-set") zooms the bars. State for tests and links: the svg's data-view ("<ns>-<ns>").
 */
(function () {
  "use strict";
  const svg = document.querySelector("svg.timeline");
  if (!svg) return;
  const T0 = +svg.dataset.t0, T1 = +svg.dataset.t1, LABEL = +svg.dataset.label, ROW = +svg.dataset.row;
  const width = +svg.getAttribute("width");
  const rows = [...svg.querySelectorAll("g.proc")];
  const pick = svg.querySelector("rect.pick");
  const text = document.querySelector(".timeline-text");
  const intro = text ? text.textContent : "";
  const folded = new Set();
  let view = [T0, T1];

  const byKey = new Map(rows.map((g) => [g.dataset.key, g]));
  function hiddenBy(g) {                     // a folded ancestor hides the row
    for (let p = g.dataset.parent; p !== ""; ) {
      if (folded.has(p)) return true;
      const up = byKey.get(p);
      p = up ? up.dataset.parent : "";
    }
    return false;
  }
  function layout() {
    let n = 0;
    for (const g of rows) {
      const hide = hiddenBy(g);
      g.style.display = hide ? "none" : "";
      if (!hide) { g.setAttribute("transform", `translate(0,${(n - +g.dataset.row) * ROW})`); n++; }
    }
    svg.dataset.visible = n;
  }
  function x(ns) { return LABEL + (ns - view[0]) * (width - LABEL) / Math.max(view[1] - view[0], 1); }
  function draw() {
    for (const g of rows) {
      const r = g.querySelector("rect");
      const a = Math.max(+g.dataset.start, view[0]), b = Math.min(+g.dataset.end, view[1]);
      if (b < a) { r.setAttribute("width", 0); continue; }
      r.setAttribute("x", x(a).toFixed(1));
      r.setAttribute("width", Math.max(x(b) - x(a), 1).toFixed(1));
    }
    svg.querySelectorAll("g.tick").forEach((t, k) => {
      t.querySelector("text").textContent = (((view[0] - T0) + (view[1] - view[0]) * k / 5) / 1e9).toFixed(2) + " s";
    });
    svg.dataset.view = `${Math.round(view[0])}-${Math.round(view[1])}`;
  }
  function follow() {                       // the rest of the page shows the same time (static/range.js)
    const whole = view[0] <= T0 && view[1] >= T1;
    window.dispatchEvent(new CustomEvent("bootprof:range", {detail: whole ? null : [view[0], view[1]]}));
  }
  window.addEventListener("bootprof:range-set", function (ev) {   // a range set elsewhere (the bar, the address)
    view = ev.detail ? [ev.detail[0], ev.detail[1]] : [T0, T1];
    if (text) text.textContent = ev.detail ? said(view) : intro;
    draw();
  });
  function said(v) {
    return `${((v[0] - T0) / 1e9).toFixed(2)} s to ${((v[1] - T0) / 1e9).toFixed(2)} s of the timeline; the flame graphs and the tables marked "follows range" show this time.`;
  }
  function ns(ev) {
    const r = svg.getBoundingClientRect();
    const px = (ev.clientX - r.left) * width / (r.width || width);
    return view[0] + Math.max(0, px - LABEL) * (view[1] - view[0]) / (width - LABEL);
  }

  svg.addEventListener("click", function (ev) {
    const t = ev.target.closest("text.fold");
    if (!t) return;
    const key = t.parentNode.dataset.key;
    if (folded.has(key)) folded.delete(key); else folded.add(key);
    t.textContent = (folded.has(key) ? "\u25b8" : "\u25be") + t.textContent.slice(1);
    layout();
  });
  let from = null;
  svg.addEventListener("mousedown", function (ev) {
    if (ev.target.closest("text.fold")) return;
    from = ns(ev);
    ev.preventDefault();
  });
  svg.addEventListener("mousemove", function (ev) {
    if (from === null) return;
    const a = x(Math.min(from, ns(ev))), b = x(Math.max(from, ns(ev)));
    pick.setAttribute("x", a.toFixed(1));
    pick.setAttribute("width", (b - a).toFixed(1));
  });
  window.addEventListener("mouseup", function (ev) {
    if (from === null) return;
    const to = ns(ev), a = Math.min(from, to), b = Math.max(from, to);
    from = null;
    pick.setAttribute("width", 0);
    if (b - a < (view[1] - view[0]) / 500) return;        // a click, not a drag
    view = [a, b];
    if (text) text.textContent = said(view);
    draw();
    follow();
  });
  const reset = document.querySelector(".timeline-reset");
  if (reset) reset.addEventListener("click", function () {
    view = [T0, T1];
    if (text) text.textContent = intro;
    draw();
    follow();
  });
  layout();
  draw();
})();
