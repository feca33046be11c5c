// The ratewarden dashboard: reads /v1/events (Server-Sent Events, through fetch so
// that the bearer token goes in a header) and draws what each snapshot says.
// Everything that came from the service is put in the page as text
// (textContent), never as HTML: keys and reasons are whatever clients sent.
"use strict";

(() => {
  const WINDOW = 300; // seconds of history the charts show
  const TOKEN_KEY = "ratewarden-token";
  const COLORS = { allowed: "#2e7d32", denied: "#c62828", shadow: "#ef8f00" };
  const state = { token: null, points: [], rules: null, snap: null, abort: null, retry: 0 };

  const UNSENDABLE = "This token cannot be sent in an HTTP header: a token is printable ASCII.";

  const $ = (id) => document.getElementById(id);

  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  function row(cells) {
    const tr = document.createElement("tr");
    for (const cell of cells) tr.append(cell instanceof Node ? cell : el("td", cell));
    return tr;
  }

  function num(value) {
    return el("td", value, "num");
  }

  // A cell cut to one line by the style sheet, the whole text in its title: for
  // what clients and rule files choose (keys, rule names, envoy paths), any length.
  function clip(text, className) {
    const td = el("td", text, className ? `clip ${className}` : "clip");
    td.title = td.textContent;
    return td;
  }

  function rate(value) {
    return value >= 100 ? Math.round(value).toString() : (Math.round(value * 10) / 10).toString();
  }

  function duration(seconds) {
    seconds = Math.max(0, Math.round(seconds));
    const h = Math.floor(seconds / 3600);
    const m = Math.floor((seconds % 3600) / 60);
    const s = seconds % 60;
    if (h) return `${h}h ${String(m).padStart(2, "0")}m`;
    if (m) return `${m}m ${String(s).padStart(2, "0")}s`;
    return `${s}s`;
  }

  function clock(unix) {
    return unix ? new Date(unix * 1000).toLocaleString() : "";
  }

  // -- the token ---------------------------------------------------------------------

  // A token goes in an Authorization header: printable ASCII, or fetch refuses
  // to send it (and the service's token, compared as bytes, is never anything else).
  function sendable(token) {
    return /^[\x20-\x7e]+$/.test(token);
  }

  // The token from the address (#token=...), taken out of it, else the tab's;
  // `problem` says why an address's fragment was not one.
  function readToken() {
    const match = /^#token=(.*)$/.exec(location.hash);
    if (match) {
      history.replaceState(null, "", location.pathname + location.search); // out of sight
      let token = "";
      try {
        token = decodeURIComponent(match[1]).trim();
      } catch (err) {
        // a broken %-escape: not a token
      }
      if (!token || !sendable(token)) {
        return { token: null, problem: "The address held something after #token= that is not a token." };
      }
      sessionStorage.setItem(TOKEN_KEY, token);
    }
    return { token: sessionStorage.getItem(TOKEN_KEY), problem: "" };
  }

  // Use `read` (from readToken) and connect, or ask for a token.
  function start(read) {
    state.token = read.token;
    if (read.problem) {
      if (state.abort) state.abort.abort();
      clearTimeout(state.retry);
      showLogin(read.problem);
    } else if (state.token !== null && !sendable(state.token)) {
      sessionStorage.removeItem(TOKEN_KEY);
      state.token = null;
      showLogin(UNSENDABLE);
    } else {
      connect();
    }
  }

  function headers(extra) {
    const out = Object.assign({}, extra || {});
    if (state.token) out.Authorization = "Bearer " + state.token;
    return out;
  }

  function showLogin(message) {
    $("main").hidden = true;
    $("login").hidden = false;
    $("forget").hidden = true;
    $("login-error").textContent = message || "";
    setStatus("needs a token", "bad");
  }

  function showMain() {
    $("login").hidden = true;
    $("main").hidden = false;
    $("forget").hidden = !state.token;
  }

  function setStatus(text, kind) {
    const status = $("status");
    status.textContent = text;
    status.className = "status " + kind;
  }

  async function problem(response) {
    try {
      const body = await response.json();
      if (body && typeof body.error === "string") return body.error;
    } catch (err) {
      // not JSON: the status says enough
    }
    return `HTTP ${response.status}`;
  }

  // -- the stream --------------------------------------------------------------------

  function retryLater(message) {
    setStatus(`disconnected: ${message}; retrying`, "bad");
    clearTimeout(state.retry);
    state.retry = setTimeout(connect, 3000);
  }

  async function connect() {
    clearTimeout(state.retry);
    if (state.abort) state.abort.abort();
    const abort = new AbortController();
    state.abort = abort;
    setStatus("connecting…", "wait");
    let response;
    try {
      response = await fetch("/v1/events", {
        headers: headers({ Accept: "text/event-stream" }),
        signal: abort.signal,
        cache: "no-store",
      });
    } catch (err) {
      if (!abort.signal.aborted) retryLater("the service cannot be reached");
      return;
    }
    if (response.status === 401) {
      showLogin(state.token ? "The service refused this token." : "");
      return;
    }
    if (!response.ok) {
      retryLater(await problem(response));
      return;
    }
    showMain();
    state.points = []; // the stream starts with the whole history
    state.rules = null;
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          onEvent(block);
        }
      }
    } catch (err) {
      if (abort.signal.aborted) return;
    }
    if (!abort.signal.aborted) retryLater("the stream ended");
  }

  function onEvent(block) {
    let name = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith("event:")) name = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
    if (name !== "snapshot" || data.length === 0) return;
    const snap = JSON.parse(data.join("\n"));
    for (const point of snap.series) state.points.push(point);
    while (state.points.length && state.points[0].t <= snap.t - WINDOW) state.points.shift();
    if (snap.rules) {
      state.rules = snap.rules;
      renderRules();
    }
    state.snap = snap;
    render();
  }

  // -- drawing -----------------------------------------------------------------------

  function render() {
    const snap = state.snap;
    const when = new Date(snap.t * 1000).toLocaleTimeString();
    if (snap.draining) setStatus(`the service is draining (${when})`, "bad");
    else setStatus(`live, ${when}`, "ok");
    $("process").textContent =
      `process ${snap.pid}: the figures are this process's (with --workers, each worker has its own)`;
    renderTotals();
    renderRates();
    renderTop();
    renderOverrides();
    renderStore();
    renderQuotas();
  }

  function renderTotals() {
    let allowed = 0;
    let denied = 0;
    let shadow = 0;
    for (const p of state.points) {
      allowed += Math.max(p.requests - p.denied, 0);
      denied += p.denied;
      shadow += p.shadow;
    }
    $("total-allowed").textContent = allowed;
    $("total-denied").textContent = denied;
    $("total-shadow").textContent = shadow;
    const series = {
      allowed: state.points.map((p) => [p.t, Math.max(p.requests - p.denied, 0) / p.dt]),
      denied: state.points.map((p) => [p.t, p.denied / p.dt]),
      shadow: state.points.map((p) => [p.t, p.shadow / p.dt]),
    };
    draw($("chart"), series, state.snap.t, shown(), true);
  }

  // Every rule in force has a row, and every rule a sample names (envoy
  // descriptors, "(other rules)"): one with no traffic yet shows zeros and a flat
  // line. A sample names only the rules that counted something in it, so a
  // rule's line is 0 in the others, not drawn across them from its last count.
  function renderRates() {
    const points = state.points;
    const byRule = new Map(); // rule -> [point index, [allowed, denied, shadow]] seen
    for (const rule of state.rules?.rules ?? []) byRule.set(rule.name, []);
    points.forEach((p, i) => {
      const rows = Object.entries(p.rules);
      if (p.other) rows.push(["(other rules)", p.other]);
      for (const [rule, counts] of rows) {
        if (!byRule.has(rule)) byRule.set(rule, []);
        byRule.get(rule).push([i, counts]);
      }
    });
    const lastIndex = points.length - 1;
    const ranked = [...byRule.entries()].map(([rule, seen]) => {
      const denied = seen.reduce((sum, [, c]) => sum + c[1], 0);
      const traffic = seen.reduce((sum, [, c]) => sum + c[0] + c[1] + c[2], 0);
      const latest = seen[seen.length - 1];
      const now = latest && latest[0] === lastIndex ? latest[1] : [0, 0, 0];
      return { rule, seen, denied, traffic, now };
    });
    ranked.sort((a, b) => b.denied - a.denied || b.traffic - a.traffic ||
      a.rule.localeCompare(b.rule));
    const body = $("rates");
    body.replaceChildren();
    const dt = lastIndex >= 0 ? points[lastIndex].dt : 1;
    for (const { rule, seen, denied, now } of ranked) {
      const canvas = el("canvas", null, "spark");
      canvas.setAttribute("aria-label", `${rule}: allowed, denied, shadow per second`);
      const cell = el("td");
      cell.append(canvas);
      const tr = row([clip(rule), num(rate(now[0] / dt)), num(rate(now[1] / dt)),
        num(rate(now[2] / dt)), num(denied), cell]);
      tr.dataset.rule = rule;
      body.append(tr);
      draw(canvas, sparkSeries(points, seen), state.snap.t, shown(), false);
    }
    $("rates-empty").hidden = ranked.length > 0;
  }

  // A rule's three series over every sample, 0 where it counted nothing; a
  // rule with nothing at all is two points of a flat line, whatever the history.
  function sparkSeries(points, seen) {
    if (!points.length) return { allowed: [], denied: [], shadow: [] };
    if (!seen.length) {
      const flat = [[points[0].t, 0], [points[points.length - 1].t, 0]];
      return { allowed: flat, denied: flat, shadow: flat };
    }
    const counts = new Array(points.length).fill(null);
    for (const [i, c] of seen) counts[i] = c;
    const series = (column) => points.map((p, i) => [p.t, counts[i] ? counts[i][column] / p.dt : 0]);
    return { allowed: series(0), denied: series(1), shadow: series(2) };
  }

  // The seconds the charts span: the history there is, from a minute up to WINDOW
  // (a service started a moment ago is not drawn as a dot at the end of 5 minutes).
  function shown() {
    const first = state.points[0];
    if (!first) return 60;
    return Math.min(WINDOW, Math.max(60, Math.ceil(state.snap.t - first.t + first.dt)));
  }

  // A line chart of per-second rates over the `span` seconds ending at `end`;
  // `axes`: the big chart's grid, labels and legend.
  function draw(canvas, series, end, span, axes) {
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || 180;
    const height = canvas.clientHeight || 28;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext("2d");
    ctx.scale(ratio, ratio);
    ctx.clearRect(0, 0, width, height);
    const left = axes ? 48 : 0;
    const bottom = axes ? 18 : 1;
    const top = axes ? 18 : 1;
    let peak = 0;
    for (const points of Object.values(series)) for (const [, v] of points) peak = Math.max(peak, v);
    const scale = niceCeiling(peak);
    const x = (t) => left + ((t - (end - span)) / span) * (width - left);
    const y = (v) => height - bottom - (v / scale) * (height - bottom - top);
    if (axes) {
      ctx.font = "11px system-ui, sans-serif";
      ctx.fillStyle = "#5f6b76";
      ctx.strokeStyle = "#e3e7eb";
      for (let i = 0; i <= 4; i++) {
        const v = (scale * i) / 4;
        ctx.beginPath();
        ctx.moveTo(left, y(v));
        ctx.lineTo(width, y(v));
        ctx.stroke();
        ctx.fillText(rate(v) + "/s", 2, y(v) + 4);
      }
      const step = span <= 90 ? 15 : span <= 180 ? 30 : 60;
      for (let back = Math.floor(span / step) * step; back >= 0; back -= step) {
        const label = back === 0 ? "now" : back % 60 ? `-${back}s` : `-${back / 60}m`;
        ctx.fillText(label, Math.min(x(end - back), width - 24), height - 4);
      }
      let lx = left + 4;
      for (const name of Object.keys(series)) {
        ctx.fillStyle = COLORS[name];
        ctx.fillRect(lx, 4, 10, 10);
        ctx.fillStyle = "#1b1f24";
        ctx.fillText(name, lx + 14, 13);
        lx += 80;
      }
    }
    for (const [name, points] of Object.entries(series)) {
      if (!points.length) continue;
      ctx.strokeStyle = COLORS[name];
      ctx.lineWidth = axes ? 2 : 1.5;
      ctx.beginPath();
      points.forEach(([t, v], i) => (i ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
      // a lone sample is a dash, not nothing
      if (points.length === 1) ctx.lineTo(x(points[0][0]) - 4, y(points[0][1]));
      ctx.stroke();
    }
  }

  function niceCeiling(value) {
    if (value <= 1) return 1;
    const power = Math.pow(10, Math.floor(Math.log10(value)));
    for (const step of [1, 2, 2.5, 5, 10]) if (value <= step * power) return step * power;
    return 10 * power;
  }

  function renderTop() {
    const top = state.snap.top;
    const body = $("top");
    body.replaceChildren();
    for (const entry of top.keys) {
      const key = clip(entry.key === "" ? "(one counter for all)" : entry.key, "key");
      const count = entry.error ? `${entry.denied} (±${entry.error})` : entry.denied;
      const rule = (state.rules?.rules ?? []).find((r) => r.name === entry.rule);
      const name = rule && rule.action === "log_only" ? `${entry.rule} (shadow)` : entry.rule;
      body.append(row([clip(name), key, num(count)]));
    }
    const span = duration(top.window);
    $("top-note").textContent = top.keys.length
      ? `Denials over the last ${span} to ${duration(2 * top.window)}: ${top.denials} counted, ` +
        "in a sketch of bounded size (a count may be over by its ±)."
      : `No request was denied in the last ${span}.`;
  }

  function renderRules() {
    const rules = state.rules;
    $("rules-source").textContent = `${rules.count} rules from ${rules.source || "memory"}` +
      (rules.envoy_domains.length ? `; envoy domains: ${rules.envoy_domains.join(", ")}` : "") +
      `; loaded ${clock(rules.loaded_at)}`;
    const reload = $("rules-reload");
    if (!rules.reload) {
      reload.textContent = "Not reloaded since the service started.";
      reload.className = "muted";
    } else if (rules.reload.ok) {
      reload.textContent = `Last reload ${clock(rules.reload.at)}: ok.`;
      reload.className = "ok";
    } else {
      reload.textContent = `Last reload ${clock(rules.reload.at)} failed, the previous rules ` +
        `stay in force: ${rules.reload.error}`;
      reload.className = "error";
    }
    const body = $("rules");
    body.replaceChildren();
    for (const rule of rules.rules) {
      body.append(row([clip(rule.name), num(rule.line ?? ""), el("td", rule.action, "short"),
        clip(rule.rates.join(", ")), clip(rule.by.join(", "))]));
    }
    $("rules-more").textContent = rules.count > rules.rules.length
      ? `The first ${rules.rules.length} of ${rules.count} rules are listed.` : "";
    const select = $("override-rule");
    const chosen = select.value;
    select.replaceChildren();
    for (const rule of rules.rules) {
      const option = el("option", rule.name);
      option.value = rule.name;
      select.append(option);
    }
    if (chosen && rules.rules.some((r) => r.name === chosen)) select.value = chosen;
  }

  // The overrides' rows are kept from one snapshot to the next and only their
  // text changes: a row rebuilt every second would take its Clear button out of
  // the page under a pointer pressing it, and the click would be lost.
  function renderOverrides() {
    const overrides = state.snap.overrides;
    const note = $("overrides-note");
    const body = $("overrides");
    const form = $("override-form");
    if (overrides === null || overrides.error) {
      body.replaceChildren();
      form.hidden = overrides === null;
      note.textContent = overrides === null
        ? "This service has no runtime overrides."
        : `Overrides cannot be read: ${overrides.error}`;
      note.className = overrides === null ? "muted" : "error";
      return;
    }
    form.hidden = false;
    note.className = "muted";
    note.textContent = !overrides.overrides.length ? "No override is in force."
      : overrides.more ? `The first ${overrides.overrides.length} are shown, and ${overrides.more} ` +
        "more are in force (GET /v1/overrides lists them all)." : "";
    const kept = new Map([...body.children].map((tr) => [tr.dataset.rule, tr]));
    overrides.overrides.forEach((o, n) => {
      const limits = `${o.limits.join(", ")} (in place of ${o.replaces.join(", ")})`;
      const texts = [o.rule, limits, o.reason, o.by, duration(o.expires_in)];
      let tr = kept.get(o.rule);
      kept.delete(o.rule);
      if (tr === undefined) {
        const clear = el("button", "Clear");
        clear.type = "button";
        clear.addEventListener("click", () => clearOverride(o.rule));
        const cell = el("td");
        cell.append(clear);
        tr = row([...texts.slice(0, 4).map((text) => clip(text)), num(texts[4]), cell]);
        tr.dataset.rule = o.rule;
      } else {
        texts.forEach((text, i) => {
          const td = tr.children[i];
          if (td.textContent !== String(text)) {
            td.textContent = String(text);
            if (td.classList.contains("clip")) td.title = td.textContent;
          }
        });
      }
      if (body.children[n] !== tr) body.insertBefore(tr, body.children[n] || null);
    });
    for (const gone of kept.values()) gone.remove();
    const audit = $("audit");
    audit.replaceChildren();
    for (const a of overrides.audit.slice(0, 20)) {
      const what = a.action === "set"
        ? `set ${a.rule} to ${a.limits.join(", ")} until ${clock(a.expires_at)}`
        : `cleared ${a.rule}`;
      audit.append(el("li", `${clock(a.at)}: ${a.by} ${what}${a.reason ? ` (${a.reason})` : ""}`));
    }
  }

  function say(message, ok) {
    const out = $("override-message");
    out.textContent = message;
    out.className = ok ? "ok" : "error";
  }

  async function setOverride(event) {
    event.preventDefault();
    const rule = $("override-rule").value;
    const limits = $("override-limits").value.split(",").map((s) => s.trim()).filter(Boolean);
    const span = $("override-for").value.trim();
    const body = {
      limits,
      for: /^\d+(\.\d+)?$/.test(span) ? Number(span) : span,
      reason: $("override-reason").value,
      by: "dashboard",
    };
    await send("PUT", rule, body, `Override set on ${rule}.`);
  }

  async function clearOverride(rule) {
    await send("DELETE", rule, null, `Override on ${rule} cleared.`);
  }

  async function send(method, rule, body, done) {
    let response;
    try {
      response = await fetch("/v1/overrides/" + encodeURIComponent(rule), {
        method,
        headers: headers(body ? { "Content-Type": "application/json" } : {}),
        body: body ? JSON.stringify(body) : undefined,
        cache: "no-store",
      });
    } catch (err) {
      say("The service cannot be reached.", false);
      return;
    }
    if (response.ok) say(done, true);
    else say(`Refused: ${await problem(response)}`, false);
  }

  function renderStore() {
    const store = state.snap.store;
    const out = $("store");
    out.textContent = store.ok ? `${store.type}: answering` : `${store.type}: ${store.problem}`;
    out.className = store.ok ? "ok" : "error";
    // the banner: a store that does not answer is the first thing an operator sees
    const banner = $("store-banner");
    banner.hidden = store.ok;
    banner.textContent = store.ok ? "" :
      `The store does not answer (${store.problem}): checks follow each rule's on_failure.`;
    const errors = state.points.reduce((sum, p) => sum + p.store_errors, 0);
    $("store-errors").textContent =
      `${errors} checks in the last 5 minutes were answered by a failure policy (store errors).`;
  }

  function share(value) {
    return value === null || value === undefined ? "-" :
      `${Math.round(Math.min(1, Math.max(0, value)) * 100)}%`;
  }

  function renderQuotas() {
    const quotas = state.snap.quotas;
    const out = $("quotas");
    out.replaceChildren();
    if (quotas === null) {
      out.append(el("p", "None: fleet quotas live in Redis, and this service's store is memory.",
        "muted"));
      return;
    }
    if (quotas.error) {
      out.append(el("p", `Cannot read the fleet quotas: ${quotas.error}`, "error"));
      return;
    }
    if (!quotas.quotas.length) out.append(el("p", "No fleet quota in this store.", "muted"));
    for (const q of quotas.quotas) {
      const box = el("div", null, "quota");
      box.append(el("h3", `${q.name}: ${q.rate}, ${q.algorithm}`));
      // shares come held to [0, 1] (null: nothing to divide by); reports taken at
      // different moments can add up past a grant or the total, see docs/fleet.md
      box.append(el("p", `used ${rate(q.used)} of an effective total of ` +
        `${rate(q.effective_total)} (${share(q.used_of_total)}); demand served ` +
        `${share(q.demand_served)} (wants ${rate(q.wants)}); granted ${rate(q.granted)}; ` +
        `${q.members} members`));
      const table = el("table");
      table.append(row([el("th", "member"), el("th", "wants", "num"), el("th", "granted", "num"),
        el("th", "used", "num"), el("th", "of grant", "num"), el("th", "demand served", "num"),
        el("th", "lease left", "num")]));
      for (const m of q.members_shown) {
        table.append(row([clip(m.id), num(rate(m.wants)), num(rate(m.has)), num(rate(m.used)),
          num(share(m.used_of_grant)), num(share(m.demand_served)),
          num(duration(m.expires_in))]));
      }
      box.append(table);
      if (q.members > q.members_shown.length) {
        box.append(el("p", `and ${q.members - q.members_shown.length} more members`, "muted"));
      }
      out.append(box);
    }
    if (quotas.truncated) out.append(el("p", "More fleet quotas exist than are shown.", "muted"));
  }

  // -- start ---------------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const token = $("token").value.trim();
      $("token").value = "";
      if (!sendable(token)) {
        showLogin(UNSENDABLE);
        return;
      }
      sessionStorage.setItem(TOKEN_KEY, token);
      start({ token, problem: "" });
    });
    $("forget").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      state.token = null;
      if (state.abort) state.abort.abort();
      showLogin("");
    });
    $("override-form").addEventListener("submit", setOverride);
    window.addEventListener("resize", () => state.snap && render());
    window.addEventListener("hashchange", () => {
      // a token pasted into the address (#token=...) on a page already open
      if (location.hash.startsWith("#token=")) start(readToken());
    });
    start(readToken());
  });
})();
