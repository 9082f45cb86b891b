/**
 * The fleet page (issue 28 item 5): one self-contained HTML document (inline style and script, no
 * external asset, so it is served as is by `npm start` and next to the cloud mode) that polls
 * `GET /api/fleet` ({@link FleetView}, `./view.ts`) every second and draws:
 * - per package, a grid of its PackageInstalls by wave: one cell per cluster, coloured by health
 *   (healthy, reconciling, failed or unhealthy, unknown) and marked when at its rollout's target
 *   version, showing the version and the last reconcile's duration and cost;
 * - per rollout, its waves' progress and status (a stop with its cause), the share of the
 *   package's PackageInstalls at the target over time (sampled by the page since it was opened)
 *   and the rollout's history.
 *
 * Every value from the view is set as text (`textContent`, SVG attributes), never parsed as HTML:
 * cluster ids, names and causes come from tenants. Cells carry `data-cluster`, `data-install`,
 * `data-version` and `data-health` for tests and scripts.
 *
 * @module
 */
import { createHash } from 'node:crypto';

/** The page's HTML. */
export const FLEET_PAGE_HTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>kapp-lambda fleet</title>
<style>
  :root { --ok: #2e7d32; --busy: #f9a825; --bad: #c62828; --unknown: #9e9e9e; --ink: #1d2327; --line: #d7dce0; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink); background: #f6f7f8; }
  header { display: flex; align-items: baseline; gap: 16px; padding: 12px 20px; background: #fff; border-bottom: 1px solid var(--line); }
  header h1 { font-size: 18px; margin: 0; }
  header .meta { color: #5f6b73; }
  main { padding: 16px 20px; display: grid; gap: 16px; }
  section { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 12px 16px; }
  h2 { font-size: 15px; margin: 0 0 8px; }
  .badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; color: #fff; background: var(--unknown); }
  .badge.running, .badge.completed { background: var(--ok); }
  .badge.paused { background: var(--busy); }
  .badge.stopped, .badge.aborted { background: var(--bad); }
  .waves { display: flex; gap: 6px; margin: 8px 0; flex-wrap: wrap; }
  .wave { flex: 1 1 120px; border: 1px solid var(--line); border-radius: 4px; padding: 6px 8px; background: #fafafa; }
  .wave.released { border-color: var(--busy); background: #fff8e1; }
  .wave.completed { border-color: var(--ok); background: #e8f5e9; }
  .wave .when { color: #5f6b73; font-size: 12px; }
  .cause { color: var(--bad); margin: 4px 0; }
  .row { display: grid; grid-template-columns: 120px 1fr; gap: 8px; align-items: start; margin: 6px 0; }
  .row .label { color: #5f6b73; padding-top: 6px; }
  .cells { display: flex; flex-wrap: wrap; gap: 6px; }
  .cell { width: 150px; border-radius: 4px; padding: 6px 8px; color: #fff; background: var(--unknown); }
  .cell.healthy { background: var(--ok); }
  .cell.reconciling { background: var(--busy); color: var(--ink); }
  .cell.failed, .cell.unhealthy { background: var(--bad); }
  .cell.at-target { box-shadow: inset 5px 0 0 #1565c0; padding-left: 12px; }
  .cell .id { font-weight: 600; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
  .cell .sub { font-size: 12px; opacity: .9; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
  .legend span { margin-right: 12px; }
  .legend i.cell { display: inline-block; width: 10px; height: 10px; padding: 0; border-radius: 2px; margin-right: 4px; vertical-align: middle; }
  ol.history { margin: 6px 0 0; padding-left: 20px; max-height: 180px; overflow: auto; color: #37434b; }
  svg.progress { width: 100%; height: 90px; background: #fafafa; border: 1px solid var(--line); border-radius: 4px; }
  #status { color: #5f6b73; }
  #status.error { color: var(--bad); }
</style>
</head>
<body>
<header><h1>kapp-lambda fleet</h1><span class="meta" id="summary"></span><span id="status">loading…</span></header>
<main>
  <section id="rollouts"><h2>Rollouts</h2><div id="rollout-list"></div></section>
  <section id="grid"><h2>Clusters by package and wave</h2>
    <div class="legend"><span><i class="cell healthy"></i>healthy</span><span><i class="cell reconciling"></i>reconciling</span><span><i class="cell failed"></i>failed or unhealthy</span><span><i class="cell"></i>unknown</span><span><i class="cell at-target"></i>at the rollout's version</span></div>
    <div id="packages"></div>
  </section>
</main>
<script>
"use strict";
const samples = new Map();
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = String(text);
  return e;
}
function healthOf(i) {
  if (i.reconcile === "failed") return "failed";
  if (i.healthy === false) return "unhealthy";
  if (i.reconcile === "reconciling") return "reconciling";
  return i.reconcile === "succeeded" ? "healthy" : "unknown";
}
function ago(at, now) {
  const s = Math.max(0, Math.round((now - Date.parse(at)) / 1000));
  return s < 90 ? s + " s ago" : Math.round(s / 60) + " min ago";
}
function money(usd) { return "$" + (usd < 0.01 ? usd.toFixed(6) : usd.toFixed(2)); }
function cell(i, target) {
  const h = healthOf(i);
  const c = el("div", "cell " + h + (target && i.version === target ? " at-target" : ""));
  c.dataset.cluster = i.clusterId;
  c.dataset.install = i.namespace + "/" + i.name;
  c.dataset.version = i.version || "";
  c.dataset.health = h;
  c.append(el("div", "id", i.clusterId), el("div", "sub", (i.version || "no version") + " · " + h));
  const r = i.lastReconcile;
  c.append(el("div", "sub", r ? (r.durationMs / 1000).toFixed(1) + " s · " + money(r.costUsd) : "no receipt yet"));
  c.title = i.namespace + "/" + i.name + (r ? "\\nlast reconcile " + r.outcome + " at " + r.endedAt : "") +
    (i.lastAttemptedVersion && i.lastAttemptedVersion !== i.version ? "\\ntrying " + i.lastAttemptedVersion : "");
  return c;
}
function progressSvg(points) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "progress");
  svg.setAttribute("viewBox", "0 0 300 90");
  svg.setAttribute("preserveAspectRatio", "none");
  if (points.length > 1) {
    const t0 = points[0].t, t1 = points[points.length - 1].t || t0 + 1;
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", "#2e7d32");
    line.setAttribute("stroke-width", "2");
    line.setAttribute("points", points.map((p) => ((p.t - t0) / Math.max(1, t1 - t0) * 296 + 2).toFixed(1) + "," + (86 - p.share * 82).toFixed(1)).join(" "));
    svg.append(line);
  }
  return svg;
}
function render(view) {
  const now = Date.parse(view.generatedAt);
  const count = (n, one, many) => n + " " + (n === 1 ? one : many);
  document.getElementById("summary").textContent = count(view.clusters.length, "cluster", "clusters") + " · " + count(view.installs.length, "PackageInstall", "PackageInstalls") + " · " + count(view.rollouts.length, "rollout", "rollouts");
  const list = document.getElementById("rollout-list");
  list.replaceChildren();
  if (view.rollouts.length === 0) list.append(el("p", "", "No rollout has started. With a rollout policy applied, the next version of its packages goes out in waves; without one, to every cluster at once."));
  for (const r of view.rollouts) {
    const box = el("div", "rollout");
    box.dataset.rollout = r.policy + "/" + r.refName;
    box.dataset.status = r.status;
    const title = el("h2", "", r.refName + ": " + (r.from ? r.from + " → " : "") + r.target + " ");
    title.append(el("span", "badge " + r.status, r.status));
    box.append(title);
    if (r.cause) box.append(el("div", "cause", r.cause));
    const waves = el("div", "waves");
    for (const w of r.waves) {
      const state = w.completedAt ? "completed" : w.releasedAt ? "released" : "pending";
      const d = el("div", "wave " + state);
      d.dataset.wave = w.name;
      d.dataset.state = state;
      d.append(el("div", "", w.name), el("div", "when", state === "pending" ? "not started" : state + " " + ago(w.completedAt || w.releasedAt, now)));
      waves.append(d);
    }
    box.append(waves);
    const mine = view.installs.filter((i) => i.refName === r.refName);
    const at = mine.filter((i) => i.version === r.target).length;
    const key = r.policy + "/" + r.refName + "@" + r.target;
    const pts = samples.get(key) || [];
    pts.push({ t: now, share: mine.length ? at / mine.length : 0 });
    if (pts.length > 600) pts.shift();
    samples.set(key, pts);
    box.append(el("div", "when", at + " of " + mine.length + " at " + r.target), progressSvg(pts));
    const hist = el("ol", "history");
    for (const h of r.history.slice(-50).reverse()) hist.append(el("li", "", h.at + " " + h.what));
    box.append(hist);
    list.append(box);
  }
  const pkgs = document.getElementById("packages");
  pkgs.replaceChildren();
  const refNames = [...new Set(view.installs.map((i) => i.refName || "(unknown package)"))].sort();
  for (const ref of refNames) {
    const sec = el("div", "package");
    sec.dataset.package = ref;
    sec.append(el("h2", "", ref));
    const mine = view.installs.filter((i) => (i.refName || "(unknown package)") === ref);
    const rollout = view.rollouts.find((r) => r.refName === ref);
    const order = rollout ? rollout.waves.map((w) => w.name) : [];
    const waves = [...new Set(mine.map((i) => i.wave || "—"))].sort((a, b) => (order.indexOf(a) + 1 || 1e9) - (order.indexOf(b) + 1 || 1e9) || (a < b ? -1 : 1));
    for (const w of waves) {
      const row = el("div", "row");
      row.append(el("div", "label", w === "—" ? "no wave" : "wave " + w));
      const cells = el("div", "cells");
      for (const i of mine.filter((x) => (x.wave || "—") === w)) cells.append(cell(i, rollout && rollout.target));
      row.append(cells);
      sec.append(row);
    }
    pkgs.append(sec);
  }
  const idle = view.clusters.filter((c) => !view.installs.some((i) => i.clusterId === c));
  if (idle.length) {
    const sec = el("div", "package");
    sec.append(el("h2", "", "Clusters without a PackageInstall"));
    const cells = el("div", "cells");
    for (const c of idle) {
      const d = el("div", "cell unknown");
      d.dataset.cluster = c;
      d.dataset.health = "unknown";
      d.append(el("div", "id", c));
      cells.append(d);
    }
    sec.append(cells);
    pkgs.append(sec);
  }
}
async function refresh() {
  const status = document.getElementById("status");
  try {
    const res = await fetch("/api/fleet", { cache: "no-store" });
    // A server that cannot read its store says so in a line of text (fleetResponse's 503).
    if (!res.ok) throw new Error(((await res.text()).trim().slice(0, 200) || "no answer") + " (HTTP " + res.status + ")");
    const view = await res.json();
    render(view);
    status.className = "";
    status.textContent = "updated " + new Date(view.generatedAt).toLocaleTimeString();
  } catch (err) {
    status.className = "error";
    status.textContent = "cannot read the fleet: " + (err && err.message ? err.message : String(err));
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
`;

/**
 * The page's `Content-Security-Policy`: nothing but its own inline style and script (by their
 * sha256, so no other inline code runs) and requests to its own origin (`/api/fleet`).
 */
export function fleetPageCsp(): string {
  const hash = (tag: string) => {
    const m = new RegExp(`<${tag}>([\\s\\S]*?)</${tag}>`).exec(FLEET_PAGE_HTML);
    return `'sha256-${createHash('sha256')
      .update(m?.[1] ?? '')
      .digest('base64')}'`;
  };
  return `default-src 'none'; style-src ${hash('style')}; script-src ${hash('script')}; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'`;
}
