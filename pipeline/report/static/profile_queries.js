// profile_queries.html: nested trace of one rustc process, loaded on demand and rendered lazily.
// Data: profile_queries/trace-<file_id>.js calls bootprofTrace({...}) with column arrays (start, dur,
// label, kind, parent, thread, instant). Only open boxes have DOM children; long child lists are
// paged, so a process with 100k+ events renders a few hundred elements at a time. The view is a
// function of location.hash (file=<id>&zoom=<event>), so links, back/forward and tests share it.
(function () {
  "use strict";
  var PAGE = 200;              // children rendered per "show more"
  var AUTO_OPEN_BUDGET = 400;  // boxes opened automatically per render
  var traces = {};
  var current = null;

  window.bootprofTrace = function (t) { traces[t.file_id] = prepare(t); };

  function prepare(t) {
    var n = t.start.length, i;
    var count = new Int32Array(n + 1), first = new Int32Array(n + 2), kids = new Int32Array(n);
    for (i = 0; i < n; i++) { if (t.parent[i] >= 0) count[t.parent[i]]++; }
    for (i = 0; i < n; i++) first[i + 1] = first[i] + count[i];
    var fill = first.slice(0, n);
    for (i = 0; i < n; i++) { var p = t.parent[i]; if (p >= 0) kids[fill[p]++] = i; }
    var roots = {};
    for (i = 0; i < n; i++) {
      if (t.parent[i] < 0 && !t.instant[i]) { (roots[t.thread[i]] = roots[t.thread[i]] || []).push(i); }
    }
    t.first = first; t.kids = kids; t.roots = roots; t.n = n;
    return t;
  }

  function children(t, i) { return t.kids.subarray(t.first[i], t.first[i + 1]); }

  function fracClass(f) {
    var cuts = [[0.5, "frac-50"], [0.4, "frac-40"], [0.3, "frac-30"], [0.2, "frac-20"], [0.1, "frac-10"],
                [0.05, "frac-05"], [0.02, "frac-02"], [0.01, "frac-01"], [0.001, "frac-001"]];
    for (var c = 0; c < cuts.length; c++) if (f >= cuts[c][0]) return cuts[c][1];
    return "frac-0";
  }

  var KIND_CLASS = { "Query": "miss", "GenericActivity": "pass", "IncrementalLoadResult": "miss incr",
                     "IncrementalResultHashing": "hash", "QueryBlocked": "blocked" };

  function fmt(ns) {
    if (ns >= 1e9) return (ns / 1e9).toFixed(2) + "s";
    if (ns >= 1e6) return (ns / 1e6).toFixed(2) + "ms";
    if (ns >= 1e3) return (ns / 1e3).toFixed(2) + "µs";
    return ns + "ns";
  }

  function node(t, i, state) {
    var kids = children(t, i), frac = t.total_ns ? t.dur[i] / t.total_ns : 0;
    var intervals = 0;
    for (var k = 0; k < kids.length; k++) if (!t.instant[kids[k]]) intervals++;
    var important = kids.length >= 6 || frac >= 0.01;
    var el = document.createElement("div");
    var kind = t.kinds[t.kind[i]];
    el.className = "node " + (KIND_CLASS[kind] || "other") + " " + fracClass(frac) +
      (important ? " important" : "") + (kids.length ? "" : " leaf");
    el.dataset.i = i;
    var head = document.createElement("div");
    head.className = "head";
    head.title = kind + ": " + t.labels[t.label[i]] + ", " + kids.length + " children";
    head.innerHTML = '<span class="toggle">' + (kids.length ? "▸" : "") + '</span>';
    var label = document.createElement("span");
    label.className = "label";
    label.textContent = t.labels[t.label[i]] + " ";
    head.appendChild(label);
    head.insertAdjacentHTML("beforeend", '<span class="pct">' + (100 * frac).toFixed(frac >= 0.01 ? 1 : 3) +
      '%</span> <span class="dur">' + fmt(t.dur[i]) + (intervals ? " · " + intervals + " children" : "") + "</span>" +
      (kids.length ? ' <a class="zoom" href="#file=' + t.file_id + "&zoom=" + i + '">zoom</a>' : ""));
    if (t.hits && t.hits[i] > 0) head.appendChild(dots(t.hits[i], t.labels[t.label[i]]));
    el.appendChild(head);
    var box = document.createElement("div");
    box.className = "kids";
    el.appendChild(box);
    if (kids.length && important && state.budget > 0 && state.depth < 4) {
      state.budget--;
      open(t, el, state);
    }
    return el;
  }

  // Cache hits of one query execution (QueryCacheHitCount): one dot per hit, at most 20 drawn.
  function dots(count, label) {
    var span = document.createElement("span");
    span.className = "hits inline";
    span.title = count + " cache hits of " + label;
    for (var h = 0; h < Math.min(count, 20); h++) {
      var d = document.createElement("span");
      d.className = "hit";
      span.appendChild(d);
    }
    if (count > 20) span.appendChild(document.createTextNode("+" + (count - 20)));
    return span;
  }

  function open(t, el, state) {
    var i = +el.dataset.i, box = el.lastChild;
    el.classList.add("open");
    el.firstChild.firstChild.textContent = "▾";
    if (box.dataset.filled) return;
    box.dataset.filled = "1";
    var kids = children(t, i), hits = [], boxes = [];
    for (var k = 0; k < kids.length; k++) (t.instant[kids[k]] ? hits : boxes).push(kids[k]);
    if (hits.length) {
      var dots = document.createElement("span");
      dots.className = "hits";
      dots.title = hits.length + " cache hits";
      var shown = Math.min(hits.length, PAGE);
      for (var h = 0; h < shown; h++) {
        var d = document.createElement("span");
        d.className = "hit";
        d.title = t.labels[t.label[hits[h]]];
        dots.appendChild(d);
      }
      if (hits.length > shown) dots.appendChild(document.createTextNode(" +" + (hits.length - shown)));
      box.appendChild(dots);
    }
    appendPage(t, box, boxes, 0, { budget: state ? state.budget : 0, depth: (state ? state.depth : 0) + 1 });
  }

  function appendPage(t, box, list, from, state) {
    var to = Math.min(list.length, from + PAGE);
    for (var k = from; k < to; k++) box.appendChild(node(t, list[k], state));
    if (to < list.length) {
      var more = document.createElement("button");
      more.className = "more";
      more.textContent = "show " + Math.min(PAGE, list.length - to) + " more of " + (list.length - to);
      more.onclick = function () { more.remove(); appendPage(t, box, list, to, { budget: 0, depth: 99 }); };
      box.appendChild(more);
    }
  }

  function toggle(ev) {
    var head = ev.target.closest(".head");
    if (!head || ev.target.classList.contains("zoom")) return;
    var el = head.parentNode, t = traces[current];
    if (el.classList.contains("leaf")) return;
    if (el.classList.contains("open")) {
      el.classList.remove("open");
      head.firstChild.textContent = "▸";
    } else {
      open(t, el, { budget: 0, depth: 99 });
    }
  }

  function crumbs(t, zoom) {
    var out = document.getElementById("crumbs");
    out.innerHTML = "";
    if (zoom == null) return;
    var path = [];
    for (var i = zoom; i >= 0; i = t.parent[i]) path.unshift(i);
    var top = document.createElement("a");
    top.href = "#file=" + t.file_id;
    top.textContent = "whole process";
    out.appendChild(top);
    path.forEach(function (i) {
      out.appendChild(document.createTextNode(" › "));
      var a = document.createElement("a");
      a.href = "#file=" + t.file_id + "&zoom=" + i;
      a.textContent = t.labels[t.label[i]];
      out.appendChild(a);
    });
  }

  function render(fileId, zoom) {
    var t = traces[fileId], root = document.getElementById("trace"), t0 = performance.now();
    current = fileId;
    root.innerHTML = "";
    var title = document.createElement("h2");
    title.textContent = (t.crate || "?") + " (pid " + t.pid + "): " + t.shown + " of " + t.events + " events, total " + fmt(t.total_ns);
    root.appendChild(title);
    var state = { budget: AUTO_OPEN_BUDGET, depth: 0 };
    if (zoom != null && zoom >= 0 && zoom < t.n) {
      var el = node(t, zoom, { budget: 0, depth: 0 });
      root.appendChild(el);
      if (!el.classList.contains("leaf")) open(t, el, { budget: AUTO_OPEN_BUDGET, depth: 0 });
    } else {
      // Threads with the most time first, and in each its top-level events heaviest first: the query that
      // costs most is at the top, where a thread listed by event count could push it 177,000 px down.
      var busy = {};
      Object.keys(t.roots).forEach(function (tid) {
        busy[tid] = t.roots[tid].reduce(function (sum, i) { return sum + t.dur[i]; }, 0);
      });
      Object.keys(t.roots).sort(function (a, b) { return busy[b] - busy[a] || a - b; }).forEach(function (tid) {
        var th = document.createElement("div");
        th.className = "thread";
        th.dataset.tid = tid;
        th.innerHTML = '<div class="title">thread ' + tid + ": " + fmt(busy[tid]) + " in " + t.roots[tid].length +
          " top-level events, heaviest first</div>";
        var heavy = t.roots[tid].slice().sort(function (a, b) { return t.dur[b] - t.dur[a] || a - b; });
        appendPage(t, th, heavy, 0, state);
        root.appendChild(th);
      });
    }
    crumbs(t, zoom);
    document.body.dataset.renderedFile = fileId;
    document.body.dataset.renderedZoom = zoom == null ? "" : zoom;
    document.body.dataset.renderMs = Math.round(performance.now() - t0);
    document.body.dataset.nodes = root.getElementsByClassName("node").length;
  }

  function load(fileId, done) {
    if (traces[fileId]) return done();
    var s = document.createElement("script");
    s.src = "profile_queries/trace-" + fileId + ".js";
    s.onload = done;
    s.onerror = function () { document.getElementById("trace").textContent = "cannot load " + s.src; };
    document.head.appendChild(s);
  }

  function route() {
    var params = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
      var p = kv.split("="); if (p[0]) params[p[0]] = decodeURIComponent(p[1] || "");
    });
    var fileId = params.file;
    if (fileId == null) {
      var firstLink = document.querySelector(".processes a");
      if (!firstLink) return;
      fileId = firstLink.getAttribute("href").replace(/^#file=/, "");
    }
    var zoom = params.zoom != null && params.zoom !== "" ? +params.zoom : null;
    load(fileId, function () { render(fileId, zoom); });
  }

  document.getElementById("trace").addEventListener("click", toggle);
  document.getElementById("expand-important").onclick = function () {
    var t = traces[current]; if (!t) return;
    var nodes = document.querySelectorAll("#trace .node.important:not(.open):not(.leaf)");
    for (var k = 0; k < nodes.length && k < AUTO_OPEN_BUDGET; k++) open(t, nodes[k], { budget: 0, depth: 99 });
  };
  document.getElementById("collapse-all").onclick = function () {
    document.querySelectorAll("#trace .node.open").forEach(function (el) {
      el.classList.remove("open"); el.firstChild.firstChild.textContent = "▸";
    });
  };
  window.addEventListener("hashchange", route);
  route();
})();
