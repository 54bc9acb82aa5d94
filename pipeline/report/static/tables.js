/* bootprof report tables: click a column title to sort by it (again to reverse), type in the box above a
 * table to keep the rows that contain the text (case-insensitive). Numbers sort by their value (data-v),
 * text alphabetically. Rows marked data-off (outside the picked time range, see range.js) stay hidden. No
 * network, no library: the page works offline. */
(function () {
  "use strict";
  const filters = new Map();
  // Rows shown: those that hold the filter's text and that the time range (static/range.js) keeps (no data-off).
  function refresh(table) {
    const filter = filters.get(table), q = filter ? filter.value.toLowerCase() : "";
    let shown = 0;
    for (const row of table.tBodies[0].rows) {
      const keep = !row.dataset.off && (!q || row.textContent.toLowerCase().indexOf(q) >= 0);
      row.style.display = keep ? "" : "none";
      shown += keep;
    }
    table.dataset.shown = shown;
  }
  window.bootprofTables = {refresh: refresh};
  function value(cell) {
    if (!cell) return "";
    return cell.dataset.v !== undefined ? parseFloat(cell.dataset.v) : cell.textContent.toLowerCase();
  }
  document.querySelectorAll("main table").forEach(function (table, t) {
    const body = table.tBodies[0];
    if (!body || body.rows.length < 2) return;
    const filter = document.createElement("input");
    filter.type = "search";
    filter.className = "table-filter";
    filter.placeholder = "filter rows";
    filters.set(table, filter);
    filter.addEventListener("input", function () { refresh(table); });
    table.parentNode.insertBefore(filter, table);
    table.querySelectorAll("thead th").forEach(function (th, col) {
      th.classList.add("sortable");
      th.title = "sort";
      th.addEventListener("click", function () {
        const up = th.dataset.sort !== "asc";
        table.querySelectorAll("thead th").forEach(function (o) { delete o.dataset.sort; });
        th.dataset.sort = up ? "asc" : "desc";
        const rows = Array.from(body.rows);
        rows.sort(function (a, b) {
          const x = value(a.cells[col]), y = value(b.cells[col]);
          const c = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
          return up ? c : -c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
        table.dataset.sorted = col + (up ? "+" : "-");
      });
    });
  });
})();
