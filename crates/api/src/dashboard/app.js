// The live sale page: polls dashboard/data once a second and draws it. Everything the
// server sends is data: text goes in with textContent only (product names are the shop's
// input), and the charts are SVG elements built here, so the page needs no library, no
// inline script and nothing from outside this server.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  // How often the page asks, and after how long without an answer it says so.
  const POLL_MS = 1000;
  const STALE_MS = 5000;
  // The outcomes drawn as lines of their own; the rest are summed as "other".
  const SERIES = [
    ["created", "created", "c-created"],
    ["replayed", "replayed", "c-replayed"],
    ["sold_out", "sold out", "c-sold-out"],
    ["limit_exceeded", "limit exceeded", "c-limit"],
    ["rate_limited", "rate limited", "c-rate-limited"],
    ["unavailable", "unavailable (503)", "c-unavailable"],
    ["other", "other errors", "c-other"],
  ];
  const KNOWN = new Set(SERIES.map((s) => s[0]));

  const $ = (id) => document.getElementById(id);
  let lastOk = 0;
  let lastData = null;
  // The admin token, once entered: in this page's memory only (no cookie, no storage),
  // so no other site's page can act with it (no CSRF) and a reload forgets it. With it,
  // each product offers pause or resume.
  let adminToken = null;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  }

  function num(n) {
    return n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US");
  }

  function ms(seconds) {
    if (seconds === null || seconds === undefined) return "—";
    const m = seconds * 1000;
    if (m < 1) return m.toFixed(2) + " ms";
    if (m < 100) return m.toFixed(1) + " ms";
    return Math.round(m).toLocaleString("en-US") + " ms";
  }

  // A time of the server's as the rest of flashsale writes it (the demo's product names,
  // its logs): 24-hour UTC, not the browser's local clock.
  function utcClock(iso) {
    return new Date(iso).toISOString().slice(11, 19) + " UTC";
  }

  function ago(fromIso, nowIso) {
    const s = Math.max(0, (Date.parse(nowIso) - Date.parse(fromIso)) / 1000);
    if (s < 90) return Math.round(s) + " s ago";
    if (s < 5400) return Math.round(s / 60) + " min ago";
    if (s < 172800) return Math.round(s / 3600) + " h ago";
    return Math.round(s / 86400) + " days ago";
  }

  function setStatus(cls, text) {
    const s = $("status");
    s.className = "status " + cls;
    s.textContent = text;
  }

  // The answers of one sample by series: the known outcomes, the rest as "other".
  function bySeries(sample) {
    const out = {};
    for (const [key] of SERIES) out[key] = 0;
    for (const [outcome, n] of Object.entries(sample.purchases)) {
      out[KNOWN.has(outcome) ? outcome : "other"] += n;
    }
    return out;
  }

  // The chart's frame: its size from its box (so it fits a phone), the time axis from
  // the server's clock (the samples' times), `window` seconds wide ending at `now`.
  function frame(box, now, windowS) {
    const width = Math.max(240, Math.floor(box.clientWidth));
    const height = width < 500 ? 170 : 220;
    const pad = { l: 52, r: 10, t: 10, b: 22 };
    const end = Date.parse(now);
    const start = end - windowS * 1000;
    const x = (iso) => pad.l + ((Date.parse(iso) - start) / (end - start)) * (width - pad.l - pad.r);
    return { width, height, pad, x, start, end };
  }

  function axes(root, f, ticks, y) {
    for (const [v, label] of ticks) {
      const yy = y(v);
      root.appendChild(svg("line", { x1: f.pad.l, x2: f.width - f.pad.r, y1: yy, y2: yy, class: "grid" }));
      const t = svg("text", { x: f.pad.l - 6, y: yy + 4, class: "tick", "text-anchor": "end" });
      t.textContent = label;
      root.appendChild(t);
    }
    const span = (f.end - f.start) / 1000;
    for (const back of [span, span / 2, 0]) {
      const xx = f.pad.l + ((span - back) / span) * (f.width - f.pad.l - f.pad.r);
      const t = svg("text", { x: xx, y: f.height - 6, class: "tick", "text-anchor": back === span ? "start" : back === 0 ? "end" : "middle" });
      t.textContent = back === 0 ? "now" : "-" + Number((back / 60).toFixed(1)) + " min";
      root.appendChild(t);
    }
  }

  // A path through the points, broken where a value is null (no answer that second).
  function pathOf(points) {
    let d = "";
    let pen = false;
    for (const [px, py] of points) {
      if (py === null) {
        pen = false;
        continue;
      }
      d += (pen ? "L" : "M") + px.toFixed(1) + " " + py.toFixed(1);
      pen = true;
    }
    return d;
  }

  function niceMax(v) {
    if (v <= 1) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  function drawRates(data) {
    const box = $("chart-rate");
    const windowS = data.history_max * data.sample_interval_seconds;
    const f = frame(box, data.generated_at, windowS);
    const rows = data.samples.map((s) => ({ at: s.at, v: bySeries(s), sec: s.seconds }));
    let max = 0;
    for (const r of rows) for (const [k] of SERIES) max = Math.max(max, r.v[k] / r.sec);
    max = niceMax(max);
    const y = (v) => f.height - f.pad.b - (v / max) * (f.height - f.pad.t - f.pad.b);
    const root = svg("svg", { width: f.width, height: f.height, viewBox: `0 0 ${f.width} ${f.height}`, role: "img", "aria-label": "purchases per second by outcome" });
    axes(root, f, [0, max / 2, max].map((v) => [v, num(Math.round(v * 10) / 10)]), y);
    const legend = $("legend-rate");
    legend.replaceChildren();
    for (const [key, label, cls] of SERIES) {
      const total = rows.reduce((a, r) => a + r.v[key], 0);
      if (total === 0 && key !== "created" && key !== "sold_out") continue;
      const points = rows.map((r) => [f.x(r.at), y(r.v[key] / r.sec)]);
      const p = svg("path", { d: pathOf(points), class: "line " + cls, "data-series": key, "data-points": String(points.length) });
      root.appendChild(p);
      const last = rows.length ? rows[rows.length - 1] : null;
      const li = el("li", cls);
      li.dataset.series = key;
      li.appendChild(el("span", "swatch"));
      li.appendChild(el("span", "label", label));
      const now = el("span", "now", last ? num(Math.round((last.v[key] / last.sec) * 10) / 10) + "/s" : "—");
      now.dataset.field = "rate";
      li.appendChild(now);
      const sum = el("span", "total", num(total));
      sum.dataset.field = "total";
      sum.title = "answers in the window";
      li.appendChild(sum);
      legend.appendChild(li);
    }
    box.replaceChildren(root);
    $("window-note").textContent = "(last " + Math.round(windowS / 60) + " min, this instance)";
    const last = rows.length ? rows[rows.length - 1] : null;
    const all = last ? SERIES.reduce((a, [k]) => a + last.v[k], 0) / last.sec : null;
    $("rate").textContent = all === null ? "—" : num(Math.round(all * 10) / 10);
  }

  function drawLatency(data) {
    const box = $("chart-latency");
    const windowS = data.history_max * data.sample_interval_seconds;
    const f = frame(box, data.generated_at, windowS);
    // Log scale from 10 µs to 10 s: a refusal takes tens of microseconds, a request at
    // its deadline seconds; both must stay readable on one chart.
    const lo = -5;
    const hi = 1;
    const y = (s) => {
      if (s === null || s === undefined) return null;
      const l = Math.min(hi, Math.max(lo, Math.log10(Math.max(s, 1e-6))));
      return f.height - f.pad.b - ((l - lo) / (hi - lo)) * (f.height - f.pad.t - f.pad.b);
    };
    const root = svg("svg", { width: f.width, height: f.height, viewBox: `0 0 ${f.width} ${f.height}`, role: "img", "aria-label": "purchase answer time p50 and p99" });
    axes(root, f, [[1e-5, "10µs"], [1e-4, "0.1ms"], [1e-3, "1ms"], [1e-2, "10ms"], [1e-1, "100ms"], [1, "1s"], [10, "10s"]], (v) => y(v));
    const legend = $("legend-latency");
    legend.replaceChildren();
    for (const [key, label, cls] of [["p50_seconds", "p50", "c-p50"], ["p99_seconds", "p99", "c-p99"]]) {
      const points = data.samples.map((s) => [f.x(s.at), y(s[key])]);
      root.appendChild(svg("path", { d: pathOf(points), class: "line " + cls, "data-series": key, "data-points": String(points.length) }));
      let last = null;
      for (const s of data.samples) if (s[key] !== null) last = s[key];
      const li = el("li", cls);
      li.dataset.series = key;
      li.appendChild(el("span", "swatch"));
      li.appendChild(el("span", "label", label));
      const v = el("span", "now", ms(last));
      v.dataset.field = "latest";
      li.appendChild(v);
      legend.appendChild(li);
    }
    box.replaceChildren(root);
  }

  function figure(name, value, cls) {
    const d = el("div", "fig " + cls);
    d.appendChild(el("dt", null, name));
    const dd = el("dd", null, num(value));
    dd.dataset.field = cls;
    d.appendChild(dd);
    return d;
  }

  // An action's idempotency key: 128 random bits (crypto.getRandomValues works on any
  // origin, unlike randomUUID), in the request_id's alphabet.
  function requestId() {
    const bytes = new Uint8Array(16);
    crypto.getRandomValues(bytes);
    return "DASH_" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  // Pauses or resumes a product's sale through the API, with the admin token; the answer
  // (the product as it is now) is shown at once, before the next poll.
  async function act(productId, what, button) {
    button.disabled = true;
    const note = $("admin-note");
    try {
      const r = await fetch("v1/products/" + productId + "/" + what, {
        method: "POST",
        cache: "no-store",
        headers: { "Authorization": "Bearer " + adminToken, "Content-Type": "application/json" },
        body: JSON.stringify({ request_id: requestId() }),
      });
      const body = await r.json().catch(() => ({}));
      if (!r.ok) throw new Error("HTTP " + r.status + (body.error ? " " + body.error : ""));
      note.textContent = "#" + productId + " " + (body.paused ? "paused" : "on sale again");
      const shown = lastData && lastData.products.find((p) => p.product_id === productId);
      if (shown) {
        shown.paused = body.paused;
        drawProducts(lastData);
      }
    } catch (e) {
      note.textContent = "#" + productId + ": " + what + " failed (" + e.message + ")";
      button.disabled = false;
    }
  }

  function actions(p) {
    const what = p.paused ? "resume" : "pause";
    const button = el("button", "act", p.paused ? "Resume" : "Pause");
    button.type = "button";
    button.dataset.action = what;
    button.addEventListener("click", () => act(p.product_id, what, button));
    return button;
  }

  function drawProducts(data) {
    const host = $("products");
    host.replaceChildren();
    $("products-note").textContent = data.products.length
      ? "The newest " + data.products.length + " product(s), highest id first."
      : "No product on sale yet.";
    for (const p of data.products) {
      const card = el("article", "product");
      card.dataset.productId = String(p.product_id);
      const head = el("div", "product-head");
      const name = el("span", "name", p.name);
      name.dataset.field = "name";
      head.appendChild(name);
      head.appendChild(el("span", "pid", "#" + p.product_id));
      const mode = el("span", "mode mode-" + p.stock_mode, p.stock_mode === "ledger" ? "ledger mode" : "gate");
      mode.dataset.field = "mode";
      mode.title = p.stock_mode === "ledger" ? "sold from MariaDB alone: Redis unreachable" : "sold through the Redis gate";
      head.appendChild(mode);
      if (p.paused) {
        const paused = el("span", "mode paused", "paused");
        paused.dataset.field = "paused";
        paused.title = "the operator paused this sale: purchases answer sale_paused";
        head.appendChild(paused);
      }
      if (adminToken) head.appendChild(actions(p));
      card.appendChild(head);
      // One bar, the total: sold, reserved (awaiting payment), available, and what is in
      // flight between Redis and MariaDB (taken at the gate, not yet committed).
      const bar = el("div", "bar");
      bar.setAttribute("role", "img");
      const total = p.total || 0;
      const parts = [["sold", p.sold], ["reserved", p.reserved], ["available", p.available]];
      const known = parts.reduce((a, [, v]) => a + (v || 0), 0);
      parts.push(["inflight", Math.max(0, total - known)]);
      bar.setAttribute("aria-label", parts.map(([k, v]) => k + " " + num(v)).join(", ") + " of " + num(p.total));
      for (const [k, v] of parts) {
        const seg = el("div", "seg seg-" + k);
        seg.style.width = total > 0 ? ((100 * (v || 0)) / total).toFixed(3) + "%" : "0%";
        bar.appendChild(seg);
      }
      card.appendChild(bar);
      // The figures in the bar's order, left to right, each with its segment's colour.
      const figs = el("dl", "figures");
      figs.appendChild(figure("total", p.total, "total"));
      figs.appendChild(figure("sold", p.sold, "sold"));
      figs.appendChild(figure("reserved", p.reserved, "reserved"));
      figs.appendChild(figure("available", p.available, "available"));
      card.appendChild(figs);
      host.appendChild(card);
    }
  }

  function drawCards(data) {
    const ledger = data.products.filter((p) => p.stock_mode === "ledger").length;
    const mode = $("mode");
    mode.textContent = ledger === 0 ? "gate" : "ledger mode: " + ledger + " of " + data.products.length;
    $("card-mode").className = "card " + (ledger === 0 ? "ok" : "warn");
    const st = data.stores;
    $("stores").textContent = "Redis " + (st.redis_up ? "up" : "DOWN") + " · MariaDB " + (st.mariadb_up ? "up" : "DOWN");
    if (!st.redis_up || !st.mariadb_up) $("card-mode").className = "card bad";

    $("outbox").textContent = num(data.outbox_unsent);
    const parked = data.outbox_parked;
    $("outbox-note").textContent = "events not yet on NATS · " + (parked === null ? "—" : num(parked)) + " parked";
    $("card-outbox").className = "card " + (data.outbox_unsent === null || parked > 0 ? "bad" : data.outbox_unsent > 1000 ? "warn" : "ok");

    const inc = data.incidents;
    $("incidents").textContent = inc.open === null ? "—" : num(inc.open);
    $("incidents-note").textContent = (inc.open === null ? "ledger not read" : "recovery, open in the ledger")
      + " · " + num(inc.recorded_here) + " recorded here";
    $("card-incidents").className = "card " + (inc.open === null ? "bad" : inc.open > 0 ? "bad" : "ok");

    const audit = data.audit;
    const a = audit ? audit.last : null;
    if (audit === null) {
      $("audit").textContent = "—";
      $("audit-note").textContent = "ledger not read";
      $("card-audit").className = "card bad";
    } else if (a === null) {
      $("audit").textContent = "never";
      $("audit-note").textContent = "run flashsale audit";
      $("card-audit").className = "card warn";
    } else {
      const day = audit.violations_24h;
      // The verdict alone on the card's line (a card is narrow); when, in its note.
      $("audit").textContent = a.clean ? "clean" : "VIOLATED";
      $("audit-note").textContent = ago(a.recorded_at, data.generated_at) + " · "
        + (a.product_id === null ? num(a.products) + " product(s)" : "product #" + a.product_id)
        + " · " + num(a.violations) + " violation(s) · " + num(a.pending) + " pending"
        + (day === null ? "" : " · " + num(day) + " violation(s) in 24 h");
      $("card-audit").className = "card " + (a.clean && !(day > 0) ? "ok" : "bad");
    }

    const d = data.reconcile_drift;
    $("drift").textContent = d.products === 0 ? "none" : num(d.products) + " product(s)";
    $("drift-note").textContent = d.products === 0 ? "last pass, this instance" : num(d.units) + " unit(s), last pass";
    $("card-drift").className = "card " + (d.products === 0 ? "ok" : "warn");
  }

  function draw(data) {
    drawCards(data);
    drawRates(data);
    drawLatency(data);
    drawProducts(data);
    const read = data.stores.read_at ? "stores read " + ago(data.stores.read_at, data.generated_at) : "stores not read yet";
    setStatus("live", "live · " + utcClock(data.generated_at) + " · " + read);
    document.body.dataset.generatedAt = data.generated_at;
  }

  async function poll() {
    try {
      const r = await fetch("dashboard/data", { cache: "no-store" });
      if (!r.ok) throw new Error("HTTP " + r.status);
      lastData = await r.json();
      draw(lastData);
      lastOk = Date.now();
    } catch (e) {
      const since = lastOk ? Math.round((Date.now() - lastOk) / 1000) + " s" : "ever";
      if (!lastOk || Date.now() - lastOk > STALE_MS) {
        setStatus("stale", "not updated for " + since + " (" + e.message + "); retrying");
      }
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  // The charts are drawn to their box's width: a turned phone redraws them at once.
  let resized = null;
  window.addEventListener("resize", () => {
    clearTimeout(resized);
    resized = setTimeout(() => {
      if (lastData) draw(lastData);
    }, 200);
  });

  $("admin").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = $("admin-token");
    adminToken = input.value.trim() || null;
    input.value = "";
    $("admin-note").textContent = adminToken
      ? "token set for this page: each product offers pause or resume"
      : "no token: nothing can be paused here";
    if (lastData) drawProducts(lastData);
  });

  poll();
})();
