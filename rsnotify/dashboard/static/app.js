/* rsnotify dashboard page: renders the snapshot the server pushes over /ws.
 *
 * The server does every computation (percentiles, lags, states); the page only
 * formats and draws.  Rows are keyed and updated in place, so 500 subscriber rows
 * cost a few milliseconds a second.  Every figure also carries its raw value in
 * data-value, which is what tests and scripts should read.
 */
(function () {
  "use strict";

  var STAGES = ["e2e", "detect", "publish", "deliver", "apply"];
  var STAGE_NAMES = { e2e: "End-to-end", detect: "Detect", publish: "Publish", deliver: "Deliver", apply: "Apply" };
  var WINDOWS = ["1m", "5m", "60m"];
  var QS = ["p50", "p90", "p99"];
  var STATE_TEXT = {
    "live": "● live",
    "polling": "◑ polling",
    "catching-up": "◐ catching up",
    "offline": "○ offline"
  };

  var $ = function (id) { return document.getElementById(id); };
  var snap = null;
  var pending = null;
  var paused = false;
  var lastMessage = 0;
  var stats = { messages: 0, renders: 0, renderMs: [], intervals: [], lastRenderAt: 0 };
  window.rsnotifyDashboard = {
    stats: stats,
    snapshot: function () { return snap; },
  };

  // -- formatting ------------------------------------------------------------------------

  function fmtSeconds(s) {
    if (s === null || s === undefined) return "–";
    if (s === 0) return "0 ms";
    if (s < 0.01) return (s * 1000).toFixed(2) + " ms";
    if (s < 0.1) return (s * 1000).toFixed(1) + " ms";
    if (s < 1) return (s * 1000).toFixed(0) + " ms";
    if (s < 60) return s.toFixed(2) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
    return (s / 3600).toFixed(1) + " h";
  }
  // One formatter: Number.toLocaleString builds a new one per call, which costs
  // tens of milliseconds over 500 rows.
  var INT = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
  function fmtInt(n) { return n === null || n === undefined ? "–" : INT.format(n); }
  function fmtRate(r) { return r === null || r === undefined ? "–" : (r < 10 ? r.toFixed(1) : r.toFixed(0)); }
  function fmtAgo(age) {
    if (age === null || age === undefined) return "never";
    if (age < 1) return "just now";
    if (age < 60) return Math.round(age) + " s ago";
    return fmtSeconds(age) + " ago";
  }
  function clock(t) {
    var d = new Date(t * 1000);
    return d.toTimeString().slice(0, 8);
  }
  function text(el, value) { if (el.textContent !== value) el.textContent = value; }
  function attr(el, name, value) {
    var v = value === null || value === undefined ? "" : String(value);
    if (el.getAttribute(name) !== v) el.setAttribute(name, v);
  }
  function setCell(td, shown, raw) { text(td, shown); attr(td, "data-value", raw); }

  // -- the latency table ---------------------------------------------------------------------

  var latencyCells = {};
  (function buildLatencyTable() {
    var body = $("latency-body");
    STAGES.forEach(function (stage) {
      var tr = document.createElement("tr");
      tr.className = stage;
      var th = document.createElement("th");
      th.scope = "row";
      th.textContent = STAGE_NAMES[stage];
      tr.appendChild(th);
      WINDOWS.forEach(function (w) {
        QS.forEach(function (q) {
          var td = document.createElement("td");
          td.className = "n";
          td.dataset.stage = stage; td.dataset.window = w; td.dataset.q = q;
          td.textContent = "–";
          tr.appendChild(td);
          latencyCells[stage + "/" + w + "/" + q] = td;
        });
      });
      var n = document.createElement("td");
      n.className = "n";
      n.dataset.stage = stage; n.dataset.window = "1m"; n.dataset.q = "n";
      tr.appendChild(n);
      latencyCells[stage + "/1m/n"] = n;
      body.appendChild(tr);
    });
  })();

  function renderLatency(lat) {
    var table = $("latency-table");
    attr(table, "data-through", lat.through);
    WINDOWS.forEach(function (w) { attr(table, "data-start-" + w, lat.window_start[w]); });
    STAGES.forEach(function (stage) {
      WINDOWS.forEach(function (w) {
        var s = lat.windows[w][stage];
        QS.forEach(function (q) { setCell(latencyCells[stage + "/" + w + "/" + q], fmtSeconds(s[q]), s[q]); });
      });
      var n = lat.windows["1m"][stage].n;
      setCell(latencyCells[stage + "/1m/n"], fmtInt(n), n);
    });
  }

  // -- charts (uPlot, shipped in /static) --------------------------------------------------

  var seriesChart = null, histChart = null, histLabels = [];
  var COLORS = ["#0b5fa5", "#b35900", "#7a1fa2"];

  function chartWidth(id) { return Math.max(240, $(id).clientWidth || 400); }

  function makeCharts() {
    if (typeof uPlot === "undefined" || seriesChart) return;
    var axis = { stroke: "#3d444d", grid: { stroke: "#e6e9ed" }, ticks: { stroke: "#c8ced5" } };
    seriesChart = new uPlot({
      width: chartWidth("series-chart"), height: 230,
      scales: { x: { time: true }, y: { range: function (u, min, max) { return [0, (max || 1) * 1.1]; } } },
      axes: [Object.assign({}, axis), Object.assign({}, axis, { label: "ms", size: 56 })],
      series: [
        {},
        { label: "p50", stroke: COLORS[0], width: 2, value: function (u, v) { return v === null ? "–" : v.toFixed(1) + " ms"; } },
        { label: "p90", stroke: COLORS[1], width: 2, dash: [8, 4], value: function (u, v) { return v === null ? "–" : v.toFixed(1) + " ms"; } },
        { label: "p99", stroke: COLORS[2], width: 2, dash: [2, 3], value: function (u, v) { return v === null ? "–" : v.toFixed(1) + " ms"; } },
      ],
    }, [[], [], [], []], $("series-chart"));
    histChart = new uPlot({
      width: chartWidth("hist-chart"), height: 230,
      scales: { x: { time: false, range: function (u, min, max) { return [min - 0.5, max + 0.5]; } }, y: { range: function (u, min, max) { return [0, (max || 1) * 1.1]; } } },
      axes: [
        Object.assign({}, axis, { label: "ms (bin lower edge)", space: 44, incrs: [1, 2, 4, 8, 16],
          values: function (u, splits) { return splits.map(function (i) { return histLabels[i] || ""; }); } }),
        Object.assign({}, axis, { label: "changes", size: 56 }),
      ],
      series: [
        { value: function (u, i) { return i === null ? "–" : (histLabels[i] || "") + " ms"; } },
        { label: "changes", stroke: "#0b5fa5", fill: "rgba(11,95,165,0.45)", width: 1,
          paths: uPlot.paths.bars({ size: [0.9, 64] }), points: { show: false } },
      ],
      legend: { show: true },
    }, [[], []], $("hist-chart"));
    if (typeof ResizeObserver !== "undefined") {
      new ResizeObserver(function () {
        seriesChart.setSize({ width: chartWidth("series-chart"), height: 230 });
        histChart.setSize({ width: chartWidth("hist-chart"), height: 230 });
      }).observe($("series-chart"));
    }
  }

  function ms(v) { return v === null || v === undefined ? null : v * 1000; }
  function labelMs(seconds) {
    var m = seconds * 1000;
    if (m === 0) return "0";
    if (m < 1) return m.toFixed(2);
    if (m < 10) return m.toFixed(1);
    return m.toFixed(0);
  }

  function renderCharts(lat) {
    makeCharts();
    var stage = $("stage").value;
    var range = $("range").value;
    var hw = $("hwindow").value;
    var series = range === "1m" ? lat.series_1m : lat.series_1s;
    var rangeText = range === "1m" ? "last 60 min, per minute" : "last 5 min, per second";
    text($("series-cap"), STAGE_NAMES[stage] + " latency percentiles, " + rangeText);
    var s1 = lat.windows["1m"][stage];
    text($("series-desc"), s1.n ? "Last minute: p50 " + fmtSeconds(s1.p50) + ", p90 " + fmtSeconds(s1.p90) +
      ", p99 " + fmtSeconds(s1.p99) + " over " + fmtInt(s1.n) + " changes." : "No changes applied in the last minute.");
    var hist = lat.histograms[hw][stage];
    histLabels = hist.lower.map(labelMs);
    text($("hist-cap"), STAGE_NAMES[stage] + " latency distribution, last " + hw.replace("m", " min"));
    var total = hist.count.reduce(function (a, b) { return a + b; }, 0);
    if (total) {
      var top = hist.count.indexOf(Math.max.apply(null, hist.count));
      text($("hist-desc"), fmtInt(total) + " changes; most between " + labelMs(hist.lower[top]) + " and " +
        labelMs(hist.upper[top]) + " ms (" + fmtInt(hist.count[top]) + ").");
    } else {
      text($("hist-desc"), "No changes in this window.");
    }
    if (!seriesChart) return;
    seriesChart.setData([
      series.t,
      series[stage + "_p50"].map(ms),
      series[stage + "_p90"].map(ms),
      series[stage + "_p99"].map(ms),
    ]);
    histChart.setData([hist.count.map(function (_, i) { return i; }), hist.count]);
  }

  // Collection ids are long ("host-port-path-hash"); where every id shares a prefix
  // (one Source), rows show the rest and keep the whole id in a tooltip.
  var shortPrefix = "";
  function updatePrefix(collections) {
    var ids = collections.map(function (c) { return c.id; });
    if (ids.length < 2) { shortPrefix = ""; return; }
    var p = ids.reduce(function (a, b) {
      var i = 0;
      while (i < a.length && a[i] === b[i]) i++;
      return a.slice(0, i);
    });
    shortPrefix = p.slice(0, p.lastIndexOf("-") + 1);
  }
  function shortId(id) {
    return shortPrefix && id.indexOf(shortPrefix) === 0 ? "…" + id.slice(shortPrefix.length) : id;
  }

  // -- keyed tables -------------------------------------------------------------------------

  function keyedRows(tbody, rows, keyOf, build, update) {
    var existing = {};
    Array.prototype.forEach.call(tbody.rows, function (tr) { existing[tr.dataset.key] = tr; });
    var order = [];
    rows.forEach(function (row) {
      var key = keyOf(row);
      var tr = existing[key];
      if (!tr) { tr = build(row); tr.dataset.key = key; }
      delete existing[key];
      update(tr, row);
      order.push(tr);
    });
    Object.keys(existing).forEach(function (k) { existing[k].remove(); });
    var same = order.length === tbody.rows.length && order.every(function (tr, i) { return tbody.rows[i] === tr; });
    if (!same) order.forEach(function (tr) { tbody.appendChild(tr); });
  }

  function cells(tr, count, numeric) {
    for (var i = 0; i < count; i++) {
      var td = document.createElement("td");
      if (numeric.indexOf(i) >= 0) td.className = "n";
      tr.appendChild(td);
    }
    return tr;
  }

  function badge(td, cls, label, raw) {
    var span = td.firstElementChild;
    if (!span) { span = document.createElement("span"); td.appendChild(span); }
    attr(span, "class", "badge " + cls);
    text(span, label);
    attr(td, "data-value", raw);
  }

  function renderCollections(rows) {
    keyedRows($("collections-body"), rows, function (c) { return c.id; }, function () {
      var tr = cells(document.createElement("tr"), 7, [1, 2, 3, 6]);
      tr.cells[0].className = "id";
      return tr;
    }, function (tr, c) {
      var td = tr.cells;
      attr(tr, "data-collection", c.id);
      setCell(td[0], c.id, c.id);
      attr(td[0], "title", c.capabilitylist);
      setCell(td[1], fmtInt(c.head), c.head);
      setCell(td[2], c.earliest === null ? "–" : fmtInt(c.earliest) + (c.retained !== null ? " (" + fmtInt(c.retained) + " kept)" : ""), c.earliest);
      setCell(td[3], fmtRate(c.rate_10s) + "/s", c.rate_10s);
      var p = c.publisher;
      badge(td[4], "h-" + p.health, p.health === "ok" ? "✓ ok" : (p.health === "unknown" ? "? unknown" : "! " + p.health), p.health);
      var note = td[4].querySelector(".muted");
      if (!note) { note = document.createElement("div"); note.className = "muted"; td[4].appendChild(note); }
      text(note, p.heartbeat === null ? "no heartbeat seen" : "heartbeat " + fmtAgo(p.age_s) + " via " + p.via);
      setCell(td[5], c.subscribers + " (" + c.live + " live, " + c.catching_up + " catching up, " + c.offline + " offline)", c.subscribers);
      setCell(td[6], fmtSeconds(c.max_lag_s), c.max_lag_s);
    });
  }

  function gapText(g, now) {
    if (!g || !g.reason) return "–";
    var parts = [g.reason];
    if (g.size !== null && g.size !== undefined) parts.push(fmtInt(g.size) + " missed");
    if (g.applied !== undefined) parts.push(fmtInt(g.applied) + " applied in " + fmtSeconds(g.duration_s));
    if (g.at) parts.push(fmtAgo(now - g.at));
    return parts.join(" · ");
  }

  function renderSubscribers(rows, now) {
    var filter = $("sub-filter").value.trim().toLowerCase();
    var state = $("sub-state").value;
    var shown = rows.filter(function (r) {
      if (state && r.state !== state) return false;
      if (filter && (r.subscriber + " " + r.collection).toLowerCase().indexOf(filter) < 0) return false;
      return true;
    });
    text($("sub-count"), shown.length === rows.length ? rows.length + " rows" : shown.length + " of " + rows.length + " rows");
    keyedRows($("subscribers-body"), shown, function (r) { return r.subscriber + "\u0000" + r.collection; }, function () {
      var tr = cells(document.createElement("tr"), 9, [4, 5, 6]);
      tr.cells[1].className = "id";
      var fields = ["subscriber", "collection", "state", "transport", "cursor", "lag_seq", "lag_s", "last_gap", "heartbeat"];
      fields.forEach(function (f, i) { tr.cells[i].dataset.field = f; });
      return tr;
    }, function (tr, r) {
      var td = tr.cells;
      attr(tr, "data-subscriber", r.subscriber);
      attr(tr, "data-collection", r.collection);
      attr(tr, "data-state", r.state);
      attr(tr, "class", "row-" + r.state);
      setCell(td[0], r.subscriber, r.subscriber);
      attr(td[0], "title", (r.host || "") + (r.pid ? " pid " + r.pid : ""));
      setCell(td[1], shortId(r.collection), r.collection);
      attr(td[1], "title", r.collection);
      badge(td[2], "s-" + r.state, STATE_TEXT[r.state] || r.state, r.state);
      // Degraded mode: the reason push is not used, on hover and for screen readers.
      attr(td[2], "title", r.mode_reason ? "push unavailable: " + r.mode_reason : "");
      setCell(td[3], r.transport, r.transport);
      setCell(td[4], fmtInt(r.cursor), r.cursor);
      attr(td[4], "data-head", r.head);
      setCell(td[5], fmtInt(r.lag_seq), r.lag_seq);
      setCell(td[6], fmtSeconds(r.lag_s), r.lag_s);
      attr(td[6], "data-at", r.lag_at);
      setCell(td[7], gapText(r.last_gap, now), r.last_gap ? r.last_gap.reason : "");
      setCell(td[8], fmtAgo(r.heartbeat_age_s), r.heartbeat);
    });
  }

  function renderEvents(events) {
    var kind = $("ev-kind").value;
    var list = $("events");
    var shown = events.filter(function (e) { return !kind || e.kind === kind; }).slice(0, 100);
    var key = shown.map(function (e) { return e.at + e.kind + e.subscriber + e.collection; }).join("|");
    if (list.dataset.key === key) return;
    list.dataset.key = key;
    var frag = document.createDocumentFragment();
    shown.forEach(function (e) {
      var li = document.createElement("li");
      li.dataset.kind = e.kind;
      var time = document.createElement("time");
      time.dateTime = new Date(e.at * 1000).toISOString();
      time.textContent = clock(e.at);
      var k = document.createElement("span");
      k.className = "badge k-" + e.kind;
      k.textContent = e.kind;
      var body = document.createElement("div");
      var what = document.createElement("div");
      what.className = "what";
      what.textContent = e.detail || "";
      var who = document.createElement("div");
      who.className = "who";
      who.textContent = [e.subscriber, e.collection && shortId(e.collection)].filter(Boolean).join(" · ");
      body.appendChild(what); body.appendChild(who);
      li.appendChild(time); li.appendChild(k); li.appendChild(body);
      frag.appendChild(li);
    });
    if (!shown.length) {
      var empty = document.createElement("li");
      empty.className = "muted";
      empty.textContent = "No events yet.";
      frag.appendChild(empty);
    }
    list.replaceChildren(frag);
  }

  // -- the whole page -------------------------------------------------------------------------

  var lastAnnounce = "";
  function renderTotals(s) {
    var t = s.totals;
    text($("k-collections"), fmtInt(t.collections));
    text($("k-subscribers"), fmtInt(t.subscribers));
    text($("k-live"), fmtInt(t.live));
    text($("k-catching"), fmtInt(t.catching_up));
    text($("k-offline"), fmtInt(t.offline));
    var e2e = s.latency.windows["1m"].e2e;
    text($("k-p50"), fmtSeconds(e2e.p50));
    text($("k-p99"), fmtSeconds(e2e.p99));
    text($("k-rate"), fmtRate(t.samples_per_s));
    var say = t.live + " live, " + t.catching_up + " catching up, " + t.offline + " offline";
    if (say !== lastAnnounce) { lastAnnounce = say; text($("announce"), "Subscriptions: " + say); }
    var redis = s.dashboard && s.dashboard.redis;
    var banner = $("banner");
    if (redis && !redis.ok) {
      banner.hidden = false;
      text(banner, "Redis is not answering (" + (redis.error || "unknown error") + "); figures are from " +
        (redis.last_ok ? clock(redis.last_ok) : "before start") + ".");
    } else if (!banner.hidden) {
      banner.hidden = true;
    }
  }

  function render(s) {
    var started = performance.now();
    snap = s;
    document.body.dataset.at = s.at;
    document.body.dataset.version = s.dashboard ? s.dashboard.version : "";
    updatePrefix(s.collections);
    renderTotals(s);
    renderLatency(s.latency);
    renderCharts(s.latency);
    renderCollections(s.collections);
    renderSubscribers(s.subscribers, s.at);
    renderEvents(s.events);
    var done = performance.now();
    stats.renders += 1;
    stats.renderMs.push(done - started);
    if (stats.lastRenderAt) stats.intervals.push(done - stats.lastRenderAt);
    stats.lastRenderAt = done;
    if (stats.renderMs.length > 600) { stats.renderMs.shift(); stats.intervals.shift(); }
  }

  function setConnection(cls, message) {
    var el = $("connection");
    attr(el, "class", "conn " + cls);
    text(el, message);
  }

  function connect(delay) {
    var proto = location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(proto + location.host + "/ws");
    ws.onopen = function () { delay = 500; setConnection("conn-ok", "Live"); };
    ws.onmessage = function (e) {
      stats.messages += 1;
      lastMessage = Date.now();
      var s = JSON.parse(e.data);
      if (paused) { pending = s; return; }
      render(s);
    };
    ws.onclose = function () {
      setConnection("conn-bad", "Disconnected; reconnecting…");
      setTimeout(function () { connect(Math.min((delay || 500) * 2, 10000)); }, delay || 500);
    };
  }

  setInterval(function () {
    if (!lastMessage || paused) return;
    var age = (Date.now() - lastMessage) / 1000;
    var interval = snap && snap.dashboard ? snap.dashboard.interval : 1;
    if (age > 3 * interval + 1) setConnection("conn-bad", "No update for " + age.toFixed(0) + " s");
    else setConnection("conn-ok", "Live · updated " + clock(snap.at));
  }, 1000);

  $("pause").addEventListener("click", function () {
    paused = !paused;
    this.setAttribute("aria-pressed", String(paused));
    this.textContent = paused ? "Resume updates" : "Pause updates";
    if (paused) setConnection("conn-wait", "Paused");
    if (!paused && pending) { render(pending); pending = null; }
  });
  ["stage", "range", "hwindow"].forEach(function (id) {
    $(id).addEventListener("change", function () { if (snap) renderCharts(snap.latency); });
  });
  ["sub-filter", "sub-state"].forEach(function (id) {
    $(id).addEventListener("input", function () { if (snap) renderSubscribers(snap.subscribers, snap.at); });
  });
  $("ev-kind").addEventListener("change", function () { if (snap) renderEvents(snap.events); });

  connect(500);
})();
