// sluice console: plain JavaScript, no build step, no external assets.
// Every value from the server is written with textContent, never as HTML:
// identities come from callers.
"use strict";
(function () {
  const $ = (s) => document.querySelector(s);
  const el = (tag, text, cls) => { const e = document.createElement(tag); if (text !== undefined) e.textContent = text; if (cls) e.className = cls; return e; };
  const row = (cells) => { const tr = el("tr"); for (const c of cells) { const td = el("td"); if (c instanceof Node) td.append(c); else td.textContent = c; tr.append(td); } return tr; };
  // fill puts rows in tbody, each cell labelled with its column's heading
  // (data-label), which the phone layout shows beside it.
  const fill = (tbody, rows) => {
    const heads = [...tbody.closest("table").querySelectorAll("thead th")].map((th) => th.textContent);
    for (const tr of rows) [...tr.cells].forEach((td, i) => { if (heads[i]) td.dataset.label = heads[i]; });
    tbody.replaceChildren(...rows);
  };
  // The overrides API, relative to the page (/ui/): behind a proxy that
  // serves sluice under a prefix, an absolute /v1/overrides would send the
  // admin token to whatever the proxy serves at the origin's root.
  const overridesPath = "../v1/overrides";
  let token = sessionStorage.getItem("sluice-token") || "";
  let overview = null;
  let refreshMs = 5000;

  async function api(path, opts) {
    opts = opts || {};
    opts.headers = Object.assign({}, opts.headers || {});
    if (token) opts.headers["Authorization"] = "Bearer " + token;
    const r = await fetch(path, opts);
    let body = null;
    try { body = await r.json(); } catch (e) { body = null; }
    if (!r.ok) throw new Error((body && body.error) || (r.status + " " + r.statusText));
    return body;
  }

  // shown writes an identity as it is, or quoted (as JSON) when white
  // space at its ends or an invisible character would hide which it is:
  // "tenant:acme " and "tenant:acme" are two callers.
  const shown = (id) => id !== id.trim() || /[\u0000-\u001f\u007f-\u009f\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff]/.test(id) ? JSON.stringify(id) : id;

  function fmtRate(v) { return v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v >= 0.01 || v === 0 ? v.toFixed(2) : v.toPrecision(2); }
  function fmtWhen(ms) {
    const d = ms - Date.now();
    if (!ms || d <= 0) return "now";
    if (d < 1000) return "in <1s";
    if (d < 120000) return "in " + Math.ceil(d / 1000) + "s";
    return "in " + Math.ceil(d / 60000) + "m";
  }
  // fmtDur writes a duration in its two largest units: 350ms, 1.5s,
  // 1m30s, 2h5m, 1d (as the server's console.HumanDuration).
  function fmtDur(ms) {
    if (ms <= 0) return "0s";
    if (ms < 1000) return Math.ceil(ms) + "ms";
    if (ms < 10000) { const t = Math.ceil(ms / 100) / 10; return t + "s"; }
    let s = Math.ceil(ms / 1000), out = "", n = 0;
    for (const [u, d] of [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]]) {
      const q = Math.floor(s / d);
      if (q > 0 || n > 0) { if (n === 2) break; if (q > 0) out += q + u; s -= q * d; n++; }
    }
    return out;
  }

  // chart draws series of [x, y] lines into an SVG of w×h, y from 0, with
  // ticks ([x, label]) under the x axis.
  function chart(lines, w, h, xmin, xmax, ticks) {
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", "0 0 " + w + " " + h);
    svg.setAttribute("role", "img");
    let ymax = 0;
    for (const l of lines) for (const p of l.points) ymax = Math.max(ymax, p[1]);
    ymax = ymax > 0 ? ymax * 1.1 : 1;
    const pad = 28, X = (x) => pad + (xmax > xmin ? (x - xmin) / (xmax - xmin) : 1) * (w - pad - 4), Y = (y) => h - 14 - (y / ymax) * (h - 22);
    const axis = document.createElementNS(ns, "path");
    axis.setAttribute("d", "M" + pad + " 4V" + (h - 14) + "H" + (w - 4));
    axis.setAttribute("class", "axis");
    svg.append(axis);
    const top = document.createElementNS(ns, "text");
    top.setAttribute("x", 2); top.setAttribute("y", 12); top.textContent = fmtRate(ymax / 1.1);
    svg.append(top);
    for (const [x, label] of ticks || []) {
      const tx = document.createElementNS(ns, "text");
      tx.setAttribute("x", Math.min(w - 30, Math.max(pad, X(x) - 14)).toFixed(1)); tx.setAttribute("y", h - 2);
      tx.setAttribute("class", "tick"); tx.textContent = label;
      const tl = document.createElementNS(ns, "path");
      tl.setAttribute("d", "M" + X(x).toFixed(1) + " " + (h - 14) + "v3"); tl.setAttribute("class", "axis");
      svg.append(tl, tx);
    }
    for (const l of lines) {
      const pl = document.createElementNS(ns, "polyline");
      pl.setAttribute("class", l.cls);
      pl.setAttribute("points", l.points.map((p) => X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1)).join(" "));
      svg.append(pl);
    }
    return svg;
  }

  // The fleet charts' range, and the step of their time axis' ticks.
  let range = "15m";
  const tickStep = { "15m": 5 * 60e3, "1h": 15 * 60e3, "6h": 3600e3, "24h": 6 * 3600e3 };
  const hhmm = (ms) => { const d = new Date(ms); return String(d.getHours()).padStart(2, "0") + ":" + String(d.getMinutes()).padStart(2, "0"); };

  // loadFleet draws the fleet's decisions and denials per second over the
  // range: each point a bucket's counts over its length, the current
  // bucket's over the time it has run.
  async function loadFleet() {
    const f = await api("api/fleet?range=" + range);
    if (f.range !== range) return; // the range changed meanwhile
    refreshMs = Math.max(1000, Math.min(5000, f.interval_ms));
    $("#interval").textContent = "(" + (f.shared ? "every replica" : "this instance") + ", a point every " + fmtDur(f.bucket_ms) + ")";
    const box = $("#charts");
    box.dataset.range = f.range;
    if (!f.series.length) { box.replaceChildren(el("p", "No decisions in this range.", "empty")); return; }
    const ticks = [];
    const step = tickStep[f.range] || 3600e3;
    // Ticks at whole steps of local time (the offset of the zone in force).
    const off = new Date(f.now).getTimezoneOffset() * 60e3;
    for (let t = Math.ceil((f.from - off) / step) * step + off; t <= f.now; t += step) ticks.push([t, hhmm(t)]);
    const secs = (p) => Math.max(1, (Math.min(f.now, p.t + f.bucket_ms) - p.t) / 1000);
    const figs = [];
    for (const ser of f.series) {
      const fig = el("figure");
      fig.dataset.series = ser.policy + "/" + ser.tier;
      const pts = ser.points.filter((p) => p.t < f.now);
      // The current rate: the last two buckets, the last partial.
      const tail = pts.slice(-2);
      const span = tail.reduce((a, p) => a + secs(p), 0) || 1;
      const curD = tail.reduce((a, p) => a + p.c, 0) / span, curX = tail.reduce((a, p) => a + p.x, 0) / span;
      // The range's totals, for whoever reads the page's data.
      fig.dataset.decisions = String(pts.reduce((a, p) => a + p.c, 0));
      fig.dataset.denials = String(pts.reduce((a, p) => a + p.x, 0));
      const cap = el("figcaption");
      cap.append(el("strong", ser.policy + (ser.tier !== "-" ? " · " + ser.tier : "")));
      // The gateway's spend counts micro-dollars: drawn as dollars a minute.
      const spend = ser.policy === "gateway:spend";
      const cur = el("span", spend ? "$" + (curD * 60 / 1e6).toFixed(4) + " /min" : fmtRate(curD) + " /s, " + fmtRate(curX) + " denied /s", "current");
      cur.dataset.decisions = String(curD);
      cap.append(cur);
      fig.append(cap);
      const mid = (p) => Math.min(f.now, p.t + f.bucket_ms / 2);
      fig.append(chart(spend ? [{ cls: "d", points: pts.map((p) => [mid(p), p.c * 60 / 1e6 / secs(p)]) }] : [
        { cls: "d", points: pts.map((p) => [mid(p), p.c / secs(p)]) },
        { cls: "x", points: pts.map((p) => [mid(p), p.x / secs(p)]) },
      ], 400, 130, f.from, f.now, ticks));
      figs.push(fig);
    }
    box.replaceChildren(...figs);
  }
  for (const b of document.querySelectorAll("#ranges button")) {
    b.addEventListener("click", () => {
      range = b.dataset.range;
      for (const o of document.querySelectorAll("#ranges button")) o.setAttribute("aria-pressed", String(o === b));
      loadFleet().catch(() => {});
    });
  }

  async function loadTop() {
    const t = await api("api/top");
    $("#top-scope").textContent = "(" + (t.shared ? "every replica" : "this instance") + ")";
    // Counts are exact up to t.exact denials of an identity a second on a
    // replica; past that one in t.sample counts, scaled up: "≈".
    const estimated = t.top.some((h) => h.sampled);
    $("#top-note").textContent = estimated ? "≈ estimated: past " + t.exact + (t.exact === 1 ? " denial" : " denials") + " of an identity a second, one in " + t.sample + " is counted (and scaled up); smaller counts are exact." : "";
    fill($("#top tbody"), t.top.map((h) => {
      const id = el("td", shown(h.identity), "clickable");
      id.title = "look up";
      // Looked up as it is: the field would trim it.
      id.addEventListener("click", () => { $("#lookup-id").value = h.identity; lookup(h.identity); });
      const n = el("span", (h.sampled ? "≈" : "") + String(Math.round(h.denies)), h.sampled ? "estimated" : "exact");
      if (h.sampled) n.title = "estimated from a sample";
      const tr = row([h.policy, n, fmtWhen(h.retry_at)]);
      tr.prepend(id);
      tr.dataset.identity = h.identity; tr.dataset.policy = h.policy;
      return tr;
    }));
    if (!t.top.length) fill($("#top tbody"), [row(["nobody is being limited", "", "", ""])]);
  }

  async function loadOverview() {
    overview = await api("api/overview");
    const st = $("#store");
    st.textContent = overview.store.kind + " · " + overview.store.failure_policy + (overview.store.ready ? " · ok" : " · " + overview.store.error);
    st.className = "badge " + (overview.store.ready ? "ok" : "bad");
    document.body.classList.toggle("admin", overview.admin);
    $("#mode").textContent = overview.admin ? "admin" : (overview.admin_enabled ? "read-only (enter the admin token to change)" : "read-only");
    $("#mode").className = "badge" + (overview.admin ? " admin" : "");
    fill($("#policies tbody"), overview.policies.map((p) => row([p.name, p.algorithm, p.human, [p.shadow ? "shadow" : "", p.lease ? "lease" : ""].filter(Boolean).join(" ")])));
    fill($("#tiers tbody"), overview.tiers.map((t) => row([t.name, t.policies.join(", ")])));
    fill($("#keys tbody"), overview.keys.map((k) => row([k.name, k.tier])));
    const sel = $("#ov-policy");
    if (sel.options.length === 1) for (const p of overview.policies) sel.append(new Option(p.name, p.name));
    const gw = overview.gateway;
    $("#gateway").hidden = !gw;
    $("#spend-section").hidden = !gw;
    $("#upstreams-section").hidden = !(gw && gw.pool);
    if (gw) {
      fill($("#gw-tiers tbody"), gw.tiers.map((t) => row([t.name, String(t.rpm || "–"), String(t.tpm || "–"), String(t.rpd || "–"), String(t.concurrency || "–"), (t.models || []).join(", ")])));
      $("#gw-models").textContent = "models: " + (gw.models || []).join(", ") + "; keys: " + gw.keys.map((k) => k.name + " (" + k.tier + ")").join(", ");
    }
    const algos = $("#sim-algos");
    if (!algos.childElementCount) for (const a of overview.algorithms) {
      const lab = el("label"); const cb = el("input"); cb.type = "checkbox"; cb.value = a; cb.checked = a === "gcra" || a === "sliding_window";
      lab.append(cb, " " + a + " "); algos.append(lab);
    }
  }

  // confirmStep asks before a destructive action: it opens a box after
  // anchor saying what will happen, and runs action only when its
  // confirming button is pressed (one box open at a time).
  function confirmStep(anchor, question, yesLabel, action) {
    for (const old of document.querySelectorAll(".confirm")) old.remove();
    const box = el("div", undefined, "confirm");
    box.setAttribute("role", "alertdialog");
    const yes = el("button", yesLabel, "confirm-yes danger"); yes.type = "button";
    const no = el("button", "Cancel", "confirm-no"); no.type = "button";
    yes.addEventListener("click", async () => { box.remove(); await action(); });
    no.addEventListener("click", () => box.remove());
    box.append(el("p", question), yes, " ", no);
    anchor.after(box);
    no.focus();
  }

  // lookup shows identity id, by default the one typed in the field.
  async function lookup(id) {
    if (id === undefined) id = $("#lookup-id").value.trim();
    if (!id) return;
    const msg = $("#lookup-msg");
    try {
      const r = await api("api/identity?id=" + encodeURIComponent(id));
      $("#lookup").hidden = false;
      $("#lookup").dataset.identity = r.identity;
      // A gateway key's limits are its gateway tier's: no override or
      // reset of the service's policies applies to it.
      $("#lookup").classList.toggle("gateway", !!r.gateway);
      fill($("#peek tbody"), r.policies.map((p) => {
        const tr = row([p.policy, p.human + (p.overridden ? " (override)" : ""), String(p.remaining), el("span", p.allowed ? "passes" : "limited", p.allowed ? "allow" : "deny"), p.retry_after || "–", p.why.join(", ")]);
        tr.dataset.policy = p.policy;
        return tr;
      }));
      if (!r.policies.length) fill($("#peek tbody"), [row(["no limit applies to it yet", "", "", "", "", ""])]);
      $("#peek-others").textContent = r.others ? r.others + " other " + (r.others === 1 ? "policy does" : "policies do") + " not apply to it (not its tier's, no override, no state)" : "";
      const ul = $("#lookup-overrides");
      ul.replaceChildren(...r.overrides.map((o) => {
        const li = el("li", shown(o.identity) + " · " + (o.policy || "every policy") + " · " + (o.limit || (o.scale + "x")) + (o.until ? " until " + new Date(o.until).toLocaleString() : "") + (o.active ? "" : " (expired)") + (o.by ? " · by " + o.by : "") + (o.reason ? " · " + o.reason : ""));
        if (document.body.classList.contains("admin")) {
          const b = el("button", "remove"); b.type = "button";
          b.addEventListener("click", () => removeOverride(b, o, msg));
          li.append(" ", b);
        }
        return li;
      }));
      if (!r.overrides.length) ul.replaceChildren(el("li", "none"));
      msg.textContent = r.note || "";
    } catch (e) { msg.textContent = e.message; $("#lookup").hidden = false; }
  }

  $("#lookup-form").addEventListener("submit", (ev) => { ev.preventDefault(); lookup(); });
  $("#token-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    token = $("#token").value.trim();
    sessionStorage.setItem("sluice-token", token);
    $("#token").value = "";
    // The console's data takes an admin session: the token exchanged for
    // an HttpOnly cookie, which every later read of the page carries.
    await api("api/session", { method: "POST" }).catch((e) => { $("#store").textContent = e.message; });
    await loadOverview().catch(() => {});
    await loadOverrides().catch((e) => { $("#overrides-msg").textContent = e.message; });
    await loadSpend().catch((e) => { $("#spend-msg").textContent = e.message; });
    await loadUpstreams().catch((e) => { $("#upstreams-msg").textContent = e.message; });
    await loadRegions().catch((e) => { $("#regions-msg").textContent = e.message; });
  });
  $("#override-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const msg = $("#lookup-msg");
    const identity = $("#lookup").dataset.identity;
    // An override's identity is a pattern, '*' any run of characters, with
    // no way to spell a literal '*': for an identity that holds one (which
    // a caller may choose, and the top list shows) an override would
    // apply to other identities too, for "*" to all of them.
    if (identity.includes("*")) {
      msg.textContent = "not set: " + shown(identity) + " holds '*', which an override reads as a pattern matching other identities too; set pattern overrides with PUT /v1/overrides";
      return;
    }
    const body = { identity: identity, policy: $("#ov-policy").value };
    const v = $("#ov-limit").value.trim();
    const m = /^([0-9.]+)\s*x$/i.exec(v);
    if (m) body.scale = parseFloat(m[1]); else body.limit = v;
    const ttl = $("#ov-ttl").value.trim();
    if (ttl) body.ttl = ttl;
    const reason = $("#ov-reason").value.trim();
    if (reason) body.reason = reason;
    try {
      await api(overridesPath, { method: "PUT", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
      msg.textContent = "override set";
      await lookup(identity);
      await loadOverrides().catch(() => {});
      msg.textContent = "override set";
    } catch (e) { msg.textContent = e.message; }
  });
  $("#reset").addEventListener("click", () => {
    const msg = $("#lookup-msg");
    const identity = $("#lookup").dataset.identity;
    confirmStep($("#reset"), "Reset the state of " + shown(identity) + " under every policy? Its counts are forgotten: it gets full limits at once, on every replica.", "Reset", async () => {
      try {
        const id = encodeURIComponent(identity);
        const r = await api("api/reset?id=" + id + "&confirm=" + id, { method: "POST" });
        await lookup(identity);
        msg.textContent = "reset " + r.reset + " policies";
      } catch (e) { msg.textContent = e.message; }
    });
  });
  $("#sim-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const algos = [...document.querySelectorAll("#sim-algos input:checked")].map((c) => c.value);
    const msg = $("#sim-msg");
    try {
      const r = await api("api/simulate", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({
        limit: $("#sim-limit").value, pattern: $("#sim-pattern").value, rps: parseFloat($("#sim-rps").value), duration: $("#sim-duration").value, algorithms: algos }) });
      const lines = [{ cls: "axis", points: r.offered.map((v, i) => [i, v]) }];
      const colors = ["d", "x"];
      const box = $("#sim-chart");
      box.replaceChildren();
      r.algorithms.forEach((a, i) => lines.push({ cls: colors[i % 2], points: r.allowed[a].map((v, j) => [j, v]) }));
      box.append(chart(lines, 800, 200, 0, Math.max(1, r.offered.length - 1)));
      msg.textContent = "per " + fmtDur(r.bucket_ms) + ": offered (grey) " + r.offered.reduce((a, b) => a + b, 0) + "; " + r.algorithms.map((a) => a + " admitted " + r.totals[a]).join(", ");
    } catch (e) { msg.textContent = e.message; }
  });

  // removeOverride deletes o after a confirmation, then refreshes what
  // shows it.
  function removeOverride(anchor, o, msg) {
    confirmStep(anchor, "Remove the override of " + (o.shown || shown(o.identity)) + " for " + (o.policy || "every policy") + "? Its callers get the configured limit again at once.", "Remove", async () => {
      try {
        await api(overridesPath + "?identity=" + encodeURIComponent(o.identity) + "&policy=" + encodeURIComponent(o.policy || ""), { method: "DELETE" });
        if (!$("#lookup").hidden && $("#lookup").dataset.identity) await lookup($("#lookup").dataset.identity);
        await loadOverrides();
        msg.textContent = "override removed";
      } catch (e) { msg.textContent = e.message; }
    });
  }

  // loadOverrides refreshes the list of active overrides (admin only):
  // who set each, why, until when.
  async function loadOverrides() {
    if (!document.body.classList.contains("admin")) return;
    const r = await api("api/overrides");
    $("#overrides-scope").textContent = "(" + r.active + (r.shared ? ", every replica's" : ", this instance's") + (r.expired ? "; " + r.expired + " expired, kept until purged" : "") + ")";
    // A box asking to confirm a removal stays open while it is asked.
    if (document.querySelector("#overrides .confirm")) return;
    fill($("#overrides tbody"), r.overrides.map((o) => {
      const b = el("button", "remove"); b.type = "button";
      b.addEventListener("click", () => removeOverride(b, o, $("#overrides-msg")));
      const tr = row([shown(o.shown), o.policy || "every policy", o.human, o.by || "–", o.reason || "–",
        o.until ? new Date(o.until).toLocaleString() + " (in " + o.expires_in + ")" : "until removed", b]);
      tr.dataset.identity = o.identity;
      tr.dataset.policy = o.policy || "";
      return tr;
    }));
    if (!r.overrides.length) fill($("#overrides tbody"), [row(["no override is in force", "", "", "", "", "", ""])]);
  }

  // loadSpend shows the gateway's spend per key, team and org against
  // their budgets (admin only, when a gateway runs in this process).
  async function loadSpend() {
    if (!overview || !overview.gateway || !document.body.classList.contains("admin")) return;
    const r = await api("api/spend");
    $("#spend-scope").textContent = "(" + r.rows.length + " budgets" + (r.peeked < r.clients ? "; " + (r.clients - r.peeked) + " clients not read" : "") + ")";
    fill($("#spend tbody"), r.rows.map((b) => {
      const m = el("meter"); m.min = 0; m.max = 1; m.low = 0.75; m.high = 0.9; m.optimum = 0; m.value = b.spent;
      const used = el("span"); used.append(m, " " + Math.round(b.spent * 100) + "%");
      const tr = row([b.level, b.name, "$" + b.limit_usd + " per " + b.window + (b.zone && b.zone !== "UTC" ? " (" + b.zone + ")" : "") + (b.model ? " on " + b.model : ""),
        "$" + b.spent_usd, used, fmtDur(b.reset_seconds * 1000)]);
      tr.dataset.level = b.level; tr.dataset.name = b.name;
      if (b.spent >= 1) tr.className = "over";
      return tr;
    }));
    if (!r.rows.length) fill($("#spend tbody"), [row(["no budget is configured", "", "", "", "", ""])]);
  }

  // limitKinds are the provider limits an upstream model may declare.
  const limitKinds = ["rpm", "tpm", "itpm", "otpm"];
  const limitsText = (l) => limitKinds.filter((k) => l && l[k]).map((k) => k + " " + l[k]).join(" · ") || "none";

  // loadUpstreams shows the gateway pool's headroom per upstream and
  // model (admin only, when a gateway with upstreams: runs here): the
  // limits declared and in force, a meter of what the store has left of
  // each, what the provider last reported, and whether it is cooling.
  async function loadUpstreams() {
    if (!overview || !overview.gateway || !overview.gateway.pool || !document.body.classList.contains("admin")) return;
    const r = await api("api/upstreams");
    const down = r.upstreams.filter((u) => !u.up).length;
    $("#upstreams-scope").textContent = "(" + r.upstreams.length + " upstream models" + (down ? "; " + down + " not up" : "") + ")";
    fill($("#upstreams tbody"), r.upstreams.map((u) => {
      const left = el("span", undefined, "meters");
      for (const k of limitKinds) {
        const lim = u.limits[k];
        if (!lim) continue;
        const rem = Math.max(0, u.remaining[k] ?? 0);
        const m = el("meter"); m.min = 0; m.max = 1; m.low = 0.1; m.high = 0.25; m.optimum = 1; m.value = rem / lim;
        m.dataset.kind = k;
        const one = el("span"); one.append(m, " " + k + " " + rem + " of " + lim);
        left.append(one);
      }
      if (!left.childElementCount) left.textContent = "no limit";
      const learned = limitKinds.some((k) => (u.limits[k] || 0) !== (u.declared[k] || 0));
      const prov = [u.provider_remaining_requests >= 0 ? "requests " + u.provider_remaining_requests : "", u.provider_remaining_tokens >= 0 ? "tokens " + u.provider_remaining_tokens : ""].filter(Boolean).join(" · ") || "not reported";
      const until = u.cooldown_until || u.down_until;
      const state = u.cooldown_until ? "cooling" : u.down_until ? "down" : "up";
      const tr = row([u.upstream + (u.region ? " (" + u.region + ")" : ""), u.model, limitsText(u.declared), limitsText(u.limits) + (learned ? " (learned)" : ""),
        left, prov, until ? new Date(until).toLocaleTimeString() + " (" + fmtWhen(Date.parse(until)) + ")" : "–", el("span", state, state === "up" ? "allow" : "deny")]);
      tr.dataset.upstream = u.upstream; tr.dataset.model = u.model; tr.dataset.state = state;
      return tr;
    }));
    if (!r.upstreams.length) fill($("#upstreams tbody"), [row(["no upstream is configured", "", "", "", "", "", "", ""])]);
  }

  // loadRegions shows the regions (admin only, when store.region is set):
  // this region, whether each other region's store answers and how fast,
  // the global policies and their homes, what decided this instance's
  // global keys, its fetches and units, and the failure policies in force.
  async function loadRegions() {
    $("#regions-section").hidden = !(overview && overview.region);
    if (!overview || !overview.region || !document.body.classList.contains("admin")) return;
    const r = await api("api/regions");
    const down = r.regions.filter((x) => !x.reachable).length;
    $("#regions-scope").textContent = "(this region: " + r.region + (down ? "; " + down + " unreachable" : "") + ")";
    fill($("#regions tbody"), r.regions.map((x) => {
      const tr = row([x.name, el("span", x.reachable ? "yes" : "no", x.reachable ? "allow" : "deny"), x.reachable ? x.rtt_ms.toFixed(1) + " ms" : "–"]);
      tr.dataset.region = x.name; tr.dataset.reachable = String(x.reachable);
      return tr;
    }));
    fill($("#region-globals tbody"), r.policies.length ? r.policies.map((p) => row([p.name, p.home || "by hash"])) : [row(["no global policy", ""])]);
    const d = r.decisions, f = r.fetches, u = r.units;
    $("#region-counters").textContent = "decided: home " + d.home + " · share " + d.share + " · denied " + d.denied + " · failure policy " + d.policy +
      "; fetches " + f.sent + " (denied " + f.denied + ", failed " + f.error + "); units fetched " + u.fetched + " · refunded " + u.refunded + " · stranded " + u.stranded +
      "; " + r.keys + " global keys tracked" + (r.held ? ", " + r.held.units + " units held in " + r.held.shares + " shares" + (r.held.debts ? " (" + r.held.debts + " in debt)" : "") : ", shares unreadable") +
      "; cut off from a home: " + r.failure_policy + "; this region's store down: " + r.store_failure_policy;
  }

  async function tick() {
    await Promise.all([loadFleet(), loadTop(), loadOverrides(), loadSpend(), loadUpstreams(), loadRegions()].map((p) => p.catch(() => {})));
    setTimeout(tick, refreshMs);
  }
  loadOverview().then(() => Promise.all([loadOverrides(), loadSpend(), loadUpstreams(), loadRegions()].map((p) => p.catch(() => {}))), (e) => { $("#store").textContent = e.message; });
  setInterval(() => loadOverview().catch(() => {}), 15000);
  tick();
})();
