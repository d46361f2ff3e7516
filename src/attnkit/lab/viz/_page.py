"""The HTML/CSS/JS of :func:`attnkit.lab.viz.html_page`, kept apart from the Python that fills it.

:data:`COLOURS` (viridis, the colour range of a map, painting one) and :func:`page_start` (the doctype, head
and heading) are shared with the overview page.
Placeholders: ``__NAV__`` (a link to the overview, or nothing), ``__TITLE__`` (HTML-escaped text) and
``__DATA__`` (JSON with ``<``, ``>``
and ``&`` written as ``\\u003c`` etc., so no label can close the script element).
Labels reach the page only through ``textContent`` and canvas ``fillText``, never
as markup. After each draw the page writes what it drew into ``#render-info``
(cells, checksum = sum of the finite weights drawn, layer, head, cell width and height in
CSS pixels), which tests read. ``DATA.scale`` (``"linear"``, ``"log"``, ``"row"``) picks the colour
scale, as :mod:`attnkit.lab.viz._scale` does for the pictures; a map's ``n`` holds its sizes before pooling.
"""

COLOURS = r"""
const ANCHORS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"];
const NAN_RGB = [200, 200, 200];
const hexRgb = (h) => [1, 3, 5].map((i) => parseInt(h.slice(i, i + 2), 16));
const LUT = Array.from({ length: 256 }, (_, n) => {  // viridis, linearly interpolated between 9 anchors
  const t = (n / 255) * (ANCHORS.length - 1), i = Math.min(Math.floor(t), ANCHORS.length - 2), f = t - i;
  const a = hexRgb(ANCHORS[i]), b = hexRgb(ANCHORS[i + 1]);
  return a.map((c, k) => Math.round(c + f * (b[k] - c)));
});
const colour = (t) => (t === null ? NAN_RGB : LUT[Math.max(0, Math.min(255, Math.round(255 * t)))]);
const DECADES = 3;  // the log scale: the largest weight down to 10^-3 of it

function scaleOf(w) {  // colour range 0 (or the minimum, if negative) .. maximum; sum and count of non-finite
  let lo = Infinity, hi = -Infinity, sum = 0, bad = 0;
  for (const x of w) {
    if (x === null) { bad++; continue; }
    lo = Math.min(lo, x); hi = Math.max(hi, x); sum += x;
  }
  lo = lo === Infinity ? 0 : Math.min(0, lo);
  return { lo, hi: hi > lo ? hi : lo + 1, sum, bad, mode: DATA.scale || "linear" };
}

function level(x, s, rowMax) {  // 0..1 along the colour map; negative maps (scores) stay linear
  if (x === null) return null;
  if (s.mode === "row" && s.lo >= 0) return rowMax > 0 ? x / rowMax : 0;
  if (s.mode === "log" && s.lo >= 0) return x > 0 ? 1 + (Math.log10(x) - Math.log10(s.hi)) / DECADES : 0;
  return (x - s.lo) / (s.hi - s.lo);
}

function paint(ctx, w, lq, lk, s, x, y, width, height) {  // one map at (x, y), a cell per weight, not smoothed
  const img = new ImageData(lk, lq);
  for (let i = 0; i < lq; i++) {
    let rowMax = 0;
    for (let j = 0; j < lk && s.mode === "row"; j++) rowMax = Math.max(rowMax, w[i * lk + j] ?? 0);
    for (let n = i * lk; n < (i + 1) * lk; n++) img.data.set([...colour(level(w[n], s, rowMax)), 255], 4 * n);
  }
  const off = document.createElement("canvas");
  off.width = lk; off.height = lq;
  off.getContext("2d").putImageData(img, 0, 0);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(off, x, y, width, height);
}
"""

HEAD = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
  body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 18px; color: #222; }
__STYLE__</style>
</head>
<body>
<h1>__TITLE__</h1>
"""
"""The pages' shared start, up to their heading: ``__STYLE__`` is each page's own CSS after the body's."""


def page_start(style: str) -> str:
    """:data:`HEAD` with a page's own CSS rules (``__TITLE__`` stays for the page to fill)."""
    return HEAD.replace("__STYLE__", style)


_VIEWER = page_start(r"""  h1 { font-size: 18px; margin: 0 0 10px; }
  .controls { display: flex; gap: 14px; align-items: center; flex-wrap: wrap; margin-bottom: 6px; }
  select { font: inherit; padding: 1px 4px; }
  #shape, #stats { color: #555; }
  #hover { min-height: 1.4em; font-variant-numeric: tabular-nums; }
  #stats { min-height: 1.4em; font-size: 13px; }
  .maps { display: flex; align-items: flex-start; gap: 12px; margin-top: 6px; }
  canvas { display: block; }
  #map { cursor: crosshair; }
  .wrap { position: relative; }
  #mark { position: absolute; display: none; outline: 2px solid #ff3b30; pointer-events: none; }
""") + r"""<div class="controls">
  <label>layer <select id="layer"></select></label>
  <label>head <select id="head"></select></label>
  <span id="shape"></span>
  __NAV__
</div>
<div id="hover">hover a cell to see its query, key and weight</div>
<div id="stats"></div>
<div class="maps">
  <div class="wrap"><canvas id="map"></canvas><div id="mark"></div></div>
  <canvas id="legend"></canvas>
</div>
<div id="render-info" hidden></div>
<script type="application/json" id="attnkit-data">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("attnkit-data").textContent);
const $ = (id) => document.getElementById(id);
__COLOURS__
const FONT = "11px system-ui, sans-serif";
const short = (t) => (t.length > 20 ? t.slice(0, 19) + "…" : t);
let view = null;

const fmt = (x) => (x === null ? "not finite" : Math.abs(x) >= 1e-3 || x === 0 ? x.toFixed(4) : x.toExponential(3));

function fillSelect(sel, labels) {
  sel.textContent = "";
  labels.forEach((text, i) => {
    const opt = document.createElement("option");
    opt.value = String(i);
    opt.textContent = text;
    sel.appendChild(opt);
  });
}

function index(text, n) {
  if (text === null || text.trim() === "") return null;
  const i = Number(text);
  return Number.isInteger(i) && i >= 0 && i < n ? i : null;
}

function fromHash() {
  const p = new URLSearchParams(location.hash.slice(1));
  const named = DATA.maps.findIndex((m) => m.name === p.get("layer"));
  const layer = named >= 0 ? named : index(p.get("layer"), DATA.maps.length) ?? 0;
  const m = DATA.maps[layer];
  return { layer, head: index(p.get("head"), m.w.length) ?? 0, q: index(p.get("q"), m.lq), k: index(p.get("k"), m.lk) };
}

function setCanvas(canvas, width, height) {
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.ceil(width * dpr);
  canvas.height = Math.ceil(height * dpr);
  canvas.style.width = width + "px";
  canvas.style.height = height + "px";
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return ctx;
}

function drawLabels(ctx, labels, cell, at, rotate) {
  const step = Math.max(1, Math.ceil(13 / cell));
  ctx.fillStyle = "#333";
  for (let i = 0; i < labels.length; i += step) {
    ctx.save();
    ctx.translate(...at(i));
    if (rotate) ctx.rotate(-Math.PI / 2);
    ctx.fillText(short(labels[i]), 0, 0);
    ctx.restore();
  }
}

function drawLegend(s, top, height) {
  const h = Math.max(60, height), ctx = setCanvas($("legend"), 80, top + h + 8);
  for (let y = 0; y < h; y++) {
    ctx.fillStyle = "rgb(" + LUT[Math.round(255 * (1 - y / (h - 1)))].join(",") + ")";
    ctx.fillRect(4, top + y, 14, 1);
  }
  ctx.font = FONT;
  ctx.fillStyle = "#333";
  ctx.textBaseline = "middle";
  const [top_, bottom, name] = s.mode === "row" && s.lo >= 0 ? ["row max", "0", "weight / row max"]
    : s.mode === "log" && s.lo >= 0 ? [fmt(s.hi), fmt(s.hi * 10 ** -DECADES), "weight (log)"]
    : [fmt(s.hi), fmt(s.lo), "weight"];
  ctx.fillText(top_, 22, top + 5);
  ctx.fillText(bottom, 22, top + h - 5);
  ctx.fillText(name, 22, top + h / 2);
}

function draw(layer, head) {
  const m = DATA.maps[layer], w = m.w[head], s = scaleOf(w);
  const fit = (n) => Math.max(1, Math.min(28, Math.floor(720 / n)));
  const strip = Math.max(m.lq, m.lk) > 4 * Math.min(m.lq, m.lk);  // a strip fills each axis on its own
  const cw = strip ? fit(m.lk) : fit(Math.max(m.lq, m.lk)), ch = strip ? fit(m.lq) : cw;
  const probe = $("map").getContext("2d");
  probe.font = FONT;
  const widest = (labels) => Math.max(...labels.map((t) => probe.measureText(short(t)).width));
  const left = 10 + widest(m.q), top = 10 + widest(m.k);
  const ctx = setCanvas($("map"), left + m.lk * cw + 8, top + m.lq * ch + 8);
  paint(ctx, w, m.lq, m.lk, s, left, top, m.lk * cw, m.lq * ch);
  ctx.font = FONT;
  ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  drawLabels(ctx, m.q, ch, (i) => [left - 4, top + (i + 0.5) * ch], false);
  ctx.textAlign = "left";
  drawLabels(ctx, m.k, cw, (j) => [left + (j + 0.5) * cw, top - 4], true);
  drawLegend(s, top, m.lq * ch);
  $("mark").style.display = "none";
  view = { m, w, left, top, cw, ch };
  const sample = m.batch > 1 ? " (sample 0 of " + m.batch + ")" : "";
  const pooled = m.n && (m.n[0] !== m.lq || m.n[1] !== m.lk)
    ? ", pooled from " + m.n[0] + " × " + m.n[1] + " positions (a cell: its queries' mean of its keys' sum)" : "";
  $("shape").textContent = m.lq + " queries (rows, down) × " + m.lk + " keys (columns, across)" + pooled + sample;
  const info = $("render-info");
  Object.assign(info.dataset, { layer: String(layer), head: String(head), cells: String(w.length),
    nonfinite: String(s.bad), checksum: s.sum.toPrecision(10), cellw: String(cw), cellh: String(ch) });
  info.textContent = "drawn " + w.length + " cells";
}

function rowStats(i) {
  const { m, w } = view, row = w.slice(i * m.lk, (i + 1) * m.lk).filter((x) => x !== null);
  const total = row.reduce((a, x) => a + x, 0);
  if (row.some((x) => x < 0) || !(total > 0)) return "row " + i + ": entropy undefined (negative or zero weights)";
  const h = -row.reduce((a, x) => (x > 0 ? a + (x / total) * Math.log(x / total) : a), 0);
  return "row " + i + ": entropy " + h.toFixed(4) + " nats (uniform over " + m.lk + " keys: " +
    Math.log(m.lk).toFixed(4) + "), row sum " + total.toFixed(4);
}

function showCell(i, j) {
  const { m, w } = view;
  if (i === null || j === null || i < 0 || j < 0 || i >= m.lq || j >= m.lk) return;
  $("hover").textContent = "query " + i + " “" + m.q[i] + "” → key " + j + " “" + m.k[j] + "”: weight " +
    fmt(w[i * m.lk + j]);
  $("stats").textContent = rowStats(i);
  const mark = $("mark"), { cw, ch } = view;
  Object.assign(mark.style, { display: "block", left: view.left + j * cw + "px", top: view.top + i * ch + "px",
    width: cw + "px", height: ch + "px" });
}

function select(layer, head, remember) {
  $("layer").value = String(layer);
  fillSelect($("head"), DATA.maps[layer].w.map((_, h) => "head " + h));
  $("head").value = String(head);
  draw(layer, head);
  if (remember) {
    try { history.replaceState(null, "", "#layer=" + layer + "&head=" + head); } catch (e) { /* file:// may refuse */ }
  }
}

fillSelect($("layer"), DATA.maps.map((m) => m.name));
$("layer").addEventListener("change", () => select(Number($("layer").value), 0, true));
$("head").addEventListener("change", () => select(Number($("layer").value), Number($("head").value), true));
$("map").addEventListener("mousemove", (ev) => {
  const r = $("map").getBoundingClientRect();
  const at = (client, origin, offset, size) => Math.floor((client - origin - offset) / size);
  showCell(at(ev.clientY, r.top, view.top, view.ch), at(ev.clientX, r.left, view.left, view.cw));
});
function fromLocation() {
  const at = fromHash();
  select(at.layer, at.head, false);
  showCell(at.q, at.k);
}
window.addEventListener("hashchange", fromLocation);
fromLocation();
</script>
</body>
</html>
"""

TEMPLATE = _VIEWER.replace("__COLOURS__", COLOURS)
