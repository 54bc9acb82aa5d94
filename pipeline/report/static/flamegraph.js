/* bootprof flame graph: draws the node table that flame.py embeds as JSON (id "flame-data").
 *
 * Nodes come in depth-first order with precomputed offsets: x (start, in the unit of the
 * measure), w (width = inclusive value), s (self value), d (depth), n (index into names).
 * Root at the top (an icicle). Click a frame to zoom to it (its ancestors stay drawn full width),
 * click the root or "reset" to zoom out; the search box takes a regular expression and marks
 * matching frames, reporting the share of the total they cover (a match inside another match
 * counts once). State lives in the URL hash (#zoom=<node>&search=<regex>) so a page can be linked.
 * A differential graph (unit "ppm", arrays a and b: the node's inclusive share of the baseline and of the
 * run, in parts per million) colours each frame by its change: red grew, blue shrank, the strongest for
 * frames only one run has.
 * Labels show the function first (what follows "module!"; the module stays in the tooltip). "hide Idle"
 * leaves out the Idle process (pid 0, often most of a trace's samples) and widens the rest to the page.
 * Callers and callees (WPA's butterfly): the zoomed frame's function, merged over every place it occurs,
 * with the frames that call it and that it calls, each with the inclusive value that passes through them.
 * A recursive function counts once per stack (its outermost occurrences); click a row to go to that
 * function (its largest occurrence).
 * Time range (a graph whose nodes carry time bins: bo/bb/bv, see flame.py add_bins): a strip above the graph
 * shows the value over time; drag across it to draw the graph, the callers and callees and the top functions
 * of that range only (#range=<first bin>-<end bin>, or #t=<ns>-<ns> since the trace start, as the report's
 * process timeline links to it).
 */
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("flame-data").textContent);
  const svg = document.getElementById("flame");
  const status = document.getElementById("flame-status");
  const matched = document.getElementById("flame-matched");
  const input = document.getElementById("flame-search");
  const ROW = 17, MIN_PX = 0.4;
  const N = data.x.length;
  let zoom = 0, pattern = null, hideIdle = false;
  let idle = -1;                     // the Idle process frame (depth 1), if the graph has one
  for (let i = 0; i < N; i++) if (data.d[i] === 1 && data.names[data.n[i]] === "Idle") { idle = i; break; }
  const idleBox = document.getElementById("flame-hide-idle");
  if (idleBox && idle < 0) idleBox.disabled = true;
  // Geometry with Idle left out: its frames are not drawn and what follows it moves left by its width.
  function hidden(i) {
    return hideIdle && idle >= 0 && data.d[i] >= 1 && data.x[i] >= data.x[idle] && data.x[i] < data.x[idle] + data.w[idle];
  }
  function X(i) { return hideIdle && idle >= 0 && data.x[i] >= data.x[idle] + data.w[idle] ? data.x[i] - data.w[idle] : data.x[i]; }
  function W(i) { return hideIdle && idle >= 0 && i === 0 ? data.w[0] - data.w[idle] : data.w[i]; }
  let total = N ? data.w[0] : 0;
  // parent of each node (depth-first order: the last node one level up before it)
  const parent = new Int32Array(N).fill(-1);
  { const last = []; for (let i = 0; i < N; i++) { last[data.d[i]] = i; if (data.d[i] > 0) parent[i] = last[data.d[i] - 1]; } }
  const panel = document.getElementById("flame-butterfly");
  const topBox = document.getElementById("flame-top");
  const strip = document.getElementById("flame-range");
  const X0 = data.x, W0 = data.w, S0 = data.s;
  let range = null;                  // [first bin, end bin) or null: everything
  // The node values of the bins in ``range`` replace x, w and s (children keep their order).
  function applyRange() {
    if (!range || !data.bo) { data.x = X0; data.w = W0; data.s = S0; return; }
    const [b0, b1] = range;
    const w = new Array(N).fill(0), x = new Array(N).fill(0), s = new Array(N).fill(0), cursor = new Array(N).fill(0);
    for (let i = 0; i < N; i++) {
      let v = 0;
      for (let j = data.bo[i]; j < data.bo[i + 1]; j++) if (data.bb[j] >= b0 && data.bb[j] < b1) v += data.bv[j];
      w[i] = v;
    }
    for (let i = 0; i < N; i++) {
      s[i] = w[i];
      if (i > 0) { const p = parent[i]; x[i] = cursor[p]; cursor[p] += w[i]; s[p] -= w[i]; }
      cursor[i] = x[i];
    }
    data.x = x; data.w = w; data.s = s;
  }

  const diff = data.unit === "ppm" && data.a && data.b;
  function fmt(v) {
    if (data.unit === "ppm") return (v / 10000).toFixed(2) + "%";
    return data.unit === "bytes" ? (v >= 1048576 ? (v / 1048576).toFixed(1) + " MiB" : (v / 1024).toFixed(1) + " KiB")
      : v.toLocaleString("en-US") + " " + data.unit;
  }
  function hue(name) {
    let h = 0;
    const mod = name.split("!")[0];
    for (let i = 0; i < mod.length; i++) h = (h * 31 + mod.charCodeAt(i)) >>> 0;
    return h;
  }
  function color(i, name) {
    if (pattern && pattern.test(name)) return "rgb(190,80,230)";
    if (i === 0) return "rgb(200,200,200)";
    if (diff) {
      const a = data.a[i], b = data.b[i];
      if (a === 0) return "rgb(215,40,40)";          // only in the run: added
      if (b === 0) return "rgb(40,80,215)";          // only in the baseline: removed
      const t = Math.min(1, Math.abs(b - a) / Math.max(a, b) * 2);
      const fade = Math.round(235 - 150 * t);
      return b > a ? `rgb(235,${fade},${fade})` : `rgb(${fade},${fade},235)`;
    }
    const h = hue(name);
    if (name.indexOf("!") < 0 && data.d[i] === 1) return "rgb(120,170,220)";   // process frames
    return `rgb(${205 + (h % 50)},${90 + ((h >> 8) % 120)},${40 + ((h >> 16) % 50)})`;
  }
  function isAncestor(a, b) {   // a is b or an ancestor of b
    return data.x[a] <= data.x[b] && data.x[b] + data.w[b] <= data.x[a] + data.w[a] && data.d[a] <= data.d[b];
  }
  function esc(s) {
    return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function render() {
    const width = svg.parentNode.clientWidth || 1200;
    if (hidden(zoom) || !data.w[zoom]) zoom = 0;
    total = N ? W(0) : 0;
    const zx = X(zoom), zw = W(zoom) || 1, zd = data.d[zoom];
    const scale = width / zw;
    let maxd = 0;
    const parts = [];
    for (let i = 0; i < N; i++) {
      if (hidden(i)) continue;
      let x, w;
      if (data.d[i] < zd) {
        if (!isAncestor(i, zoom)) continue;
        x = 0; w = width;
      } else {
        if (X(i) < zx || X(i) + W(i) > zx + zw) continue;
        if (data.d[i] === zd && i !== zoom) continue;
        w = W(i) * scale;
        if (w < MIN_PX) continue;
        x = (X(i) - zx) * scale;
      }
      const name = data.names[data.n[i]];
      const y = data.d[i] * ROW;
      if (data.d[i] > maxd) maxd = data.d[i];
      const bang = name.indexOf("!");
      const short = bang >= 0 ? name.slice(bang + 1) : name;     // the function first; the module is in the tooltip
      const label = w > 30 ? esc(short.slice(0, Math.floor(w / 6.5))) : "";
      const tip = diff ? `baseline ${fmt(data.a[i])}, run ${fmt(data.b[i])}, change ${((data.b[i] - data.a[i]) / 10000).toFixed(2)} points`
        : `${fmt(data.w[i])}, ${(100 * data.w[i] / total).toFixed(2)}%, self ${fmt(data.s[i])}`;
      parts.push(`<g class="frame" data-i="${i}"><title>${esc(name)} (${tip})</title>` +
        `<rect x="${x.toFixed(1)}" y="${y}" width="${Math.max(w - 0.5, 0.1).toFixed(1)}" height="${ROW - 1}" ` +
        `fill="${color(i, name)}"></rect><text x="${(x + 3).toFixed(1)}" y="${y + 12}">${label}</text></g>`);
    }
    svg.setAttribute("width", width);
    svg.setAttribute("height", (maxd + 1) * ROW + 4);
    svg.innerHTML = parts.join("");
    svg.dataset.drawn = parts.length;
    svg.dataset.shown = total;
    svg.dataset.zoom = zoom;
    reportMatches();
    butterfly(zoom);
    drawStrip();
    topFunctions();
  }

  function reportMatches() {
    if (!pattern) { matched.textContent = ""; svg.dataset.matched = ""; return; }
    let sum = 0, end = -1;
    for (let i = 0; i < N; i++) {          // depth-first order: an outer match precedes its inner ones
      if (data.x[i] < end || hidden(i)) continue;
      if (pattern.test(data.names[data.n[i]]) && i !== 0) { sum += data.w[i]; end = data.x[i] + data.w[i]; }
    }
    const pct = total ? (100 * sum / total).toFixed(2) : "0.00";
    matched.textContent = `matched ${fmt(sum)} (${pct}%)`;
    svg.dataset.matched = pct;
  }

  // Callers and callees of the function of node ``sel``, over every node of that name.
  function butterfly(sel) {
    if (!panel) return;
    if (!sel || diff) { panel.innerHTML = ""; panel.dataset.fn = ""; return; }
    const fn = data.n[sel];
    const callers = new Map(), callees = new Map();
    let incl = 0, self = 0, sites = 0, largest = sel;
    for (let i = 1; i < N; i++) {
      if (data.n[i] !== fn || hidden(i)) continue;
      self += data.s[i];
      if (!outermost(i)) continue;
      sites++;
      incl += data.w[i];
      if (data.w[i] > data.w[largest]) largest = i;
      const p = parent[i];
      callers.set(data.n[p], (callers.get(data.n[p]) || 0) + data.w[i]);
      for (let c = i + 1; c < N && data.d[c] > data.d[i]; c++) {
        if (data.d[c] === data.d[i] + 1 && !hidden(c)) callees.set(data.n[c], (callees.get(data.n[c]) || 0) + data.w[c]);
      }
    }
    const rows = (m) => [...m.entries()].sort((a, b) => b[1] - a[1] || (data.names[a[0]] < data.names[b[0]] ? -1 : 1)).slice(0, 20)
      .map(([n, v]) => `<tr data-n="${n}"><td>${label(data.names[n])}</td><td class="num">${fmt(v)}</td>` +
        `<td class="num">${(100 * v / (incl || 1)).toFixed(1)}%</td></tr>`).join("");
    const head = (t) => `<tr><th>${t}</th><th class="num">${data.unit}</th><th class="num">% of it</th></tr>`;
    panel.innerHTML = `<h2>${esc(data.names[fn])}</h2><p>inclusive ${fmt(incl)} (${(100 * incl / (total || 1)).toFixed(2)}% ` +
      `of all), self ${fmt(self)}, at ${sites} place${sites === 1 ? "" : "s"} in the graph</p>` +
      `<div class="bf"><table class="callers">${head("called by")}${rows(callers) || "<tr><td>(none)</td></tr>"}</table>` +
      `<table class="callees">${head("calls")}${rows(callees) || "<tr><td>(none: a leaf)</td></tr>"}</table></div>`;
    panel.dataset.fn = data.names[fn];
    panel.dataset.inclusive = incl;
    panel.dataset.self = self;
    panel.dataset.callers = [...callers.entries()].map(([n, v]) => data.names[n] + "=" + v).sort().join("\n");
    panel.dataset.callees = [...callees.entries()].map(([n, v]) => data.names[n] + "=" + v).sort().join("\n");
  }

  function label(name) {       // the function first, its module after it in grey
    const bang = name.indexOf("!");
    return bang < 0 ? esc(name) : `${esc(name.slice(bang + 1))} <span class="mod">${esc(name.slice(0, bang))}</span>`;
  }

  // The strip: the root's value per bin, the picked range shaded.
  function drawStrip() {
    if (!strip || !data.bo) return;
    const width = strip.parentNode.clientWidth - 8 || 1200, H = 40, bins = data.bins;
    const per = new Array(bins).fill(0);                 // the whole build per bin (without Idle when it is hidden)
    for (let j = data.bo[0]; j < data.bo[1]; j++) per[data.bb[j]] += data.bv[j];
    if (hideIdle && idle >= 0) for (let j = data.bo[idle]; j < data.bo[idle + 1]; j++) per[data.bb[j]] -= data.bv[j];
    const top = Math.max(1, ...per), bw = width / bins, parts = [];
    per.forEach((v, b) => {
      if (v <= 0) return;
      const h = Math.max(1, H * v / top);
      parts.push(`<rect x="${(b * bw).toFixed(1)}" y="${(H - h).toFixed(1)}" width="${Math.max(bw - 0.2, 0.5).toFixed(1)}" height="${h.toFixed(1)}"></rect>`);
    });
    if (range) parts.push(`<rect class="sel" x="${(range[0] * bw).toFixed(1)}" y="0" width="${((range[1] - range[0]) * bw).toFixed(1)}" height="${H}"></rect>`);
    strip.setAttribute("width", width);
    strip.innerHTML = parts.join("");
    const text = document.getElementById("flame-range-text");
    const secs = (b) => ((data.t0_ns + b * data.span_ns / bins) / 1e9).toFixed(2);
    if (text) text.firstChild.textContent = range ? `${secs(range[0])} s to ${secs(range[1])} s of the trace: ${fmt(data.w[0])}. `
      : "Drag across the strip to draw only that part of the build. ";
    strip.dataset.range = range ? range.join("-") : "";
  }
  function binAt(ev) {
    const r = strip.getBoundingClientRect();
    return Math.max(0, Math.min(data.bins - 1, Math.floor((ev.clientX - r.left) / (r.width || 1) * data.bins)));
  }
  if (strip && data.bo) {
    let from = null;
    strip.addEventListener("mousedown", function (ev) { from = binAt(ev); ev.preventDefault(); });
    window.addEventListener("mouseup", function (ev) {
      if (from === null) return;
      const to = binAt(ev);
      range = [Math.min(from, to), Math.max(from, to) + 1];
      from = null;
      applyRange(); setHash(); render();
    });
    document.getElementById("flame-range-all").addEventListener("click", function () {
      range = null; applyRange(); setHash(); render();
    });
  }

  // The functions with the most self value in what is drawn (the range, Idle hidden or not).
  function topFunctions() {
    if (!topBox) return;
    const self = new Map(), incl = new Map();
    for (let i = 1; i < N; i++) {
      if (data.d[i] < 2 || !data.w[i] || hidden(i)) continue;
      const n = data.n[i];
      self.set(n, (self.get(n) || 0) + data.s[i]);
      if (outermost(i)) incl.set(n, (incl.get(n) || 0) + data.w[i]);
    }
    const all = W(0) || 1;
    const rows = [...self.entries()].filter((e) => e[1] > 0)
      .sort((a, b) => b[1] - a[1] || (data.names[a[0]] < data.names[b[0]] ? -1 : 1)).slice(0, 25);
    topBox.innerHTML = `<h2>Top functions by self ${data.unit}${range ? " in the picked range" : ""}</h2><table>` +
      `<tr><th>function</th><th class="num">self</th><th class="num">%</th><th class="num">inclusive</th></tr>` +
      rows.map(([n, v]) => `<tr data-n="${n}"><td>${label(data.names[n])}</td><td class="num">${fmt(v)}</td>` +
        `<td class="num">${(100 * v / all).toFixed(2)}%</td><td class="num">${fmt(incl.get(n) || 0)}</td></tr>`).join("") +
      "</table>";
    topBox.dataset.first = rows.length ? data.names[rows[0][0]] + "=" + rows[0][1] : "";
  }
  // A function's frame that no frame of the same function holds (a recursive one counts once per stack).
  function outermost(i) {
    for (let p = parent[i]; p > 0; p = parent[p]) if (data.n[p] === data.n[i]) return false;
    return true;
  }

  // A click on a table row of a function (callers/callees, top functions): zoom to its largest frame.
  function goToRow(ev) {
    const tr = ev.target.closest("tr[data-n]");
    if (!tr) return;
    const i = largestOf(parseInt(tr.dataset.n, 10));
    if (i > 0) { zoom = i; setHash(); render(); window.scrollTo(0, 0); }
  }
  if (topBox) topBox.addEventListener("click", goToRow);

  function largestOf(fn) {
    let best = -1;
    for (let i = 1; i < N; i++) if (data.n[i] === fn && !hidden(i) && (best < 0 || data.w[i] > data.w[best])) best = i;
    return best;
  }

  function setHash() {
    const parts = [];
    if (zoom) parts.push("zoom=" + zoom);
    if (range) parts.push("range=" + range.join("-"));
    if (hideIdle) parts.push("idle=0");
    if (pattern) parts.push("search=" + encodeURIComponent(pattern.source));
    history.replaceState(null, "", parts.length ? "#" + parts.join("&") : location.pathname);
  }

  function readHash() {
    const params = new URLSearchParams(location.hash.slice(1));
    const z = parseInt(params.get("zoom") || "0", 10);
    zoom = z >= 0 && z < N ? z : 0;
    hideIdle = params.get("idle") === "0" && idle >= 0;
    if (idleBox) idleBox.checked = hideIdle;
    range = null;
    const r = (params.get("range") || "").match(/^(\d+)-(\d+)$/), t = (params.get("t") || "").match(/^(-?\d+)-(-?\d+)$/);
    if (data.bo && r) range = [Math.min(+r[1], data.bins), Math.min(+r[2], data.bins)];
    else if (data.bo && t) {
      const bin = (ns) => Math.max(0, Math.min(data.bins, (ns - data.t0_ns) * data.bins / data.span_ns));
      range = [Math.floor(bin(+t[1])), Math.ceil(bin(+t[2]))];
    }
    if (range && range[1] <= range[0]) range = null;
    applyRange();
    const s = params.get("search");
    if (s) { input.value = s; try { pattern = new RegExp(s); } catch (e) { pattern = null; } }
  }

  svg.addEventListener("click", function (ev) {
    const g = ev.target.closest("g.frame");
    if (!g) return;
    const i = parseInt(g.dataset.i, 10);
    zoom = i === zoom ? 0 : i;
    setHash();
    render();
  });
  svg.addEventListener("mouseover", function (ev) {
    const g = ev.target.closest("g.frame");
    if (!g) return;
    const i = parseInt(g.dataset.i, 10);
    status.textContent = diff ? `${data.names[data.n[i]]}: baseline ${fmt(data.a[i])} of its samples, run ` +
      `${fmt(data.b[i])}, change ${((data.b[i] - data.a[i]) / 10000).toFixed(2)} points`
      : `${data.names[data.n[i]]}: ${fmt(data.w[i])} (${(100 * data.w[i] / total).toFixed(2)}%), self ${fmt(data.s[i])}`;
  });
  if (panel) panel.addEventListener("click", goToRow);
  input.addEventListener("input", function () {
    try { pattern = input.value ? new RegExp(input.value) : null; input.classList.remove("bad"); }
    catch (e) { input.classList.add("bad"); return; }
    setHash();
    render();
  });
  document.getElementById("flame-reset").addEventListener("click", function () {
    zoom = 0; pattern = null; input.value = ""; setHash(); render();
  });
  if (idleBox) idleBox.addEventListener("change", function () { hideIdle = idleBox.checked; setHash(); render(); });
  window.addEventListener("resize", render);
  window.addEventListener("hashchange", function () { readHash(); render(); });
  readHash();
  render();
})();
