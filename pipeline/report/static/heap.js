/* bootprof heap snapshots: pick a snapshot to see the functions holding the most busy heap bytes in it, and
 * a second one to compare: the table then shows both and the growth, largest growth first. Data: JSON
 * "heap-data" = {snapshots: [{label, t}], functions: [names], rows: [[snapshot, function, bytes, blocks]]}. With
 * #t=<ns>-<ns> in the address (a range picked in the report), only the snapshots taken in it are offered. */
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("heap-data").textContent);
  const a = document.getElementById("heap-a"), b = document.getElementById("heap-b");
  const out = document.getElementById("heap-table");
  const bytes = data.snapshots.map(() => new Map()), blocks = data.snapshots.map(() => new Map());
  for (const [s, f, v, n] of data.rows) { bytes[s].set(f, v); blocks[s].set(f, n); }
  // #t=<ns>-<ns> (the range picked in the report): only the snapshots taken in it can be picked.
  const m = location.hash.match(/^#t=(-?\d+)-(-?\d+)$/);
  const range = m ? [+m[1], +m[2]] : null;
  const picked = data.snapshots.map((s, i) => i).filter((i) => !range || (data.snapshots[i].t >= range[0] && data.snapshots[i].t <= range[1]));
  const note = document.getElementById("heap-range");
  if (range && note) {
    note.innerHTML = `${picked.length} of ${data.snapshots.length} snapshots were taken in ${(range[0] / 1e9).toFixed(2)} s to ` +
      `${(range[1] / 1e9).toFixed(2)} s of the trace, the range picked in the report. <a href="heap_snapshots.html">All snapshots</a>`;
  }
  picked.forEach(function (i) {
    const s = data.snapshots[i];
    for (const sel of [a, b]) {
      const o = document.createElement("option");
      o.value = i; o.textContent = s.label;
      sel.appendChild(o);
    }
  });
  const none = document.createElement("option");
  none.value = ""; none.textContent = "(none: one snapshot)";
  b.insertBefore(none, b.firstChild);
  b.value = "";
  function fmt(v) {
    const sign = v < 0 ? "-" : "", x = Math.abs(v);
    for (const [u, s] of [["GiB", 1 << 30], ["MiB", 1 << 20], ["KiB", 1 << 10]]) if (x >= s) return sign + (x / s).toFixed(1) + " " + u;
    return sign + x + " B";
  }
  function cell(row, text, num) {
    const td = document.createElement("td");
    td.className = num === undefined ? "txt" : "num";
    if (num !== undefined) td.dataset.v = num;
    td.textContent = text;
    row.appendChild(td);
  }
  function render() {
    if (a.value === "") { out.textContent = ""; out.dataset.compared = ""; return; }
    const i = +a.value, j = b.value === "" ? -1 : +b.value;
    const names = new Set([...bytes[i].keys(), ...(j >= 0 ? bytes[j].keys() : [])]);
    const rows = [...names].map(f => ({ f, x: bytes[i].get(f) || 0, y: j >= 0 ? (bytes[j].get(f) || 0) : 0 }));
    rows.sort(j >= 0 ? (p, q) => (q.y - q.x) - (p.y - p.x) || p.f - q.f : (p, q) => q.x - p.x || p.f - q.f);
    out.textContent = "";
    const head = document.createElement("tr");
    for (const t of j >= 0 ? ["function", "first", "second", "growth"] : ["function", "bytes", "blocks"]) {
      const th = document.createElement("th"); th.textContent = t; head.appendChild(th);
    }
    const thead = document.createElement("thead"); thead.appendChild(head); out.appendChild(thead);
    const body = document.createElement("tbody");
    for (const r of rows.slice(0, 200)) {
      const tr = document.createElement("tr");
      tr.dataset.f = data.functions[r.f];
      cell(tr, data.functions[r.f]);
      if (j >= 0) { cell(tr, fmt(r.x), r.x); cell(tr, fmt(r.y), r.y); cell(tr, fmt(r.y - r.x), r.y - r.x); }
      else { cell(tr, fmt(r.x), r.x); cell(tr, (blocks[i].get(r.f) || 0).toLocaleString("en-US"), blocks[i].get(r.f) || 0); }
      body.appendChild(tr);
    }
    out.appendChild(body);
    out.dataset.compared = j >= 0 ? i + "-" + j : String(i);
  }
  a.addEventListener("change", render);
  b.addEventListener("change", render);
  render();
})();
