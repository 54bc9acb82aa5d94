/* bootprof report tables: click a column title to sort by it (again to reverse), type in the box above a
 * table to keep the rows that contain the text (case-insensitive). Numbers sort by their value (data-v),
 * text alphabetically. Rows marked data-off (outside the picked time range, see range.js) stay hidden. A table
 * of more than LONG rows starts with its first SHORT ("show all" for the rest; a filter searches them all). A
 * command line (td.cmd) is one line until clicked. No network, no library: the page works offline. */
(function () {
  "use strict";
  const filters = new Map();
  const LONG = 20, SHORT = 15;
  // Rows shown: those that hold the filter's text and that the time range (static/range.js) keeps (no data-off).
  function refresh(table) {
    const filter = filters.get(table), q = filter ? filter.value.toLowerCase() : "";
    let shown = 0, kept = 0;
    const short = table.dataset.short === "1" && !q;
    for (const row of table.tBodies[0].rows) {
      if (row.classList.contains("group-row")) continue;
      const match = !row.dataset.off && (!q || row.textContent.toLowerCase().indexOf(q) >= 0);
      kept += match;
      const keep = match && (!short || kept <= SHORT);
      row.style.display = keep ? "" : "none";
      shown += keep;
    }
    table.dataset.shown = shown;
    const more = table.nextElementSibling;
    if (more && more.classList.contains("show-all")) {
      more.hidden = !(table.dataset.short === "1" && kept > SHORT) && table.dataset.short !== "0";
      more.textContent = table.dataset.short === "1" ? `show all ${kept.toLocaleString("en-US")} rows` : "show fewer";
    }
  }
  window.bootprofTables = {refresh: refresh};
  // Rows grouped by a column's value (a header row per group, the rows' order kept within it); null: as they were.
  function group(table, order, col) {
    const body = table.tBodies[0];
    body.querySelectorAll("tr.group-row").forEach((r) => r.remove());
    let rows = order.slice();
    if (col !== null) {
      const key = (r) => (r.cells[col] ? r.cells[col].textContent : "");
      const keys = [...new Set(rows.map(key))];
      rows = keys.flatMap((k) => rows.filter((r) => key(r) === k));
      const counts = new Map(keys.map((k) => [k, rows.filter((r) => key(r) === k).length]));
      let last = null;
      for (const r of rows) {
        if (key(r) !== last) {
          last = key(r);
          const head = document.createElement("tr");
          head.className = "group-row";
          head.innerHTML = `<td colspan="${r.cells.length}"></td>`;
          head.firstChild.textContent = `${last || "(none)"} · ${counts.get(last)} rows`;
          body.appendChild(head);
        }
        body.appendChild(r);
      }
    } else {
      rows.forEach((r) => body.appendChild(r));
    }
    table.dataset.grouped = col === null ? "" : String(col);
    if (table.dataset.short) table.dataset.short = col === null ? "1" : "0";
    refresh(table);
  }
  document.addEventListener("click", function (ev) {
    const cell = ev.target.closest && ev.target.closest("td.cmd");
    if (cell) cell.classList.toggle("open");
  });
  function value(cell) {
    if (!cell) return "";
    return cell.dataset.v !== undefined ? parseFloat(cell.dataset.v) : cell.textContent.toLowerCase();
  }
  document.querySelectorAll("main table").forEach(function (table, t) {
    const body = table.tBodies[0];
    if (!body || body.rows.length < 2 || table.classList.contains("top")) return;
    const filter = document.createElement("input");
    filter.type = "search";
    filter.className = "table-filter";
    filter.placeholder = "filter rows";
    filters.set(table, filter);
    filter.addEventListener("input", function () { refresh(table); });
    table.parentNode.insertBefore(filter, table);
    const groupable = [...table.querySelectorAll("thead th")].map((th, col) => [th, col]).filter(([th]) => th.dataset.group);
    if (groupable.length) {
      const select = document.createElement("select");
      select.className = "group-by";
      select.innerHTML = '<option value="">no grouping</option>' +
        groupable.map(([th, col]) => `<option value="${col}">group by ${th.textContent}</option>`).join("");
      const order = Array.from(body.rows);
      select.addEventListener("change", function () { group(table, order, select.value === "" ? null : +select.value); });
      filter.insertAdjacentElement("afterend", select);
    }
    if (body.rows.length > LONG && !table.hasAttribute("data-follow")) {
      table.dataset.short = "1";
      const more = document.createElement("button");
      more.type = "button";
      more.className = "show-all";
      more.addEventListener("click", function () {
        table.dataset.short = table.dataset.short === "1" ? "0" : "1";
        refresh(table);
      });
      table.parentNode.insertBefore(more, table.nextSibling);
      refresh(table);
    }
    table.querySelectorAll("thead th").forEach(function (th, col) {
      th.classList.add("sortable");
      th.title = "sort";
      th.addEventListener("click", function () {
        const up = th.dataset.sort !== "asc";
        table.querySelectorAll("thead th").forEach(function (o) { delete o.dataset.sort; });
        th.dataset.sort = up ? "asc" : "desc";
        body.querySelectorAll("tr.group-row").forEach((r) => r.remove());      // (sorting ends a grouping)
        const grouping = table.parentNode.querySelector("select.group-by");
        if (grouping && table.dataset.grouped) { grouping.value = ""; table.dataset.grouped = ""; }
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
