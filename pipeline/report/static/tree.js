/* bootprof drill-down tree (like WPA's Commit Stack view): the node table that flame.py embeds as JSON
 * (id "tree-data": depth-first x, w, d, n, names). Children are listed largest first. Keyboard, on the focused
 * tree: Down/Up move the selection; Right opens the selected node, or, when it is open, moves to its largest
 * child; Left closes it, or moves to its parent; Enter toggles. Clicking a row selects and toggles it.
 */
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("tree-data").textContent);
  const box = document.getElementById("tree");
  const N = data.x.length, total = N ? data.w[0] : 0;
  const parent = new Array(N).fill(-1), kids = Array.from({ length: N }, () => []);
  const stack = [];
  for (let i = 0; i < N; i++) {
    while (stack.length && data.d[stack[stack.length - 1]] >= data.d[i]) stack.pop();
    if (stack.length) { parent[i] = stack[stack.length - 1]; kids[parent[i]].push(i); }
    stack.push(i);
  }
  kids.forEach(k => k.sort((a, b) => data.w[b] - data.w[a] || a - b));
  const open = new Set([0]);
  let selected = 0;
  function fmt(v) {
    if (data.unit === "bytes") {
      for (const [u, s] of [["GiB", 1 << 30], ["MiB", 1 << 20], ["KiB", 1 << 10]]) if (v >= s) return (v / s).toFixed(1) + " " + u;
      return v + " B";
    }
    return v.toLocaleString("en-US") + " " + data.unit;
  }
  function visible() {
    const out = [], todo = [0];
    while (todo.length) {
      const i = todo.pop();
      out.push(i);
      if (open.has(i)) for (let k = kids[i].length - 1; k >= 0; k--) todo.push(kids[i][k]);
    }
    return out;
  }
  function render() {
    const rows = visible();
    box.textContent = "";
    for (const i of rows) {
      const row = document.createElement("div");
      row.className = "row" + (i === selected ? " selected" : "");
      row.dataset.i = i;
      row.style.paddingLeft = (data.d[i] * 14 + 4) + "px";
      const mark = document.createElement("span");
      mark.className = "mark";
      mark.textContent = kids[i].length ? (open.has(i) ? "\u25BE " : "\u25B8 ") : "\u2003";
      const name = document.createElement("span");
      name.className = "name";
      name.textContent = data.names[data.n[i]];
      const size = document.createElement("span");
      size.className = "size";
      size.textContent = fmt(data.w[i]) + "  " + (total ? (100 * data.w[i] / total).toFixed(2) : "0.00") + "%";
      row.append(mark, name, size);
      box.appendChild(row);
    }
    box.dataset.selected = selected;
    box.dataset.path = pathOf(selected).join(";");
    const sel = box.querySelector(".selected");
    if (sel) sel.scrollIntoView({ block: "nearest" });
  }
  function pathOf(i) {
    const out = [];
    for (; i > 0; i = parent[i]) out.unshift(data.names[data.n[i]]);
    return out;
  }
  box.addEventListener("keydown", function (ev) {
    const rows = visible(), at = rows.indexOf(selected);
    if (ev.key === "ArrowDown") selected = rows[Math.min(rows.length - 1, at + 1)];
    else if (ev.key === "ArrowUp") selected = rows[Math.max(0, at - 1)];
    else if (ev.key === "ArrowRight") {
      if (!kids[selected].length) return;
      if (!open.has(selected)) open.add(selected); else selected = kids[selected][0];
    } else if (ev.key === "ArrowLeft") {
      if (open.has(selected) && kids[selected].length) open.delete(selected);
      else if (parent[selected] >= 0) selected = parent[selected];
    } else if (ev.key === "Enter") {
      if (open.has(selected)) open.delete(selected); else open.add(selected);
    } else return;
    ev.preventDefault();
    render();
  });
  box.addEventListener("click", function (ev) {
    const row = ev.target.closest(".row");
    if (!row) return;
    selected = +row.dataset.i;
    if (open.has(selected)) open.delete(selected); else open.add(selected);
    render();
    box.focus();
  });
  render();
  box.focus();
})();
