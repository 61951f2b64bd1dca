#include "server/http/status_page.h"

namespace gradsync {

const char kStatusPageHtml[] = R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>gradsync</title>
<style>
  body { font: 14px system-ui, sans-serif; margin: 24px; color: #1d2330; }
  h1 { font-size: 20px; margin: 0 0 8px; }
  h2 { font-size: 15px; margin: 20px 0 6px; }
  table { border-collapse: collapse; }
  th, td { padding: 3px 10px; text-align: right; border-bottom: 1px solid #e3e6ec; }
  th:first-child, td:first-child { text-align: left; }
  th { background: #f3f5f8; }
  .state-running, .state-active { color: #1a7f37; }
  .state-failed, .state-lost { color: #c62828; font-weight: bold; }
  .state-degraded, .state-waiting { color: #b26a00; }
  #summary span { margin-right: 18px; }
  #diagnosis div { margin: 4px 0; padding: 6px 10px; background: #fff4e5; }
  #stacks pre { margin: 2px 0 8px 16px; font-size: 12px; }
  #error { color: #c62828; }
  svg { border: 1px solid #e3e6ec; background: #fff; }
  .legend span { margin-right: 12px; }
</style>
</head>
<body>
<h1 id="title">gradsync</h1>
<div id="summary"></div>
<div id="diagnosis"></div>
<div id="stacks"></div>
<table id="table"></table>
<div id="plot-box" hidden>
  <h2>step time per rank, last 5 minutes</h2>
  <svg id="plot" width="900" height="260"></svg>
  <div class="legend" id="legend"></div>
</div>
<p id="error"></p>
<script>
"use strict";
const job = new URLSearchParams(location.search).get("job");
// A coordinator with --auth=token answers the API only with a token: give
// it in the address's fragment (/#token=TOKEN), which is never sent to the
// server or kept in its logs; the page sends it as a bearer token.
const token = new URLSearchParams(location.hash.slice(1)).get("token");
const headers = token ? {Authorization: "Bearer " + token} : {};
const WINDOW_S = 300;
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const history = new Map();  // rank -> [[seconds since epoch, step seconds]]

function esc(s) {
  return String(s).replace(/[&<>"']/g, c => "&#" + c.charCodeAt(0) + ";");
}
function num(x) { return x === undefined || x === null ? 0 : Number(x); }
function seconds(d) { return d ? parseFloat(d) : 0; }  // "0.25s"
function ms(s) { return s > 0 ? (s * 1000).toFixed(1) + " ms" : "-"; }
function name(state, prefix) {
  return String(state || "").replace(prefix, "").toLowerCase();
}
function ago(t) {
  if (!t) return "-";
  const s = (Date.now() - Date.parse(t)) / 1000;
  return s < 1 ? "now" : s.toFixed(0) + "s ago";
}
function row(cells, id, cls) {
  return "<tr" + (id ? ' id="' + esc(id) + '"' : "") + ">" +
      cells.map((c, i) => "<td" + (cls && cls[i] ? ' class="' + cls[i] + '"' : "") +
                          ">" + c + "</td>").join("") + "</tr>";
}

function renderJobs(jobs) {
  document.getElementById("title").textContent = "gradsync: jobs";
  document.getElementById("summary").textContent =
      jobs.length + " job(s); refreshed every second";
  const head = "<tr><th>job</th><th>state</th><th>round</th><th>world size</th><th>updated</th></tr>";
  document.getElementById("table").innerHTML = head + jobs.map(j => {
    const id = j.config.job_id, state = name(j.state, "JOB_STATE_");
    return row(['<a href="?job=' + encodeURIComponent(id) + esc(location.hash) + '">' +
                esc(id) + "</a>",
                esc(state), num(j.round), num(j.world_size), ago(j.update_time)],
               "job-" + id, [null, "state-" + state]);
  }).join("");
}

// What the members are doing (the summary), and which of them the table
// lists: a job of more than 64 ranks lists only its unhealthy ones.
function membersNote(j) {
  const s = j.summary || {}, listed = (j.members || []).length;
  const world = num(j.world_size);
  if (!world) return "";
  let note = "<span id=\"members-note\">members: " + num(s.active) + " active, " +
      num(s.lost) + " lost, " + num(s.exited) + " exited";
  if (s.heard) note += "; steps " + num(s.min_step) + "-" + num(s.max_step);
  if (listed < world) {
    note += "; listing " + listed + " of " + num(s.matching) + " needing a look";
  }
  return note + "</span>";
}

// The stacks a hang verdict asked for: what only the ranks behind, or only
// the rank ahead, show, in full; what both sides show, a line each.
function renderStacks(h) {
  const box = document.getElementById("stacks");
  if (!h) { box.innerHTML = ""; return; }
  const ahead = h.healthy_rank === undefined ? 0 : num(h.healthy_rank);
  const list = r => (r || []).map(num).join(",");
  const label = g => ((g.ranks || []).length === 1 ? "rank " : "ranks ") +
      list(g.ranks) + ", " + num(g.threads) + " thread(s) (" +
      (g.thread_names || []).join(", ") + ")";
  const behind = h.hung_ranks || [];
  let html = "<h2>stacks (asked " + (behind.length === 1 ? "rank " : "ranks ") +
      esc(list(behind)) + " behind" +
      (ahead >= 0 ? " and rank " + ahead + " ahead" : "") + "; answered: " +
      esc(list(h.answered) || "none yet") + ")</h2>";
  const shared = [];
  for (const g of h.groups || []) {
    const aheadOnly = (g.ranks || []).length === 1 && num(g.ranks[0]) === ahead;
    if (!g.hung_only && !aheadOnly) { shared.push(g); continue; }
    html += "<div>" + esc(label(g) + (g.hung_only ? ", behind only" : ", ahead only")) +
        "</div><pre>" + esc((g.frames || []).join("\n")) + "</pre>";
  }
  // A shared stack by the frame that tells it: the innermost of gradsync's
  // own, else the innermost that is not a wait primitive.
  const telling = g => {
    const f = g.frames || [""];
    return f.find(x => x.startsWith("gradsync::")) ||
        f.find(x => !/^(absl::|Absl|\?\? |__|pthread_|syscall$)/.test(x)) || f[0];
  };
  if (shared.length) {
    html += "<div>on both sides:</div><pre>" +
        esc(shared.map(g => label(g) + " in " + telling(g)).join("\n")) + "</pre>";
  }
  for (const e of h.errors || []) html += "<div>" + esc(e) + "</div>";
  box.innerHTML = html;
}

function renderJob(j) {
  const state = name(j.state, "JOB_STATE_");
  document.getElementById("title").textContent = "gradsync: job " + j.config.job_id;
  document.getElementById("summary").innerHTML =
      '<span id="job-state" class="state-' + state + '">' + esc(state) + "</span>" +
      "<span>round " + num(j.round) + "</span>" +
      "<span>world size " + num(j.world_size) + "</span>" +
      "<span>recoveries " + num(j.recovery_count) + "</span>" +
      membersNote(j) +
      (j.reason ? "<span>" + esc(j.reason) + "</span>" : "") +
      ' <a href="/' + esc(location.hash) + '">all jobs</a>';
  const d = j.diagnosis || {};
  const notes = [];
  if (d.hang) notes.push("hang: " + d.hang);
  if (d.desync) notes.push("desync: " + d.desync);
  if (d.divergence && d.divergence.verdict) {
    notes.push("divergence (round " + num(d.divergence.round) + "): " +
               d.divergence.verdict);
  }
  if (d.overload) notes.push("overload: " + d.overload);
  if (d.rebalance && d.rebalance.verdict) {
    notes.push("rebalanced (round " + num(d.rebalance.round) + "): " +
               d.rebalance.verdict);
  }
  for (const s of d.stragglers || []) {
    notes.push("straggler: rank " + num(s.rank) + ", " + ms(seconds(s.lag)) +
               " late (median of " + num(s.steps) + " steps)");
  }
  document.getElementById("diagnosis").innerHTML =
      notes.map(n => '<div class="note">' + esc(n) + "</div>").join("");
  renderStacks(d.hang_stacks);
  const head = "<tr><th>rank</th><th>host</th><th>state</th><th>step</th>" +
      "<th>samples/s</th><th>step time</th><th>comm time</th><th>lag</th><th>last seen</th></tr>";
  const now = Date.now() / 1000;
  document.getElementById("table").innerHTML = head + (j.members || []).map(m => {
    const w = m.metrics || {}, t = w.step_timings || {};
    const rank = num(m.rank), memberState = name(m.state, "MEMBER_STATE_");
    const step = num(t.step_seconds);
    if (step > 0) {
      if (!history.has(rank)) history.set(rank, []);
      history.get(rank).push([now, step]);
    }
    return row([rank, esc((m.node || {}).hostname || "-"), esc(memberState),
                num(w.step), num(w.samples_per_second).toFixed(1), ms(step),
                ms(num(t.communication_seconds)), ms(seconds(m.lag)),
                ago(m.last_seen)],
               "rank-" + rank, [null, null, "state-" + memberState]);
  }).join("");
  plot(now);
}

function plot(now) {
  for (const points of history.values()) {
    while (points.length && points[0][0] < now - WINDOW_S) points.shift();
  }
  const ranks = [...history.keys()].filter(r => history.get(r).length).sort((a, b) => a - b);
  document.getElementById("plot-box").hidden = ranks.length === 0;
  if (!ranks.length) return;
  const svg = document.getElementById("plot");
  const W = svg.width.baseVal.value, H = svg.height.baseVal.value, pad = 40;
  let top = 0;
  for (const r of ranks) for (const [, s] of history.get(r)) top = Math.max(top, s);
  top = top > 0 ? top * 1.1 : 1;
  const x = t => pad + (W - 2 * pad) * (1 - (now - t) / WINDOW_S);
  const y = s => H - pad + (2 * pad - H) * (s / top);
  let out = '<line x1="' + pad + '" y1="' + (H - pad) + '" x2="' + (W - pad) +
      '" y2="' + (H - pad) + '" stroke="#999"/>' +
      '<text x="4" y="' + (pad - 8) + '" font-size="11">' + ms(top) + "</text>" +
      '<text x="' + (W - pad - 30) + '" y="' + (H - 8) + '" font-size="11">now</text>' +
      '<text x="' + pad + '" y="' + (H - 8) + '" font-size="11">-5 min</text>';
  ranks.forEach((r, i) => {
    const color = COLORS[i % COLORS.length];
    const points = history.get(r).map(([t, s]) => x(t).toFixed(1) + "," + y(s).toFixed(1));
    out += '<polyline id="line-' + r + '" fill="none" stroke-width="1.5" stroke="' +
        color + '" points="' + points.join(" ") + '"/>';
  });
  svg.innerHTML = out;
  document.getElementById("legend").innerHTML = ranks.map((r, i) =>
      '<span style="color:' + COLORS[i % COLORS.length] + '">&#9632; rank ' + r + "</span>").join("");
}

async function refresh() {
  try {
    const response = await fetch(
        job ? "/api/job?id=" + encodeURIComponent(job) : "/api/jobs", {headers});
    if (response.status === 401 || response.status === 403) {
      throw new Error((await response.text()) +
                      " (open the page as /#token=TOKEN)");
    }
    if (!response.ok) throw new Error(await response.text());
    const body = await response.json();
    if (job) renderJob(body); else renderJobs(body.jobs || []);
    document.getElementById("error").textContent = "";
  } catch (e) {
    document.getElementById("error").textContent = "cannot refresh: " + e.message;
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
)html";

}  // namespace gradsync
