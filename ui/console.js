// fencegate console: vanilla JS, no dependency, nothing fetched from elsewhere.
// Data: GET /v1/admin/overview (polled) and the event stream GET /v1/admin/events, read with
// fetch() (EventSource cannot send an Authorization header).
"use strict";

(() => {
  const CREDENTIAL_KEY = "fencegate.credential";
  const SVG = "http://www.w3.org/2000/svg";
  const CHART_SECONDS = 120;
  const OVERVIEW_EVERY_MS = 5000;
  const REFUSALS_SHOWN = 50;

  const $ = (id) => document.getElementById(id);
  const state = {
    locks: new Map(), // name -> {name, holder, token, deadline, ttl}
    refusals: [], // newest first
    rate: new Map(), // second -> {accepted, refused}
    stream: null, // AbortController of the open stream
    counters: null, // the overview's, refusals added as they stream in
    needsCredential: false,
    lastEventAt: 0,
  };

  // ---- talking to the server -------------------------------------------------------------

  function credential() {
    return sessionStorage.getItem(CREDENTIAL_KEY);
  }

  function headers(extra) {
    const h = Object.assign({}, extra || {});
    const c = credential();
    if (c) h["Authorization"] = "Bearer " + c;
    return h;
  }

  class Unauthorized extends Error {}

  // Any call; a 401 or 403 on the console's own data asks for a credential.
  async function call(method, path, opts) {
    opts = opts || {};
    const h = {};
    if (opts.token !== undefined) h["X-Fencing-Token"] = String(opts.token);
    if (opts.scope !== undefined) h["X-Fencing-Scope"] = encodeURIComponent(opts.scope);
    const init = { method, headers: headers(h), cache: "no-store" };
    if (opts.body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(opts.body);
    }
    const response = await fetch(path, init);
    let body = null;
    const text = await response.text();
    if (text) {
      try { body = JSON.parse(text); } catch (_) { body = { detail: text }; }
    }
    if (response.status === 401 || (response.status === 403 && opts.admin)) {
      askForCredential(response.status, body);
      throw new Unauthorized(body && body.detail);
    }
    return { status: response.status, body };
  }

  function askForCredential(status, body) {
    state.needsCredential = true;
    const form = $("login");
    const had = credential();
    $("login-error").textContent =
      status === 403 ? "This credential lacks the admin right: " + ((body && body.detail) || "forbidden")
        : had ? "The server refused this credential: " + ((body && body.detail) || "unauthenticated") : "";
    if (form.hidden) {
      form.hidden = false;
      $("credential").focus();
    }
    setStatus("credential needed", "warn");
  }

  $("login").addEventListener("submit", (e) => {
    e.preventDefault();
    const value = $("credential").value.trim();
    if (!value) return;
    sessionStorage.setItem(CREDENTIAL_KEY, value);
    $("credential").value = "";
    $("login").hidden = true;
    state.needsCredential = false;
    start();
  });

  function setStatus(text, kind) {
    const s = $("status");
    s.textContent = text;
    s.dataset.kind = kind || "";
  }

  // ---- overview --------------------------------------------------------------------------

  async function loadOverview() {
    const { status, body } = await call("GET", "/v1/admin/overview", { admin: true });
    if (status !== 200) {
      setStatus("overview: " + status + " " + ((body && body.detail) || ""), "bad");
      return;
    }
    const now = performance.now();
    const fresh = new Map();
    for (const l of body.locks) {
      const old = state.locks.get(l.name);
      fresh.set(l.name, {
        name: l.name,
        holder: l.holder,
        token: l.token,
        deadline: now + l.remaining_ms,
        ttl: old && old.token === l.token ? Math.max(old.ttl, l.remaining_ms) : l.remaining_ms,
      });
    }
    state.locks = fresh;
    renderLocks();
    renderFences(body.fences);
    renderUnfenced(body.unfenced || []);
    renderSqlRefusals(body.sql_refusals || {});
    // Refusals: every process's (the database's), merged with what the stream already
    // brought; one refusal has one uid in both.
    const known = new Set(state.refusals.map((r) => r.uid));
    for (const r of body.refusals) if (!known.has(r.uid)) state.refusals.push(r);
    state.refusals.sort((a, b) => b.at_ms - a.at_ms);
    state.refusals.length = Math.min(state.refusals.length, REFUSALS_SHOWN);
    renderRefusals();
    for (const s of body.rate) {
      if (!state.rate.has(s.second)) state.rate.set(s.second, { accepted: s.accepted, refused: s.refused });
    }
    renderChart();
    state.counters = body.counters;
    renderTotals();
  }

  // ---- the event stream ------------------------------------------------------------------

  async function openStream() {
    if (state.stream) state.stream.abort();
    const controller = new AbortController();
    state.stream = controller;
    let response;
    try {
      response = await fetch("/v1/admin/events", { headers: headers(), signal: controller.signal, cache: "no-store" });
    } catch (_) {
      return retryStream(controller);
    }
    if (response.status === 401 || response.status === 403) {
      let body = null;
      try { body = await response.json(); } catch (_) { /* not JSON */ }
      askForCredential(response.status, body);
      return;
    }
    if (response.status !== 200 || !response.body) {
      setStatus("event stream: " + response.status + ", retrying", "warn");
      return retryStream(controller);
    }
    setStatus("live", "ok");
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
          dispatch(block);
        }
      }
    } catch (_) {
      // aborted or the connection dropped: reconnect below
    }
    retryStream(controller);
  }

  function retryStream(controller) {
    if (state.stream !== controller || controller.signal.aborted || state.needsCredential) return;
    setStatus("reconnecting…", "warn");
    setTimeout(() => {
      if (state.stream === controller) {
        loadOverview().catch(() => {});
        openStream();
      }
    }, 2000);
  }

  // A grant or release raised or left a fence: read the fences again, once, shortly.
  let refreshTimer = null;
  function refreshSoon() {
    if (refreshTimer) return;
    refreshTimer = setTimeout(() => {
      refreshTimer = null;
      loadOverview().catch(() => {});
    }, 300);
  }

  function dispatch(block) {
    let type = "message";
    let data = "";
    for (const line of block.split(/\r?\n/)) {
      if (line.startsWith("event:")) type = line.slice(6).trim();
      else if (line.startsWith("data:")) data += line.slice(5).replace(/^ /, "");
    }
    if (!data) return;
    let e;
    try { e = JSON.parse(data); } catch (_) { return; }
    state.lastEventAt = Date.now();
    switch (type) {
      case "grant":
      case "renew":
        state.locks.set(e.name, {
          name: e.name, holder: e.holder, token: e.token,
          deadline: performance.now() + e.ttl_ms, ttl: e.ttl_ms,
        });
        renderLocks();
        if (type === "grant") refreshSoon();
        break;
      case "release":
        state.locks.delete(e.name);
        renderLocks();
        refreshSoon();
        break;
      case "refusal":
        if (!state.refusals.some((r) => r.uid === e.uid)) {
          state.refusals.unshift(e);
          state.refusals.length = Math.min(state.refusals.length, REFUSALS_SHOWN);
          renderRefusals(e.uid);
          // Refusals are counted as they come; accepted writes with the next overview.
          if (state.counters) {
            state.counters.refused += 1;
            renderTotals();
          }
        }
        break;
      case "tick":
        state.rate.set(e.second, { accepted: e.accepted, refused: e.refused });
        renderChart();
        break;
      case "dropped":
        setStatus("fell behind; reconnecting", "warn");
        break;
      default:
        break;
    }
  }

  // ---- rendering -------------------------------------------------------------------------

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") node.textContent = v;
      else if (k === "class") node.className = v;
      else node.setAttribute(k, v);
    }
    for (const c of children || []) node.append(c);
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // Names and owners come from clients: a right-to-left override (U+202E), a zero-width space or
  // a no-break space would make one name look like another. Such characters are shown as
  // ⟨U+XXXX⟩, never rendered; plain spaces stay as they are.
  const HIDDEN = /(?! )[\p{Cc}\p{Cf}\p{Z}\u115F\u1160\u3164\uFFA0]/gu;

  function shown(text) {
    if (text === null || text === undefined) return text;
    return String(text).replace(HIDDEN, (c) => "⟨U+" + c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0") + "⟩");
  }

  function seconds(ms) {
    return (Math.max(0, ms) / 1000).toFixed(1) + " s";
  }

  function renderLocks() {
    const body = $("locks").tBodies[0];
    const rows = [...state.locks.values()].sort((a, b) => a.name.localeCompare(b.name));
    body.replaceChildren(
      ...rows.map((l) => {
        const progress = el("progress", { max: String(Math.max(1, l.ttl)), value: "0" });
        const left = el("span", { class: "left" });
        return el("tr", { "data-lock": l.name }, [
          el("td", { class: "name", text: shown(l.name) }),
          el("td", { class: "holder", text: shown(l.holder) }),
          el("td", { class: "token num", text: l.token }),
          el("td", { class: "lease" }, [progress, left]),
        ]);
      }),
    );
    $("locks-empty").hidden = rows.length > 0;
    tickLeases();
  }

  function tickLeases() {
    const now = performance.now();
    for (const row of $("locks").tBodies[0].rows) {
      const l = state.locks.get(row.dataset.lock);
      if (!l) continue;
      const remaining = l.deadline - now;
      row.querySelector("progress").value = Math.max(0, remaining);
      row.querySelector(".left").textContent = remaining > 0 ? seconds(remaining) : "lapsed";
      row.classList.toggle("lapsed", remaining <= 0);
    }
  }

  function renderFences(fences) {
    $("fences").tBodies[0].replaceChildren(
      ...fences.map((f) =>
        el("tr", { "data-scope": f.scope }, [
          el("td", { class: "name", text: shown(f.scope) }),
          el("td", { class: "num", text: f.fence_token }),
          el("td", { class: "when", text: new Date(f.updated_at).toLocaleTimeString() }),
        ]),
      ),
    );
    $("fences-empty").hidden = fences.length > 0;
  }

  // Writes to guarded tables that came without fencegate.fence() (audit mode): shown only when
  // there are some, so a team sees who still writes around the fence.
  function renderUnfenced(rows) {
    $("unfenced-panel").hidden = rows.length === 0;
    $("unfenced").tBodies[0].replaceChildren(
      ...rows.map((u) =>
        el("tr", { "data-resource": u.resource }, [
          el("td", { class: "name", text: shown(u.resource) }),
          el("td", { class: "num", text: String(u.writes) }),
          el("td", { class: "name", text: shown(u.last_role) }),
          el("td", { class: "when", text: new Date(u.last_at).toLocaleTimeString() }),
        ]),
      ),
    );
  }

  function renderSqlRefusals(counts) {
    const rows = Object.entries(counts).filter(([, n]) => n > 0);
    $("sql-refusals-panel").hidden = rows.length === 0;
    $("sql-refusals").tBodies[0].replaceChildren(
      ...rows.map(([kind, n]) =>
        el("tr", { "data-kind": kind }, [
          el("td", { class: "name", text: shown(kind) }),
          el("td", { class: "num", text: String(n) }),
        ]),
      ),
    );
  }

  const KINDS = {
    stale: ["412 stale", "a newer holder exists"],
    not_issued: ["422 not issued", "above the lock's latest grant"],
    jump: ["422 jump", "raises the fence too far"],
    scope_mismatch: ["409 scope", "the key is bound to another scope"],
    bad_proof: ["422 proof", "the token's signature is missing or wrong"],
  };

  function target(r) {
    if (r.kind === "scope_mismatch") {
      return r.key + " (bound to " + (r.scope === null ? "no scope" : r.scope) + ", sent " +
        (r.presented_scope === null ? "none" : r.presented_scope) + ")";
    }
    let t = r.resource ? r.resource + "/" + r.key : r.key || (r.scope !== null && r.scope !== undefined ? "scope " + r.scope : "");
    if (r.key && r.scope) t += " (scope " + r.scope + ")";
    if (r.keys > 1) t += " +" + (r.keys - 1) + " keys";
    return t;
  }

  function renderRefusals(newUid) {
    const body = $("refusals").tBodies[0];
    body.replaceChildren(
      ...state.refusals.map((r) => {
        const [label, why] = KINDS[r.kind] || [r.kind, ""];
        const row = el("tr", { "data-kind": r.kind, "data-id": r.uid, class: r.uid === newUid ? "new" : "" }, [
          el("td", { class: "when", "data-at": String(r.at_ms), title: new Date(r.at_ms).toLocaleString() }),
          el("td", { class: "kind " + r.kind, title: why + (r.detail ? "; " + r.detail : ""), text: label }),
          el("td", { class: "name target", text: shown(target(r)) }),
          el("td", { class: "num presented", text: r.presented_token === null ? "-" : r.presented_token }),
          el("td", { class: "num current", text: r.current_token === null ? "-" : r.current_token }),
        ]);
        row.dataset.key = r.key || "";
        row.dataset.scope = r.scope || "";
        return row;
      }),
    );
    $("refusals-empty").hidden = state.refusals.length > 0;
    tickAges();
  }

  function tickAges() {
    const now = Date.now();
    for (const cell of document.querySelectorAll("#refusals td.when")) {
      const s = Math.max(0, Math.round((now - Number(cell.dataset.at)) / 1000));
      cell.textContent = s < 60 ? s + " s ago" : s < 3600 ? Math.floor(s / 60) + " min ago" : new Date(Number(cell.dataset.at)).toLocaleTimeString();
    }
  }

  function renderTotals() {
    const c = state.counters;
    if (!c) return;
    $("totals").textContent = "since start: " + c.accepted + " accepted, " + c.refused + " refused";
  }

  function renderChart() {
    const chart = $("chart");
    const W = 600, H = 150, top = 14, bottom = 16;
    const newest = Math.max(Math.floor(Date.now() / 1000) - 1, ...state.rate.keys());
    const first = newest - CHART_SECONDS + 1;
    for (const s of [...state.rate.keys()]) if (s < first) state.rate.delete(s);
    const points = [];
    let max = 1;
    for (let s = first; s <= newest; s++) {
      const v = state.rate.get(s) || { accepted: 0, refused: 0 };
      points.push(v);
      max = Math.max(max, v.accepted, v.refused);
    }
    const scale = niceCeil(max);
    const x = (i) => (i / (CHART_SECONDS - 1)) * W;
    const y = (v) => top + (1 - v / scale) * (H - top - bottom);
    const line = (key) => points.map((v, i) => x(i).toFixed(1) + "," + y(v[key]).toFixed(1)).join(" ");
    const area = (key) => "0," + y(0) + " " + line(key) + " " + W + "," + y(0);
    const last = points[points.length - 1] || { accepted: 0, refused: 0 };
    $("rate-accepted").textContent = last.accepted;
    $("rate-refused").textContent = last.refused;
    chart.replaceChildren(
      svg("line", { x1: 0, x2: W, y1: y(scale), y2: y(scale), class: "grid" }),
      svg("line", { x1: 0, x2: W, y1: y(scale / 2), y2: y(scale / 2), class: "grid" }),
      svg("line", { x1: 0, x2: W, y1: y(0), y2: y(0), class: "axis" }),
      svg("text", { x: 4, y: y(scale) - 3, class: "label" }, scale + "/s"),
      svg("text", { x: 4, y: H - 3, class: "label" }, "-" + CHART_SECONDS / 60 + " min"),
      svg("text", { x: W - 4, y: H - 3, class: "label end" }, "now"),
      svg("polygon", { points: area("accepted"), class: "fill accepted" }),
      svg("polyline", { points: line("accepted"), class: "series accepted" }),
      svg("polygon", { points: area("refused"), class: "fill refused" }),
      svg("polyline", { points: line("refused"), class: "series refused" }),
    );
  }

  function niceCeil(v) {
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  // ---- the zombie scenario ---------------------------------------------------------------

  const stage = {
    A: { x: 90, label: "worker A" },
    B: { x: 510, label: "worker B" },
  };

  function drawStage(s) {
    const node = $("stage");
    const parts = [];
    // fencegate in the middle, holding the fence.
    parts.push(svg("rect", { x: 230, y: 55, width: 140, height: 80, rx: 10, class: "gate" }));
    parts.push(svg("text", { x: 300, y: 85, class: "gate-label" }, "fencegate"));
    parts.push(svg("text", { x: 300, y: 112, class: "gate-fence" }, s.fence ? "fence " + s.fence : "no fence yet"));
    for (const id of ["A", "B"]) {
      const w = s[id] || {};
      const p = stage[id];
      parts.push(svg("circle", { cx: p.x, cy: 95, r: 38, class: "worker " + (w.mood || "idle") }));
      parts.push(svg("text", { x: p.x, y: 91, class: "worker-label" }, id));
      parts.push(svg("text", { x: p.x, y: 110, class: "worker-sub" }, w.token ? "token " + w.token : "no lock"));
      parts.push(svg("text", { x: p.x, y: 160, class: "worker-state" }, w.say || ""));
      if (w.arrow) {
        const from = id === "A" ? p.x + 40 : p.x - 40;
        const to = id === "A" ? 226 : 374;
        parts.push(svg("line", { x1: from, x2: to, y1: 95, y2: 95, class: "arrow " + w.arrow }));
        parts.push(svg("text", { x: (from + to) / 2, y: 86, class: "arrow-label " + w.arrow }, w.arrowText || ""));
      }
    }
    node.replaceChildren(...parts);
  }

  function step(text, status, detail) {
    const li = el("li", { "data-status": String(status || "") }, [
      el("span", { class: "code " + (status >= 400 ? "bad" : status ? "ok" : "wait"), text: status ? String(status) : "…" }),
      el("span", { class: "what", text: text }),
    ]);
    if (detail) li.append(el("span", { class: "detail", text: detail }));
    $("timeline").append(li);
    return li;
  }

  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

  async function playZombie() {
    const button = $("play");
    button.disabled = true;
    $("timeline").replaceChildren();
    // One fixed scope and key for every play, so replaying adds nothing: the same lock (its
    // token steps on), the same key. Named so no one mistakes it for data.
    const scope = "fencegate-console-demo";
    const key = scope + "/report";
    const lockPath = "/v1/locks/" + encodeURIComponent(scope);
    const kvPath = "/v1/kv/" + encodeURIComponent(key);
    const ttl = 2000;
    const s = { A: {}, B: {} };
    drawStage(s);
    try {
      step("scope " + scope + " (the console's own, reused by every play: no user data touched)");
      let r = await call("POST", lockPath, { body: { owner: "console worker A", ttl_ms: ttl } });
      if (r.status !== 201) throw new Error("A could not take the lock: " + r.status + " " + (r.body && r.body.detail));
      const tokenA = r.body.token;
      Object.assign(s.A, { token: tokenA, mood: "holding", say: "holds the lock", arrow: "ok", arrowText: "lock" });
      s.fence = tokenA;
      drawStage(s);
      step("A acquires the lock (lease " + ttl / 1000 + " s)", r.status, "token " + tokenA);

      r = await call("PUT", kvPath, { token: tokenA, scope, body: { by: "A", n: 1 } });
      Object.assign(s.A, { arrow: r.status < 300 ? "ok" : "bad", arrowText: "write " + r.status });
      drawStage(s);
      step("A writes " + key, r.status, "with token " + tokenA);

      Object.assign(s.A, { mood: "frozen", say: "frozen (GC pause)", arrow: null });
      drawStage(s);
      const frozen = step("A freezes past its lease");
      const until = performance.now() + ttl + 400;
      while (performance.now() < until) {
        const left = (until - performance.now()) / 1000;
        s.A.say = "frozen " + left.toFixed(1) + " s";
        drawStage(s);
        await sleep(100);
      }
      frozen.querySelector(".code").textContent = "zz";
      frozen.append(el("span", { class: "detail", text: "the lease lapsed" }));

      r = await call("POST", lockPath, { body: { owner: "console worker B", ttl_ms: 10000 } });
      if (r.status !== 201) throw new Error("B could not take the lock: " + r.status + " " + (r.body && r.body.detail));
      const tokenB = r.body.token;
      Object.assign(s.B, { token: tokenB, mood: "holding", say: "holds the lock", arrow: "ok", arrowText: "lock" });
      Object.assign(s.A, { say: "still frozen" });
      s.fence = tokenB;
      drawStage(s);
      step("B acquires the lock", r.status, "token " + tokenB + ": the fence of the scope is now " + tokenB);

      r = await call("PUT", kvPath, { token: tokenB, scope, body: { by: "B", n: 2 } });
      Object.assign(s.B, { arrow: r.status < 300 ? "ok" : "bad", arrowText: "write " + r.status });
      drawStage(s);
      step("B writes " + key, r.status, "with token " + tokenB);
      await sleep(600);

      Object.assign(s.A, { mood: "zombie", say: "wakes up, writes" });
      drawStage(s);
      r = await call("PUT", kvPath, { token: tokenA, scope, body: { by: "A", n: 3 } });
      const refused = r.status === 412;
      Object.assign(s.A, {
        mood: refused ? "fenced" : "zombie",
        say: refused ? "fenced off" : "overwrote B!",
        arrow: refused ? "bad" : "ok",
        arrowText: "write " + r.status,
      });
      drawStage(s);
      step(
        "A wakes and writes with its old token",
        r.status,
        refused ? "refused: presented " + r.body.presented_token + ", current " + r.body.current_token + "; B's write stands"
          : "accepted: fencing did not hold",
      );

      r = await call("DELETE", lockPath, { token: tokenB });
      Object.assign(s.B, { mood: "idle", say: "done", arrow: null, token: null });
      drawStage(s);
      step("B releases the lock", r.status);
    } catch (err) {
      if (!(err instanceof Unauthorized)) step("stopped: " + err.message, 0);
      else step("stopped: a credential with the lock and write rights on " + scope + " is needed", 401);
    } finally {
      button.disabled = false;
      button.focus();
    }
  }

  $("play").addEventListener("click", () => {
    playZombie();
  });

  // ---- start -----------------------------------------------------------------------------

  let timers = [];

  async function start() {
    for (const t of timers) clearInterval(t);
    timers = [];
    try {
      await loadOverview();
    } catch (err) {
      if (err instanceof Unauthorized) return;
      setStatus("cannot reach the server; retrying", "bad");
    }
    openStream();
    timers.push(setInterval(() => loadOverview().catch(() => {}), OVERVIEW_EVERY_MS));
    timers.push(setInterval(() => { tickLeases(); tickAges(); }, 250));
    timers.push(setInterval(renderChart, 1000));
  }

  drawStage({ A: {}, B: {} });
  renderChart();
  start();
})();
