// trainguard dashboard: plain JavaScript, no build step, no external code (closed networks).
// Polls the /v1 API with the token kept in sessionStorage and redraws each section.
"use strict";

const POLL_MS = 2000;
const TOKEN_KEY = "trainguard.token";
const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || "",
  role: null,
  name: null,
  incidentJson: new Map(),   // id -> JSON last drawn (redraw only what changed)
  approvalJson: new Map(),
  openJobs: new Set(),
  auditQuery: {},
  busy: false,
};

const $ = (sel) => document.querySelector(sel);

function esc(value) {
  return String(value === null || value === undefined ? "" : value)
    .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
}

function shortTime(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  if (isNaN(d)) return esc(iso);
  return d.toISOString().replace("T", " ").slice(0, 19) + "Z";
}

function banner(text, kind) {
  const el = $("#banner");
  if (!text) { el.className = "banner hidden"; el.textContent = ""; return; }
  el.className = "banner" + (kind === "error" ? " error" : "");
  el.textContent = text;
}

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path, options = {}) {
  const headers = Object.assign({ "Accept": "application/json" }, options.headers || {});
  if (state.token) headers["Authorization"] = "Bearer " + state.token;
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, {
    method: options.method || "GET",
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
    cache: "no-store",
  });
  let data = null;
  try { data = await resp.json(); } catch (e) { data = null; }
  if (!resp.ok) {
    let detail = data && data.detail !== undefined ? data.detail : resp.statusText;
    if (Array.isArray(detail)) detail = detail.map((d) => (d.loc || []).join(".") + ": " + d.msg).join("; ");
    throw new ApiError(resp.status, String(detail));
  }
  return data;
}

// --- token --------------------------------------------------------------------------

function signedIn(yes) {
  // Signed out, the sections stay hidden: their counts would read 0, which is not known.
  document.body.classList.toggle("signed-out", !yes);
  if (!yes) $("#server-status").textContent = "not signed in";
}

async function checkToken() {
  if (!state.token) {
    state.role = null;
    signedIn(false);
    $("#whoami").textContent = "no token";
    banner("");
    return false;
  }
  try {
    const who = await api("/v1/whoami");
    state.role = who.role;
    state.name = who.name;
    $("#whoami").textContent = who.name + " (" + who.role + ")";
    signedIn(true);
    banner("");
    return true;
  } catch (e) {
    state.role = null;
    signedIn(false);
    $("#whoami").textContent = "token refused";
    banner("The server refused this token: " + e.message, "error");
    return false;
  }
}

// --- server status ------------------------------------------------------------------

async function drawStatus() {
  const [s, breaker] = await Promise.all([api("/v1/status"), api("/v1/breaker").catch(() => null)]);
  const n = s.nodes || {};
  let text = "mode <b>" + esc(s.mode) + "</b> · nodes up <b>" + (n.up || 0) + "</b>, stale <b>" +
    (n.stale || 0) + "</b>, lost <b>" + (n.lost || 0) + "</b>";
  if (s.leader !== null && s.leader !== undefined) text += " · " + (s.leader ? "leader" : "standby");
  if (!s.control_plane) text += " · no controller";
  if (breaker && breaker.state === "open") {
    text += " · <b>breaker OPEN</b>";
    banner("Circuit breaker open since " + shortTime(breaker.changed_at) + ": " + (breaker.reason || "") +
      " — quarantines are suppressed until an operator resets it.", "error");
  }
  $("#server-status").innerHTML = text;
}

// --- approvals ----------------------------------------------------------------------

function approvalHtml(a) {
  const disabled = state.role === "operator" ? "" : " disabled title=\"needs an operator token\"";
  return `<div class="head"><span class="title">#${a.id} ${esc(a.kind)} ${esc(a.subject)}</span>
      <span class="pill ${esc(a.state)}">${esc(a.state)}</span>
      <span class="meta">requested ${shortTime(a.requested_at)} by <span title="${esc(a.requested_by)}">${esc(a.requested_by_name || a.requested_by)}</span>` +
      (a.incident_id !== null ? ` · incident ${a.incident_id}` : "") + `</span></div>
    <div>${esc(a.why)}</div>
    <form class="decide">
      <input class="reason" placeholder="reason (recorded in the audit log)" aria-label="reason"${disabled}>
      <button type="button" class="approve"${disabled}>Approve</button>
      <button type="button" class="deny"${disabled}>Deny</button>
    </form>`;
}

async function decide(id, verb, el) {
  const reason = el.querySelector(".reason").value.trim();
  if (!reason) { banner("Give a reason: it is recorded with your decision.", "error"); return; }
  el.querySelectorAll("button, input").forEach((b) => { b.disabled = true; });
  try {
    await api(`/v1/approvals/${id}/${verb}`, { method: "POST", body: { reason } });
    banner(`Approval ${id} ${verb === "approve" ? "approved" : "denied"}.`);
    state.approvalJson.delete(String(id));
    await refresh();
  } catch (e) {
    banner(`Could not ${verb} approval ${id}: ${e.message}`, "error");
    el.querySelectorAll("button, input").forEach((b) => { b.disabled = false; });
  }
}

async function drawApprovals() {
  const list = await api("/v1/approvals?state=pending");
  const box = $("#approvals");
  $("#approvals-count").textContent = list.length;
  const ids = new Set(list.map((a) => String(a.id)));
  for (const el of [...box.querySelectorAll(".approval")]) {
    if (!ids.has(el.dataset.id)) { el.remove(); state.approvalJson.delete(el.dataset.id); }
  }
  for (const a of list) {
    const key = String(a.id);
    if (state.approvalJson.has(key)) continue;  // keep a reason being typed
    const el = document.createElement("div");
    el.className = "item approval";
    el.dataset.id = key;
    el.innerHTML = approvalHtml(a);
    el.querySelector(".approve").addEventListener("click", () => decide(a.id, "approve", el));
    el.querySelector(".deny").addEventListener("click", () => decide(a.id, "deny", el));
    box.appendChild(el);
    state.approvalJson.set(key, JSON.stringify(a));
  }
  const empty = box.querySelector(".empty");
  if (list.length && empty) empty.remove();
  if (!list.length && !empty) box.innerHTML = '<p class="empty">Nothing waits for approval.</p>';
}

// --- incidents ----------------------------------------------------------------------

function culpritText(c) {
  const parts = [];
  if (c.host) parts.push(c.host);
  if (c.device_uuid || c.pci_bus_id) parts.push(c.device_uuid || c.pci_bus_id);
  if (c.rank !== null && c.rank !== undefined) parts.push("rank " + c.rank);
  return parts.join(" · ") || "–";
}

function planHtml(plan, actions) {
  if (!plan) return '<p class="empty">no plan recorded</p>';
  const items = (plan.actions || []).map((a) => {
    const rest = Object.entries(a).filter(([k]) => k !== "type" && k !== "env")
      .map(([k, v]) => `${esc(k)}=${esc(typeof v === "object" ? JSON.stringify(v) : v)}`).join(", ");
    return `<li><b>${esc(a.type)}</b> ${rest}</li>`;
  }).join("");
  const reasons = (plan.reasons || []).map((r) => `<li>${esc(r)}</li>`).join("");
  const ledger = (actions || []).map((a) =>
    `<li><span class="pill ${esc(a.state)}">${esc(a.state)}</span> ${esc(a.type)} <span class="mono">${esc(a.key)}</span></li>`).join("");
  return `<div class="meta">mode ${esc(plan.mode)}</div><ol>${items || "<li>no action</li>"}</ol>` +
    (reasons ? `<ul>${reasons}</ul>` : "") + (ledger ? `<h3>ledger</h3><ul>${ledger}</ul>` : "");
}

function incidentHtml(inc, actions) {
  const timeline = (inc.timeline || []).map((t) =>
    `<li><span class="mono">${shortTime(t.at)}</span> ${esc(t.what)}</li>`).join("");
  const evidence = (inc.evidence || []).map(esc).join("\n");
  return `<div class="head"><span class="title">#${inc.id} ${esc(inc.kind)}</span>
      <span class="pill ${esc(inc.state)}">${esc(inc.state)}</span>
      <span class="meta">${esc(inc.domain)} · job <span class="mono">${esc(inc.job_id)}</span> attempt ${inc.attempt}
      · ${esc(culpritText(inc.culprit))} · detected ${shortTime(inc.detected_at)}` +
      (inc.lost_steps !== null ? ` · lost ${inc.lost_steps} steps` : "") + `</span></div>
    <div>${esc(inc.summary)}</div>
    <details data-id="${inc.id}"><summary>timeline, evidence and plan</summary>
      <div class="cols">
        <div><h3>timeline</h3><ol>${timeline || "<li>–</li>"}</ol></div>
        <div><h3>evidence</h3><pre>${evidence || "–"}</pre></div>
        <div><h3>plan (generation ${inc.plan_generation})</h3>${planHtml(inc.plan, actions)}</div>
      </div>
    </details>`;
}

async function drawIncidents(all, ledger) {
  const showClosed = $("#show-closed").checked;
  const list = all.filter((i) => showClosed || i.outcome === "open").reverse();
  const box = $("#incidents");
  $("#incidents-count").textContent = all.filter((i) => i.outcome === "open").length;
  const byIncident = new Map();
  for (const a of ledger) {
    if (!byIncident.has(a.incident_id)) byIncident.set(a.incident_id, []);
    byIncident.get(a.incident_id).push(a);
  }
  const ids = new Set(list.map((i) => String(i.id)));
  for (const el of [...box.querySelectorAll(".incident")]) {
    if (!ids.has(el.dataset.id)) { el.remove(); state.incidentJson.delete(el.dataset.id); }
  }
  let previous = null;
  for (const inc of list) {
    const key = String(inc.id);
    const actions = byIncident.get(inc.id) || [];
    const json = JSON.stringify([inc, actions]);
    let el = box.querySelector(`.incident[data-id="${key}"]`);
    if (!el) {
      el = document.createElement("div");
      el.dataset.id = key;
    }
    if (state.incidentJson.get(key) !== json) {
      const wasOpen = el.querySelector("details") && el.querySelector("details").open;
      el.className = "item incident sev-" + inc.domain;
      el.innerHTML = incidentHtml(inc, actions);
      if (wasOpen) el.querySelector("details").open = true;
      state.incidentJson.set(key, json);
    }
    if (previous === null) box.prepend(el); else previous.after(el);
    previous = el;
  }
  const empty = box.querySelector(".empty");
  if (list.length && empty) empty.remove();
  if (!list.length && !empty) box.insertAdjacentHTML("afterbegin", '<p class="empty">No open incidents.</p>');
}

// --- jobs ---------------------------------------------------------------------------

function duration(s) {
  if (s < 120) return s.toFixed(0) + " s";
  if (s < 7200) return (s / 60).toFixed(0) + " min";
  if (s < 172800) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}

// Age of the newest valid checkpoint, red when older than the job policy allows, and a
// "node-local" mark when the directory shares the compute's failure domain (0251).
function checkpointCell(p) {
  if (!p) return "–";
  const age = p.age_seconds === null ? "none valid" : duration(p.age_seconds) + " old";
  const limit = p.max_age_seconds !== null ? ` (limit ${duration(p.max_age_seconds)})` : "";
  const title = `${p.directory} on ${p.fstype || "?"}` +
    (p.newest_step !== null ? `, step ${p.newest_step}` : "") +
    (p.last_save_seconds !== null ? `, saved in ${p.last_save_seconds.toFixed(1)} s` : "") +
    (p.error ? ", " + p.error : "");
  return `<span class="ckpt${p.overdue ? " overdue" : ""}" title="${esc(title)}">${esc(age + limit)}</span>` +
    (p.unprotected ? ' <span class="pill unprotected" title="node-local storage: lost with the node">node-local</span>' : "");
}

function drawJobs(jobs) {
  $("#jobs-count").textContent = jobs.length;
  const rows = [];
  for (const j of jobs.slice().reverse()) {
    const latest = j.attempts.length ? j.attempts[j.attempts.length - 1] : null;
    const p = j.progress || {};
    const open = state.openJobs.has(j.id);
    rows.push(`<tr class="job" data-id="${esc(j.id)}" title="${esc(j.command.join(" "))}">
      <td><span class="mono">${esc(j.id)}</span><br>${esc(j.name)}</td>
      <td><span class="pill ${esc(j.state)}">${esc(j.state)}</span></td><td>${esc(j.mode)}</td>
      <td>${latest ? latest.number + " " + esc(latest.state) : "–"}</td>
      <td>${p.step !== undefined ? p.step : "–"}</td>
      <td>${p.steps_per_s !== null && p.steps_per_s !== undefined ? p.steps_per_s.toFixed(2) : "–"}</td>
      <td>${Math.max(0, j.attempts.length - 1)}</td><td>${checkpointCell(j.checkpoint_protection)}</td></tr>`);
    if (open) {
      for (const a of j.attempts) {
        const restored = a.checkpoint_restored ? "from step " + a.checkpoint_restored.step : "fresh";
        rows.push(`<tr class="attempt"><td>attempt ${a.number}</td><td>${esc(a.state)}</td>
          <td colspan="2">${a.devices.length} devices · ${esc(restored)}</td>
          <td>${a.last_step !== null ? a.last_step : "–"}</td><td colspan="3">${shortTime(a.started_at)}` +
          (a.reason ? " · " + esc(a.reason) : "") + `</td></tr>`);
      }
    }
  }
  $("#jobs tbody").innerHTML = rows.join("") || '<tr><td colspan="8" class="empty">No jobs yet.</td></tr>';
}

// --- health map ---------------------------------------------------------------------

const HEALTH_ORDER = ["retired", "quarantined", "repair", "validating", "suspect", "healthy"];

function drawHealth(nodes) {
  $("#nodes-count").textContent = nodes.length;
  const html = nodes.map((n) => {
    const squares = [];
    for (const s of HEALTH_ORDER) {
      for (let i = 0; i < (n.devices[s] || 0); i++) squares.push(`<span class="dev ${s}"></span>`);
    }
    const temps = Object.values(n.gpus || {}).map((g) => g.temp_c).filter((t) => t !== null);
    const hottest = temps.length ? Math.max(...temps) : null;
    const title = `${n.host}: agent ${n.status}` +
      (n.heartbeat_age_s !== null ? ` (${n.heartbeat_age_s.toFixed(1)} s ago)` : "") +
      `, node ${n.state}, ` + Object.entries(n.devices).map(([k, v]) => `${v} ${k}`).join(", ") +
      (hottest !== null ? `, hottest GPU ${hottest.toFixed(0)} C` : "") +
      (n.buffered ? `, ${n.buffered} findings buffered` : "");
    return `<div class="node ${esc(n.health)}" title="${esc(title)}" data-host="${esc(n.host)}">
      <div class="name"><span class="live ${esc(n.status)}"></span>${esc(n.host)}</div>
      <div class="devs">${squares.join("")}</div></div>`;
  }).join("");
  $("#health").innerHTML = html || '<p class="empty">No node has reported yet.</p>';
}

// --- chart --------------------------------------------------------------------------

function niceMax(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function drawChart(incidents) {
  const pts = [];
  for (const i of incidents) {
    const t = Date.parse(i.detected_at);
    if (isNaN(t)) continue;
    const start = Date.parse(i.fault_at || i.detected_at);
    const rec = i.recovered_at ? (Date.parse(i.recovered_at) - start) / 1000 : null;
    pts.push({ t, rec, lost: i.lost_steps, id: i.id, kind: i.kind, outcome: i.outcome });
  }
  const box = $("#chart");
  if (!pts.length) { box.innerHTML = '<p class="empty">No incidents yet.</p>'; return; }
  const W = Math.max(480, box.clientWidth || 900), H = 240, L = 56, R = 60, T = 30, B = 34;
  const t0 = Math.min(...pts.map((p) => p.t)), t1 = Math.max(...pts.map((p) => p.t));
  const span = Math.max(1000, t1 - t0);
  // One moment only (a single incident): draw it in the middle rather than at the edge.
  const x = t1 === t0 ? () => (L + W - R) / 2
    : (t) => L + (W - L - R) * ((t - t0) / span) * 0.96 + (W - L - R) * 0.02;
  const recMax = niceMax(Math.max(0, ...pts.map((p) => p.rec || 0)));
  const lostMax = niceMax(Math.max(0, ...pts.map((p) => p.lost || 0)));
  const yRec = (v) => T + (H - T - B) * (1 - v / recMax);
  const yLost = (v) => T + (H - T - B) * (1 - v / lostMax);
  const parts = [`<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="recovery latency and lost steps per incident">`];
  for (let k = 0; k <= 5; k++) {
    const y = T + (H - T - B) * k / 5;
    const rv = recMax * (1 - k / 5), lv = lostMax * (1 - k / 5);
    parts.push(`<line class="gridline" x1="${L}" x2="${W - R}" y1="${y}" y2="${y}"/>`);
    parts.push(`<text x="${L - 6}" y="${y + 4}" text-anchor="end">${rv.toFixed(recMax < 5 ? 1 : 0)}</text>`);
    parts.push(`<text x="${W - R + 6}" y="${y + 4}">${lv.toFixed(lostMax < 5 ? 1 : 0)}</text>`);
  }
  parts.push(`<line class="axis" x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}"/>`);
  parts.push(`<text x="${L}" y="${H - 8}">${esc(new Date(t0).toISOString().slice(0, 19))}Z</text>`);
  parts.push(`<text x="${W - R}" y="${H - 8}" text-anchor="end">${esc(new Date(t1).toISOString().slice(0, 19))}Z</text>`);
  parts.push(`<text x="12" y="${T}" transform="rotate(-90 12 ${T})" text-anchor="end">recovery s</text>`);
  parts.push(`<text x="${W - 10}" y="${T}" transform="rotate(90 ${W - 10} ${T})">lost steps</text>`);
  const bw = Math.max(3, Math.min(14, (W - L - R) / (pts.length * 2.5)));
  for (const p of pts) {
    if (p.lost) {
      const y = yLost(p.lost);
      parts.push(`<rect x="${x(p.t) - bw / 2}" y="${y}" width="${bw}" height="${H - B - y}" fill="#d99a1e" opacity=".55"><title>incident ${p.id}: ${p.lost} steps lost</title></rect>`);
    }
  }
  const rec = pts.filter((p) => p.rec !== null).sort((a, b) => a.t - b.t);
  if (rec.length > 1) {
    parts.push(`<polyline fill="none" stroke="#2f5fd0" stroke-width="1.5" points="${rec.map((p) => `${x(p.t)},${yRec(p.rec)}`).join(" ")}"/>`);
  }
  for (const p of rec) {
    parts.push(`<circle cx="${x(p.t)}" cy="${yRec(p.rec)}" r="4" fill="#2f5fd0"><title>incident ${p.id} (${esc(p.kind)}): recovered in ${p.rec.toFixed(1)} s</title></circle>`);
  }
  for (const p of pts.filter((q) => q.rec === null)) {
    parts.push(`<circle cx="${x(p.t)}" cy="${H - B}" r="3.5" fill="none" stroke="#9aa1ad"><title>incident ${p.id} (${esc(p.kind)}): ${esc(p.outcome)}</title></circle>`);
  }
  parts.push(`<g transform="translate(${L + 8},12)"><circle r="4" cx="0" cy="0" fill="#2f5fd0"/><text x="8" y="4">recovery latency (s, left)</text>
    <rect x="170" y="-5" width="10" height="10" fill="#d99a1e" opacity=".55"/><text x="184" y="4">lost steps (right)</text>
    <circle r="3.5" cx="300" cy="0" fill="none" stroke="#9aa1ad"/><text x="308" y="4">not recovered</text></g>`);
  parts.push("</svg>");
  box.innerHTML = parts.join("");
}

// --- audit --------------------------------------------------------------------------

async function drawAudit() {
  const q = new URLSearchParams({ order: "newest", limit: "100" });
  for (const [k, v] of Object.entries(state.auditQuery)) if (v) q.set(k, v);
  const page = await api("/v1/audit?" + q.toString());
  const rows = page.events.slice().reverse().map((e) => `<tr class="audit-row" data-id="${e.id}">
    <td class="nowrap">${e.id}</td><td class="mono nowrap">${shortTime(e.at)}</td><td title="${esc(e.actor)}">${esc(e.actor_name || e.actor)}</td>
    <td>${esc(e.kind)}</td><td class="mono">${esc(e.subject)}</td><td>${esc(e.message)}</td></tr>`);
  $("#audit tbody").innerHTML = rows.join("") || '<tr><td colspan="6" class="empty">No matching records.</td></tr>';
}

// --- fleet analytics (GET /v1/fleet/report, decision 0252) --------------------------

function barsSvg(title, groups, repeat) {
  const top = groups.slice(0, 8);
  const H = 22 * Math.max(1, top.length) + 28, W = 360, L = 130, R = 96;
  const max = Math.max(1e-9, ...top.map((g) => g.gpu_hours));
  const parts = [`<svg class="bars" viewBox="0 0 ${W} ${H}" role="img" aria-label="${esc(title)}">`,
    `<text class="title" x="0" y="14">${esc(title)}</text>`];
  if (!top.length) parts.push(`<text x="0" y="40">none</text>`);
  top.forEach((g, k) => {
    const y = 24 + k * 22, w = (W - L - R) * g.gpu_hours / max;
    const cls = repeat && repeat.has(g.key) ? "bar repeat" : "bar";
    parts.push(`<text x="${L - 6}" y="${y + 14}" text-anchor="end">${esc(g.key.slice(0, 20))}</text>`,
      `<rect class="${cls}" x="${L}" y="${y + 3}" width="${Math.max(1, w)}" height="15"><title>${esc(g.key)}: ${g.gpu_hours} GPU-hours, ${g.incidents} incidents</title></rect>`,
      `<text x="${L + w + 4}" y="${y + 14}">${g.gpu_hours.toFixed(1)} h · ${g.incidents}</text>`);
  });
  parts.push("</svg>");
  return parts.join("");
}

function trendSvg(title, series) {
  const W = 360, H = 150, L = 44, R = 10, T = 22, B = 22;
  const all = series.flatMap((s) => s.points.map((p) => ({ t: Date.parse(p.start), v: p.median_s })));
  const parts = [`<svg class="trend" viewBox="0 0 ${W} ${H}" role="img" aria-label="${esc(title)}">`,
    `<text class="title" x="0" y="14">${esc(title)}</text>`];
  if (!all.length) { parts.push(`<text x="0" y="40">no data</text></svg>`); return parts.join(""); }
  const t0 = Math.min(...all.map((p) => p.t)), t1 = Math.max(...all.map((p) => p.t));
  const vmax = niceMax(Math.max(...all.map((p) => p.v)));
  const x = (t) => t1 === t0 ? (L + W - R) / 2 : L + (W - L - R) * (t - t0) / (t1 - t0);
  const y = (v) => T + (H - T - B) * (1 - v / vmax);
  parts.push(`<line class="axis" x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}"/>`,
    `<text x="${L - 4}" y="${T + 4}" text-anchor="end">${vmax}</text><text x="${L - 4}" y="${H - B}" text-anchor="end">0 s</text>`,
    `<text x="${L}" y="${H - 6}">${esc(new Date(t0).toISOString().slice(0, 10))}</text>`,
    `<text x="${W - R}" y="${H - 6}" text-anchor="end">${esc(new Date(t1).toISOString().slice(0, 10))}</text>`);
  series.forEach((s, k) => {
    const pts = s.points.map((p) => `${x(Date.parse(p.start)).toFixed(1)},${y(p.median_s).toFixed(1)}`);
    if (pts.length) parts.push(`<polyline class="line s${k}" points="${pts.join(" ")}"><title>${esc(s.label)} (median)</title></polyline>`);
    for (const p of s.points) parts.push(`<circle class="dot s${k}" cx="${x(Date.parse(p.start))}" cy="${y(p.median_s)}" r="2.5"><title>${esc(s.label)} ${esc(p.start.slice(0, 10))}: median ${p.median_s} s, p90 ${p.p90_s} s, ${p.count}</title></circle>`);
    parts.push(`<text class="legend s${k}" x="${W - R - 4}" y="${T + 14 + 12 * k}" text-anchor="end">${esc(s.label)}</text>`);
  });
  parts.push("</svg>");
  return parts.join("");
}

function drawFleet(r) {
  const fr = r.first_restart;
  const rate = fr.rate === null ? "–" : Math.round(fr.rate * 100) + "%";
  const repeat = new Set(r.repeat_nodes.map((g) => g.key));
  const offenders = r.repeat_nodes.map((g) => `node ${g.key} (${g.incidents})`)
    .concat(r.repeat_cards.map((c) => `card ${c.key} · ${c.model} on ${c.node} (${c.incidents})`));
  $("#fleet-summary").innerHTML =
    `<b>${r.gpu_hours.toFixed(1)}</b> interrupted GPU-hours · <b>${r.incidents}</b> incidents ` +
    `(${r.recovered} recovered) · first restart succeeded <b>${fr.succeeded}/${fr.restarted}</b> (${rate})` +
    (offenders.length ? `<br><span class="repeat-text">Repeat offenders: ${esc(offenders.join(", "))}</span>` : "");
  $("#fleet-plots").innerHTML = [
    barsSvg("GPU-hours by cause", r.by_cause),
    barsSvg("GPU-hours by card model", r.by_model),
    barsSvg("GPU-hours by node (red: repeat)", r.by_node, repeat),
    barsSvg("GPU-hours by rack", r.by_rack),
    trendSvg("Time to detect / act / recover (median per day)", [
      { label: "detect", points: r.time_to_detect }, { label: "act", points: r.time_to_act },
      { label: "recover", points: r.time_to_recover }]),
    trendSvg("Checkpoint write time (median per day)", [{ label: "write", points: r.checkpoint_write }]),
  ].map((svg) => `<div class="plot">${svg}</div>`).join("");
}

// --- loop ---------------------------------------------------------------------------

let tick = 0;

async function refresh() {
  if (state.busy) return;
  state.busy = true;
  try {
    if (!state.role && !(await checkToken())) return;
    const slow = tick % 3 === 0;  // the heavier views every third round
    const [incidents, ledger, jobs] = await Promise.all([
      api("/v1/incidents"), api("/v1/actions"), api("/v1/jobs"),
    ]);
    await Promise.all([drawStatus(), drawApprovals(), drawIncidents(incidents, ledger), drawAudit()]);
    drawJobs(jobs);
    drawChart(incidents);
    if (slow) drawHealth(await api("/v1/nodes"));
    if (tick % 15 === 0) drawFleet(await api("/v1/fleet/report"));  // every 30 s
    tick += 1;
  } catch (e) {
    if (e.status === 401 || e.status === 403) { state.role = null; await checkToken(); }
    else banner("Cannot reach the server: " + e.message, "error");
  } finally {
    state.busy = false;
  }
}

function init() {
  $("#token-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    state.token = $("#token-input").value.trim();
    sessionStorage.setItem(TOKEN_KEY, state.token);
    $("#token-input").value = "";
    state.role = null;
    state.approvalJson.clear();
    $("#approvals").innerHTML = "";
    tick = 0;
    await refresh();
  });
  $("#token-clear").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    state.token = "";
    state.role = null;
    checkToken();
  });
  $("#audit-filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.auditQuery = {
      kind: $("#f-kind").value, subject: $("#f-subject").value.trim(),
      job_id: $("#f-job").value.trim(), incident_id: $("#f-incident").value.trim(),
    };
    refresh();
  });
  $("#show-closed").addEventListener("change", () => refresh());
  $("#jobs tbody").addEventListener("click", (ev) => {
    const row = ev.target.closest("tr.job");
    if (!row) return;
    const id = row.dataset.id;
    if (state.openJobs.has(id)) state.openJobs.delete(id); else state.openJobs.add(id);
    refresh();
  });
  refresh();
  setInterval(refresh, POLL_MS);
}

document.addEventListener("DOMContentLoaded", init);
