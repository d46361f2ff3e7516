"""The HTML/CSS/JS of :func:`attnkit.lab.viz.overview_page`, kept apart from the Python that fills it.

Placeholders: ``__TITLE__`` (HTML-escaped text), ``__VIEWER__`` (the viewer's address, escaped for an
attribute), ``__SCALE__`` (the colour scale in words) and ``__DATA__`` (the same JSON as the viewer's page,
``<``, ``>`` and ``&`` escaped). Every
thumbnail is a link ``VIEWER#layer=i&head=h``, built with DOM properties, never as markup. After drawing,
the page writes into ``#render-info`` how many maps and thumbnails it drew and the sum of the finite
weights drawn (``checksum``), which tests read.
"""

from ._page import COLOURS, page_start

_OVERVIEW = page_start(r"""  h1 { font-size: 18px; margin: 0 0 6px; }
  .note { color: #555; margin: 0 0 10px; }
  table { border-collapse: collapse; }
  th { font-weight: normal; font-size: 12px; color: #444; padding: 2px 6px; }
  th.map { text-align: right; max-width: 220px; overflow-wrap: anywhere; }
  td { padding: 3px; vertical-align: middle; }
  a.thumb { display: inline-block; line-height: 0; outline: 1px solid #ddd; }
  a.thumb:hover, a.thumb:focus { outline: 2px solid #ff3b30; }
  canvas { display: block; }
""") + r"""<p class="note">Every head of every map: one row per map, sharing one colour scale (viridis, __SCALE__; grey:
not finite); in each map queries run down and keys across, long maps pooled to their thumbnail's size, and a
map's sizes show when the pointer rests on it. Click a map to open it in <a id="viewer" href="__VIEWER__">the
one-head viewer</a>.</p>
<table id="grid"></table>
<div id="render-info" hidden></div>
<script type="application/json" id="attnkit-data">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("attnkit-data").textContent);
__COLOURS__
const VIEWER = document.getElementById("viewer").getAttribute("href");
const SIZE = 96;  // the longer side of a thumbnail, CSS pixels

function cell(tag, text, cls) {
  const el = document.createElement(tag);
  if (text !== undefined) el.textContent = text;
  if (cls) el.className = cls;
  return el;
}

function thumbnail(m, h, layer, s) {
  const long = Math.max(m.lq, m.lk), width = Math.max(2, Math.round(SIZE * m.lk / long));
  const height = Math.max(2, Math.round(SIZE * m.lq / long)), canvas = document.createElement("canvas");
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.ceil(width * dpr); canvas.height = Math.ceil(height * dpr);
  canvas.style.width = width + "px"; canvas.style.height = height + "px";
  paint(canvas.getContext("2d"), m.w[h], m.lq, m.lk, s, 0, 0, canvas.width, canvas.height);
  const link = cell("a", undefined, "thumb");
  link.href = VIEWER + "#layer=" + layer + "&head=" + h;
  const [lq, lk] = m.n || [m.lq, m.lk];
  link.title = m.name + ", head " + h + " (" + lq + " queries × " + lk + " keys)";
  link.dataset.layer = String(layer);
  link.dataset.head = String(h);
  link.appendChild(canvas);
  return link;
}

function build() {
  const grid = document.getElementById("grid"), heads = Math.max(...DATA.maps.map((m) => m.w.length));
  const top = cell("tr");
  top.appendChild(cell("th"));
  for (let h = 0; h < heads; h++) top.appendChild(cell("th", "head " + h));
  grid.appendChild(top);
  let drawn = 0, sum = 0, bad = 0;
  DATA.maps.forEach((m, layer) => {
    const scales = m.w.map(scaleOf);
    const s = { lo: Math.min(...scales.map((x) => x.lo)), hi: Math.max(...scales.map((x) => x.hi)),
      mode: DATA.scale || "linear" };
    const row = cell("tr");
    row.appendChild(cell("th", m.name, "map"));
    m.w.forEach((_, h) => {
      const td = cell("td");
      td.appendChild(thumbnail(m, h, layer, s));
      row.appendChild(td);
      drawn++; sum += scales[h].sum; bad += scales[h].bad;
    });
    grid.appendChild(row);
  });
  const info = document.getElementById("render-info");
  Object.assign(info.dataset, { maps: String(DATA.maps.length), thumbnails: String(drawn),
    checksum: sum.toPrecision(10), nonfinite: String(bad) });
  info.textContent = "drawn " + drawn + " maps";
}

build();
</script>
</body>
</html>
"""

TEMPLATE = _OVERVIEW.replace("__COLOURS__", COLOURS)
