/* bootprof report: the picked time range, for the whole of index.html.
 *
 * A range (ns since the trace start) comes from the process timeline (static/timeline.js sends a
 * "bootprof:range" event), from the page's address (#t=<ns>-<ns>) or goes away with "whole build" in the bar at
 * the top. Then:
 *  - every table marked data-follow (report/timerange.py writes its rows' time bins beside it as JSON) shows
 *    its numbers for the range: sums of the bins the range covers, percents of the range's total,
 *    rows without anything in the range (or, for rows with a lifetime, not alive in it) hidden, the rest
 *    ranked by the table's measure, the first "limit" shown;
 *  - the flame graph iframes (iframe.flame) and links marked data-range get #t=<ns>-<ns>, so that the CPU
 *    and commit flame graphs draw the same time;
 *  - the bar at the top says which range is shown (with no range: how to pick one).
 * State for tests and links: document.body.dataset.range ("<ns>-<ns>" or "").
 */
(function () {
  "use strict";
  const pools = {};
  document.querySelectorAll("script.follow-pool").forEach((el) => { pools[el.dataset.pool] = JSON.parse(el.textContent); });
  const tables = [...document.querySelectorAll("table[data-follow]")].map(init).filter(Boolean);
  const bar = document.getElementById("range-bar");
  const intro = bar ? bar.querySelector(".range-text").innerHTML : "";
  const FMT = {
    count: (v) => Math.round(v).toLocaleString("en-US"),
    pct: (v) => v.toFixed(2) + "%",
    ms: (v) => (v / 1e6).toLocaleString("en-US", {minimumFractionDigits: 1, maximumFractionDigits: 1}) + " ms",
    bytes: function (v) {
      for (const [u, s] of [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]]) if (Math.abs(v) >= s) return (v / s).toFixed(1) + " " + u;
      return Math.round(v) + " B";
    },
  };

  function init(table) {
    const data = table.nextElementSibling;
    if (!data || !data.classList.contains("follow-data")) return null;
    const doc = JSON.parse(data.textContent);
    const pool = pools[doc.pool];
    if (!pool) return null;
    const rows = [...table.tBodies[0].rows];
    const note = document.createElement("p");
    note.className = "range-note";
    note.dataset.for = table.className;
    const filter = table.previousElementSibling;       // (above the filter box that tables.js put there, if any)
    table.parentNode.insertBefore(note, filter && filter.classList.contains("table-filter") ? filter : table);
    return {table, doc, pool, rows, note,
            cells: rows.map((r) => [...r.cells].map((c) => [c.textContent, c.dataset.v])),
            off: rows.map((r) => !!r.dataset.off)};
  }
  // A pool's series k summed over the bins [b0, b1).
  function value(pool, k, b0, b1) {
    const s = pool.series[k];
    if (!s || !s.length) return 0;
    const first = s[0];
    let out = 0;
    for (let b = Math.max(b0, first); b < Math.min(b1, first + s.length - 1); b++) {
      out += s[1 + b - first];
    }
    return out;
  }
  function binsOf(bins, t0, t1) {             // the bins [b0, b1) that the range touches
    const at = (t) => (t - bins.t0_ns) * bins.count / Math.max(bins.span_ns, 1);
    const b0 = Math.min(bins.count - 1, Math.max(0, Math.floor(at(t0))));
    return [b0, Math.min(bins.count, Math.max(Math.ceil(at(t1)), b0 + 1))];
  }
  function show(t, range) {
    const body = t.table.tBodies[0], doc = t.doc;
    if (!range) {
      t.rows.forEach(function (r, i) {
        [...r.cells].forEach(function (c, k) {
          c.textContent = t.cells[i][k][0];
          if (t.cells[i][k][1] === undefined) delete c.dataset.v; else c.dataset.v = t.cells[i][k][1];
        });
        if (t.off[i]) r.dataset.off = "1"; else delete r.dataset.off;
        body.appendChild(r);
      });
      t.note.textContent = "";
    } else {
      const bins = t.pool.bins, [b0, b1] = binsOf(bins, range[0], range[1]);
      const values = t.rows.map(() => ({}));
      const counted = Object.values(doc.cols).some((c) => c.s || c.m);
      let kept = [];
      t.rows.forEach(function (r, i) {
        const a = doc.alive && doc.alive[i];
        const lives = !a || ((a[0] === null || a[0] <= range[1]) && (a[1] === null || a[1] >= range[0]));
        let any = false;
        for (const [k, c] of Object.entries(doc.cols)) {
          if (c.s) values[i][k] = value(t.pool, c.s[i], b0, b1);
          else if (c.m) values[i][k] = c.m[i].filter((s) => value(t.pool, s, b0, b1) > 0).length;
          else continue;
          any = any || values[i][k] > 0;
        }
        // (a row with a lifetime is in the range while it lives, even without a count there)
        if (doc.alive ? lives : any) kept.push(i);
      });
      for (const [k, c] of Object.entries(doc.cols)) {
        if (c.of === undefined) continue;
        const whole = c.t !== undefined ? value(t.pool, c.t, b0, b1) : t.rows.reduce((acc, _, i) => acc + (values[i][c.of] || 0), 0);
        t.rows.forEach((_, i) => { values[i][k] = 100 * (values[i][c.of] || 0) / Math.max(whole, 1); });
      }
      const rank = (i) => values[i][doc.sort] !== undefined ? values[i][doc.sort] : parseFloat(t.cells[i][doc.sort][1] || 0);
      if (doc.sort !== null) kept.sort((x, y) => rank(y) - rank(x) || x - y);
      const shown = new Set(kept.slice(0, doc.limit));
      kept.concat(t.rows.map((_, i) => i).filter((i) => !kept.includes(i))).forEach(function (i) {
        const r = t.rows[i];
        for (const [k, c] of Object.entries(doc.cols)) {
          const cell = r.cells[+k];
          cell.dataset.v = values[i][k];
          cell.textContent = FMT[c.f] ? FMT[c.f](values[i][k]) : String(values[i][k]);
        }
        if (shown.has(i)) delete r.dataset.off; else r.dataset.off = "1";
        body.appendChild(r);
      });
      const edge = (b) => bins.t0_ns + b * bins.span_ns / bins.count;
      t.note.textContent = (counted ? `${secs(edge(b0))} to ${secs(edge(b1))} (whole bins of ${(bins.span_ns / bins.count / 1e6).toFixed(1)} ms): ` +
        `${shown.size} of ${kept.length} rows ${doc.alive ? "alive" : "with something"} in that time`
        : `${shown.size} of ${kept.length} rows alive in ${secs(range[0])} to ${secs(range[1])}; the numbers are for their whole life`) +
        (t.rows.length >= 400 ? ` (of the ${t.rows.length} largest over the whole build)` : "") + ".";
    }
    t.table.querySelectorAll("thead th").forEach((th) => { delete th.dataset.sort; });
    if (window.bootprofTables) window.bootprofTables.refresh(t.table);
  }
  function secs(ns) { return (ns / 1e9).toFixed(2) + " s"; }

  let current = null;
  function apply(range, from) {
    current = range;
    document.body.dataset.range = range ? `${Math.round(range[0])}-${Math.round(range[1])}` : "";
    tables.forEach((t) => show(t, range));
    const tail = range ? `#t=${Math.round(range[0])}-${Math.round(range[1])}` : "";
    document.querySelectorAll("iframe.flame, a[data-range]").forEach(function (el) {
      const attr = el.tagName === "A" ? "href" : "src";
      el.setAttribute(attr, el.getAttribute(attr).split("#")[0] + tail);
    });
    if (bar) {
      bar.querySelector("button").hidden = !range;
      bar.querySelector(".range-text").innerHTML = range
        ? `Showing ${secs(range[0])} to ${secs(range[1])} of the trace: the flame graphs and the tables marked "follows range" show it.`
        : intro;
    }
    if (from !== "hash") history.replaceState(null, "", range ? tail : location.pathname + location.search);
    if (from !== "timeline") window.dispatchEvent(new CustomEvent("bootprof:range-set", {detail: range}));
  }
  tables.forEach(function (t) {              // a mark on the title of each table that follows
    let el = t.note.previousElementSibling;
    while (el && el.tagName !== "H3" && el.tagName !== "TABLE") el = el.previousElementSibling;
    if (el && el.tagName === "H3") el.insertAdjacentHTML("beforeend", ' <span class="follows" title="counted again for the time range picked on the process timeline">follows range</span>');
  });
  window.addEventListener("bootprof:range", (ev) => apply(ev.detail, "timeline"));
  if (bar) bar.querySelector("button").addEventListener("click", () => apply(null, "bar"));
  const m = location.hash.match(/^#t=(-?\d+)-(-?\d+)$/);
  if (m && +m[2] > +m[1]) apply([+m[1], +m[2]], "hash");
  window.bootprofRange = {set: (range) => apply(range, "api"), get: () => current};
})();
