// The explorer page: loads data/<key>.js files on demand through script tags (works from file://).
"use strict";
const GR = (() => {
  const cache = new Map(), waiting = new Map();
  function receive(key, payload) {
    cache.set(key, payload);
    const done = waiting.get(key);
    if (done) { waiting.delete(key); done.resolve(payload); }
  }
  function load(key) {
    if (cache.has(key)) return Promise.resolve(cache.get(key));
    if (waiting.has(key)) return waiting.get(key).promise;
    let resolve, reject;
    const promise = new Promise((ok, fail) => { resolve = ok; reject = fail; });
    waiting.set(key, { promise, resolve, reject });
    const script = document.createElement("script");
    script.src = "data/" + key + ".js";
    script.onerror = () => { waiting.delete(key); reject(new Error("missing data file " + key)); };
    script.onload = () => script.remove();
    document.head.appendChild(script);
    return promise;
  }
  return { receive, load };
})();

const $ = (id) => document.getElementById(id);
const esc = (value) => String(value ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const fold = (text) => String(text).toLowerCase().replace(/[^a-z0-9]/g, "");
const TYPE_COLOURS = ["#3b78c4", "#d1603d", "#3f9e6e", "#8e5bb5", "#c9a227", "#4aa3b5", "#b5487a", "#6d7a8c"];
const typeColour = (() => { const seen = new Map(); return (t) => { t = String(t || "").toUpperCase(); if (!seen.has(t)) seen.set(t, TYPE_COLOURS[seen.size % TYPE_COLOURS.length]); return seen.get(t); }; })();
const ratingBadge = (r) => r == null ? "" : `<span class="rating" style="background:${ratingColour(r)}" title="impact rating">${r.toFixed(1)}</span>`;
function ratingColour(r) { const x = Math.max(0, Math.min(10, r)) / 10; return `hsl(${Math.round(210 - 200 * x)}, 55%, 45%)`; }

const state = { meta: null, level: 0, page: 0, community: null };

async function start() {
  state.meta = await GR.load("meta");
  const m = state.meta;
  $("index-title").textContent = m.title;
  $("totals").textContent = `${m.entities.toLocaleString()} entities · ${m.relationships.toLocaleString()} relationships · ${m.communities.toLocaleString()} communities · ${m.text_units.toLocaleString()} text units`;
  $("level-tabs").innerHTML = m.levels.map((l) => `<button role="tab" data-level="${l.level}" title="${l.entities.toLocaleString()} entity memberships">Level ${l.level} (${l.communities})</button>`).join("");
  $("level-tabs").addEventListener("click", (e) => { const b = e.target.closest("button"); if (b) showLevel(Number(b.dataset.level)); });
  $("level-more").addEventListener("click", () => loadLevelPage(state.level, state.page + 1));
  setupSearch();
  window.addEventListener("hashchange", route);
  if (m.levels.length) await showLevel(m.levels[0].level);
  await route();
  // Time to a usable page (hierarchy listed, linked view drawn), for measurement and tests.
  document.documentElement.dataset.readyMs = String(Math.round(performance.now()));
}

async function showLevel(level) {
  state.level = level; state.page = -1;
  for (const b of $("level-tabs").children) b.setAttribute("aria-selected", String(Number(b.dataset.level) === level));
  $("level-list").innerHTML = "";
  await loadLevelPage(level, 0);
}

async function loadLevelPage(level, page) {
  const data = await GR.load(`level-${level}-${page}`);
  if (state.level !== level) return;
  state.page = page;
  $("level-list").insertAdjacentHTML("beforeend", data.communities.map((c) =>
    `<li data-community="${c.id}" class="community-row${c.id === state.community ? " selected" : ""}"><span class="ctitle" title="${esc(c.title)}">${esc(c.title)}</span><span class="size">${c.size} entities</span>${ratingBadge(c.rating)}</li>`).join(""));
  $("level-more").hidden = page + 1 >= data.pages;
}

function communityLink(c) {
  return `<div class="community-link" data-community="${c.id}"><span class="ctitle">${esc(c.title)}</span><span class="size">level ${c.level} · ${c.size} entities${c.links ? ` · ${c.links} links` : ""}</span>${ratingBadge(c.rating)}</div>`;
}

document.addEventListener("click", (e) => {
  const community = e.target.closest("[data-community]");
  if (community) { location.hash = "community=" + community.dataset.community; return; }
  const entity = e.target.closest("[data-entity]");
  if (entity) { location.hash = `entity=${entity.dataset.entity}:${entity.dataset.bucket}`; }
});

async function route() {
  const hash = decodeURIComponent(location.hash.slice(1));
  const [kind, value] = hash.split("=");
  if (kind === "community") await showCommunity(Number(value));
  if (kind === "entity") { const [id, bucket] = value.split(":"); await showEntity(id, Number(bucket)); }
  if (kind === "search") { $("search").value = value; $("search").dispatchEvent(new Event("input")); }
}

async function showCommunity(id) {
  const c = await GR.load("community/" + id);
  state.community = id;
  if (state.level !== c.level) await showLevel(c.level);
  for (const li of $("level-list").children) li.classList.toggle("selected", Number(li.dataset.community) === id);
  const r = c.report;
  const crumbs = c.parent ? `<a data-community="${c.parent.id}">↑ ${esc(c.parent.title)}</a> (level ${c.parent.level})` : "top level";
  $("detail").innerHTML = `
    <div class="crumbs">${crumbs}</div>
    <h2 id="community-title">${esc(r ? r.title : c.title)} ${ratingBadge(r && r.rating)}</h2>
    <div class="muted">Community ${c.id} · level ${c.level} · ${c.n_entities} entities · ${c.sub_communities.length} sub-communities</div>
    ${r ? `<p class="summary" id="report-summary">${esc(r.summary)}</p>
      ${r.rating_explanation ? `<p class="muted">Rating: ${esc(r.rating_explanation)}</p>` : ""}
      <h3>Findings</h3><ol class="findings" id="findings">${r.findings.map((f) => `<li><b>${esc(f.summary)}</b>${esc(f.explanation)}</li>`).join("")}</ol>`
      : `<p class="muted">No report for this community.</p>`}
    ${c.sub_communities.length ? `<h3>Sub-communities</h3><div id="sub-communities">${c.sub_communities.map(communityLink).join("")}</div>` : ""}
    <h3>Graph: top ${c.graph.nodes.length} entities and neighbouring communities</h3>
    <svg id="graph" viewBox="0 0 800 420" role="img" aria-label="community graph"></svg>
    ${c.graph.neighbours.length ? `<h3>Neighbouring communities</h3>${c.graph.neighbours.map(communityLink).join("")}` : ""}
    <h3>Entities${c.n_entities > c.entities.length ? ` (top ${c.entities.length} of ${c.n_entities} by degree)` : ""}</h3>
    <table id="entities"><tr><th>Name</th><th>Type</th><th>Degree</th></tr>${c.entities.map((e) =>
      `<tr><td><a class="entity-link" data-entity="${esc(e.id)}" data-bucket="${e.b}">${esc(e.title)}</a></td><td>${esc(e.type)}</td><td>${e.degree}</td></tr>`).join("")}</table>
    <h3>Relationships</h3>
    <table id="relationships"><tr><th>Source</th><th>Target</th><th>Weight</th><th>Description</th></tr>${c.relationships.map((x) =>
      `<tr><td>${esc(x.source)}</td><td>${esc(x.target)}</td><td>${x.weight}</td><td>${esc(x.description)}</td></tr>`).join("")}</table>`;
  drawGraph($("graph"), c);
}

function drawGraph(svg, c) {
  const W = 800, H = 420;
  const nodes = c.graph.nodes.map((n) => ({ ...n, kind: "entity" }));
  const neighbours = c.graph.neighbours.map((n) => ({ ...n, kind: "community" }));
  const all = nodes.concat(neighbours);
  const index = new Map(all.map((n, i) => [n.kind === "entity" ? n.id : "c" + n.id, i]));
  const edges = c.graph.edges.map(([s, t, w]) => ({ s: index.get(s), t: index.get(t), w })).filter((e) => e.s != null && e.t != null);
  // Neighbouring communities hang off the community's best-connected entity (the hub).
  neighbours.forEach((n) => edges.push({ s: 0, t: index.get("c" + n.id), w: 1, neighbour: true }));
  let seed = 7; const rand = () => (seed = (seed * 16807) % 2147483647) / 2147483647;
  all.forEach((n, i) => { const a = 2 * Math.PI * i / Math.max(1, all.length); n.x = W / 2 + 150 * Math.cos(a) + 20 * rand(); n.y = H / 2 + 120 * Math.sin(a) + 20 * rand(); });
  const k = Math.sqrt(W * H / Math.max(1, all.length)) * 0.7;
  // Dense communities would collapse into a ball: attraction is shared out over the edges per node.
  const density = Math.max(1, edges.length / Math.max(1, all.length));
  for (let step = 0; step < 300; step++) {
    const temperature = 30 * (1 - step / 300) + 1;
    for (const n of all) { n.dx = 0; n.dy = 0; }
    for (let i = 0; i < all.length; i++) for (let j = i + 1; j < all.length; j++) {
      const a = all[i], b = all[j]; let dx = a.x - b.x, dy = a.y - b.y; const d = Math.max(0.01, Math.hypot(dx, dy)); const f = k * k / d;
      dx /= d; dy /= d; a.dx += dx * f; a.dy += dy * f; b.dx -= dx * f; b.dy -= dy * f;
    }
    for (const e of edges) {
      const a = all[e.s], b = all[e.t]; let dx = a.x - b.x, dy = a.y - b.y; const d = Math.max(0.01, Math.hypot(dx, dy)); const f = d * d / k / density;
      dx /= d; dy /= d; a.dx -= dx * f; a.dy -= dy * f; b.dx += dx * f; b.dy += dy * f;
    }
    for (const n of all) {
      const d = Math.max(0.01, Math.hypot(n.dx, n.dy)); const move = Math.min(d, temperature);
      n.x = Math.min(W - (n.kind === "entity" ? 110 : 200), Math.max(30, n.x + n.dx / d * move)); n.y = Math.min(H - 20, Math.max(20, n.y + n.dy / d * move));
    }
  }
  const maxDegree = Math.max(1, ...nodes.map((n) => n.degree));
  const radius = (n) => n.kind === "entity" ? 4 + 8 * Math.sqrt(n.degree / maxDegree) : 9 + Math.min(10, Math.sqrt(n.size));
  svg.innerHTML = edges.map((e) => `<line x1="${all[e.s].x.toFixed(1)}" y1="${all[e.s].y.toFixed(1)}" x2="${all[e.t].x.toFixed(1)}" y2="${all[e.t].y.toFixed(1)}"${e.neighbour ? ' class="to-neighbour"' : ` stroke-width="${Math.min(4, 0.6 + Math.log1p(e.w)).toFixed(2)}"`}/>`).join("")
    + all.map((n) => n.kind === "entity"
      ? `<circle class="node" cx="${n.x.toFixed(1)}" cy="${n.y.toFixed(1)}" r="${radius(n).toFixed(1)}" fill="${typeColour(n.type)}" data-entity="${esc(n.id)}" data-bucket="${n.b}"><title>${esc(n.title)} (${esc(n.type)}, degree ${n.degree})</title></circle><text x="${(n.x + radius(n) + 2).toFixed(1)}" y="${(n.y + 3).toFixed(1)}">${esc(n.title.slice(0, 28))}</text>`
      : `<circle class="neighbour" cx="${n.x.toFixed(1)}" cy="${n.y.toFixed(1)}" r="${radius(n).toFixed(1)}" data-community="${n.id}"><title>${esc(n.title)} (${n.links} links)</title></circle><text x="${(n.x + radius(n) + 2).toFixed(1)}" y="${(n.y + 3).toFixed(1)}">⟶ ${esc(n.title.slice(0, 26))}</text>`).join("");
}

async function showEntity(id, bucket) {
  const entities = await GR.load("entity/" + bucket);
  const e = entities[id];
  const aside = $("entity");
  if (!e) { aside.innerHTML = `<p class="muted">Entity ${esc(id)} is not in this index.</p>`; return; }
  // Opened by a link or search: show its deepest community beside it.
  const deepest = e.communities[e.communities.length - 1];
  if (deepest && state.community == null) showCommunity(deepest.id);
  aside.innerHTML = `
    <div class="type">${esc(e.type)} · degree ${e.degree}</div>
    <h2 id="entity-title">${esc(e.title)}</h2>
    <p>${esc(e.description)}</p>
    <h3>Communities</h3>${e.communities.map((c) => `<div class="community-link" data-community="${c.id}"><span class="ctitle">Level ${c.level}: community ${c.id}</span></div>`).join("") || '<p class="muted">Not clustered.</p>'}
    <h3>Relationships (${e.relationships.length})</h3>
    <table>${e.relationships.map((r) => `<tr><td><a class="entity-link" data-entity="${esc(r.id)}" data-bucket="${r.b}">${esc(r.title)}</a></td><td>${esc(r.description)}</td></tr>`).join("")}</table>
    <h3>Source text units (${e.text_units.length})</h3><div id="text-units">${e.text_units.map((u) => `<div class="unit" data-unit="${esc(u.id)}" data-unit-bucket="${u.b}">…</div>`).join("")}</div>`;
  for (const div of aside.querySelectorAll("[data-unit]")) {
    GR.load("text/" + div.dataset.unitBucket).then((units) => {
      const u = units[div.dataset.unit];
      div.innerHTML = u ? `<div class="muted">${esc(u.document)}</div>${esc(u.text)}` : "(text unit not found)";
    });
  }
}

function setupSearch() {
  const input = $("search"), list = $("search-results");
  let generation = 0;
  input.addEventListener("input", async () => {
    const query = fold(input.value), mine = ++generation;
    if (query.length < 2) { list.hidden = true; return; }
    let rows = [];
    try { rows = await GR.load("search/" + query.slice(0, 2)); } catch (err) { rows = []; }
    if (mine !== generation) return;
    const hits = rows.filter((r) => fold(r[0]).startsWith(query)).slice(0, 25);
    list.innerHTML = hits.length ? hits.map(([title, id, type, degree, bucket, leaf]) =>
      `<li data-entity="${esc(id)}" data-bucket="${bucket}" data-leaf="${leaf ?? ""}">${esc(title)} <span class="muted">${esc(type)} · degree ${degree}</span></li>`).join("")
      : `<li class="muted">No entity starts with “${esc(input.value)}”.</li>`;
    list.hidden = false;
  });
  list.addEventListener("click", (e) => {
    const li = e.target.closest("li[data-entity]");
    if (!li) return;
    list.hidden = true;
    if (li.dataset.leaf) showCommunity(Number(li.dataset.leaf));
  });
}

/*PRELOAD*/
start();
