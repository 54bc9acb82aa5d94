/* bootprof heap snapshots: pick a snapshot to see the functions holding the most busy heap bytes in it, and
 * a second one to compare: the table then shows both and the growth, largest growth first. Data: JSON
 * "heap-data" = {snapshots: [{key, label}], functions: [names], rows: [[snapshot, function, bytes, blocks]]}. */
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("heap-data").textContent);
  const a = document.getElementById("heap-a"), b = document.getElementById("heap-b");
  const out = document.getElementById("heap-table");
  const bytes = data.snapshots.map(() => new Map()), blocks = data.snapshots.map(() => new Map());
  for (const [s, f, v, n] of data.rows) { bytes[s].set(f, v); blocks[s].set(f, n); }
  data.snapshots.forEach(function (s, i) {
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
