"""attnkit.lab.viz.html_page: one self-contained, escaped page; rendered and checked in headless chromium."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

from attnkit.errors import ArgumentError, ShapeError
from attnkit.lab.viz import html_page
from attnkit.lab.viz.html import MAX_WEIGHTS, fit_maps

CHROMIUM = Path("/usr/bin/chromium")
EVIL = "<script>alert(1)</script>"
Q_TOKENS = ["the", EVIL, "sat", "<b>on</b>", "mat"]  # 5 queries
K_TOKENS = ["le", "chat", "s'est", "assis", "sur", "&amp;", "tapis"]  # 7 keys


def _maps():
    g = torch.Generator().manual_seed(0)
    return {
        "enc.layer0": torch.softmax(torch.randn(3, 5, 7, generator=g), -1),
        "enc.layer1": torch.softmax(4 * torch.randn(2, 3, 5, 7, generator=g), -1),  # (B, H, Lq, Lk): sample 0
    }


def _data(page: str) -> dict:
    text = re.search(r'<script type="application/json" id="attnkit-data">(.*?)</script>', page, re.S).group(1)
    return json.loads(text)


class _Dom(HTMLParser):
    """Attributes and text of elements by id, every tag seen, and the attributes of every link."""

    def __init__(self, text: str):
        super().__init__()
        self.attrs, self.text, self.tags, self.links, self._open = {}, {}, [], [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attrs = dict(attrs)
        if tag == "a":
            self.links.append(attrs)
        if "id" in attrs:
            self.attrs[attrs["id"]] = attrs
        self._open.append(attrs.get("id") or tag)

    def handle_endtag(self, tag):
        if self._open:
            self._open.pop()

    def handle_data(self, data):
        if self._open:
            self.text[self._open[-1]] = self.text.get(self._open[-1], "") + data


def _page(tmp_path) -> Path:
    return html_page(_maps(), q_tokens=Q_TOKENS, k_tokens=K_TOKENS, title=f"maps </title>{EVIL}",
                     path=tmp_path / "maps.html")


def test_page_is_self_contained_and_holds_the_rounded_weights(tmp_path):
    path = _page(tmp_path)
    assert isinstance(path, Path) and path.exists()
    page = path.read_text(encoding="utf-8")
    assert not re.search(r"https?:|<link|\bsrc=|@import|url\(", page)  # nothing fetched from anywhere
    data = _data(page)
    assert [m["name"] for m in data["maps"]] == ["enc.layer0", "enc.layer1"]
    first, second = data["maps"]
    assert (first["lq"], first["lk"], len(first["w"]), second["batch"], len(second["w"])) == (5, 7, 3, 2, 3)
    assert first["q"] == Q_TOKENS and first["k"] == K_TOKENS  # exact text after JSON decoding
    maps = _maps()
    torch.testing.assert_close(torch.tensor(first["w"][2]).view(5, 7), maps["enc.layer0"][2], rtol=5e-4, atol=0)
    torch.testing.assert_close(torch.tensor(second["w"][1]).view(5, 7), maps["enc.layer1"][0, 1], rtol=5e-4, atol=0)


def test_labels_and_title_are_escaped(tmp_path):
    page = _page(tmp_path).read_text(encoding="utf-8")
    assert EVIL not in page and "<b>on" not in page and "</title><script>" not in page
    assert page.count("<script") == 2  # the data block and the page's own code
    assert "<title>maps &lt;/title&gt;&lt;script&gt;alert(1)&lt;/script&gt;</title>" in page


def test_nan_becomes_null_and_defaults_label_positions(tmp_path):
    w = torch.rand(4, 6)
    w[1, 2] = float("nan")
    data = _data(html_page({"one head": w}, path=tmp_path / "p.htm").read_text())
    (m,) = data["maps"]
    assert m["w"][0][1 * 6 + 2] is None and sum(x is None for x in m["w"][0]) == 1
    assert m["q"] == ["0", "1", "2", "3"] and m["k"] == [str(i) for i in range(6)]


def test_tokens_per_map_name(tmp_path):
    maps = {"self": torch.rand(1, 3, 3), "cross": torch.rand(1, 3, 4)}
    path = html_page(maps, q_tokens=["a", "b", "c"], k_tokens={"cross": ["w", "x", "y", "z"]}, path=tmp_path / "p.html")
    m_self, m_cross = _data(path.read_text())["maps"]
    assert m_self["k"] == ["0", "1", "2"] and m_cross["k"] == ["w", "x", "y", "z"]


def test_a_recording_labels_its_maps_and_a_models_attentions_are_maps(tmp_path):
    from attnkit.lab.analysis import recording_from_outputs

    w = torch.softmax(torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(2)), -1)
    out = {"attentions": (w, w.flip(-1)), "last_hidden_state": torch.zeros(2, 4, 8)}
    rec = recording_from_outputs(out, attention_mask=torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]]), sample=1,
                                 tokens=["<pad>", "a", EVIL, "c"])
    first, second = _data(html_page(rec, path=tmp_path / "rec.html").read_text())["maps"]
    assert (first["name"], second["name"], first["lq"]) == ("layers.0", "layers.1", 3)
    assert first["q"] == first["k"] == ["a", EVIL, "c"]
    torch.testing.assert_close(torch.tensor(second["w"][2]).view(3, 3), w.flip(-1)[1, 2, 1:, 1:], rtol=5e-4, atol=0)
    given = _data(html_page(rec, q_tokens=["x", "y", "z"], path=tmp_path / "given.html").read_text())["maps"][0]
    assert given["q"] == ["x", "y", "z"] and given["k"] == ["a", EVIL, "c"]  # the caller's labels win
    whole = _data(html_page(out, path=tmp_path / "out.html").read_text())["maps"]  # a model output: sample 0
    assert [(m["name"], m["lq"], m["batch"]) for m in whole] == [("layers.0", 4, 1), ("layers.1", 4, 1)]
    torch.testing.assert_close(torch.tensor(whole[0]["w"][1]).view(4, 4), w[0, 1], rtol=5e-4, atol=0)


def test_html_page_rejects_bad_input(tmp_path):
    with pytest.raises(ArgumentError, match=r"\.html"):
        html_page(_maps(), path=tmp_path / "maps.png")
    with pytest.raises(ShapeError, match=r"q_tokens has 2 tokens but maps\['enc.layer0'\] has 5"):
        html_page(_maps(), q_tokens=["a", "b"], path=tmp_path / "maps.html")
    with pytest.raises(ShapeError, match=r"\(Lq, Lk\), \(H, Lq, Lk\) or \(B, H, Lq, Lk\)"):
        html_page({"x": torch.rand(1, 1, 1, 2, 2)}, path=tmp_path / "maps.html")
    with pytest.raises(ArgumentError, match="non-empty mapping"):
        html_page({}, path=tmp_path / "maps.html")
    with pytest.raises(TypeError):
        html_page(_maps())  # path is required
    with pytest.raises(ArgumentError, match="max_weights"):
        html_page(_maps(), path=tmp_path / "maps.html", max_weights=0)


def test_huge_maps_are_refused_before_anything_is_copied_or_written(tmp_path):
    # 64 heads of 4096 x 4096 (a 10 GB page): an expanded view, so nothing is materialised unless the code copies it.
    huge = torch.full((1, 1, 1), 1 / 4096).expand(64, 4096, 4096)
    with pytest.raises(ArgumentError) as info:  # max_size=None: every position asked for
        html_page({"layer 0": huge}, path=tmp_path / "huge.html", max_size=None)
    message = str(info.value)
    assert "1,073,741,824 weights" in message and "(64, 4096, 4096)" in message and "max_weights=4,000,000" in message
    assert "fit_maps finds the largest" in message and "fit_size" not in message  # a public name only
    assert not (tmp_path / "huge.html").exists()
    small = {"a": torch.rand(3, 5, 7), "b": torch.rand(2, 4, 5, 7)}  # 105 + 140 (sample 0 of b) = 245 weights
    with pytest.raises(ArgumentError, match="245 weights"):
        html_page(small, path=tmp_path / "small.html", max_weights=244, max_size=None)
    assert not (tmp_path / "small.html").exists()
    assert html_page(small, path=tmp_path / "small.html", max_weights=245).exists()  # the batch is not counted


def test_maps_past_the_limit_are_pooled_by_default_as_the_command_line_pools_them(tmp_path):
    maps = {f"layers.{i}": torch.softmax(torch.randn(12, 512, 512), -1) for i in range(2)}  # 6.3M weights
    page = html_page(maps, path=tmp_path / "maps.html").read_text()
    size = fit_maps(maps, MAX_WEIGHTS, "test")
    assert size is not None and size < 512
    data = _data(page)
    assert all((m["lq"], m["lk"], m["n"]) == (size, size, [512, 512]) for m in data["maps"])
    assert data["scale"] == "log"  # the command line's default colours
    every = {"a": torch.rand(2, 5, 7)}  # fits: every position, no pooling
    assert _data(html_page(every, path=tmp_path / "small.html").read_text())["maps"][0]["lq"] == 5


# ------------------------------------------------------------------ in a real browser
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is not installed")


def _chromium(tmp_path, url: str, *extra: str) -> str:
    cmd = [str(CHROMIUM), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
           f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars", *extra, url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _row_entropy(row: list[float]) -> float:
    total = sum(row)
    return -sum(x / total * math.log(x / total) for x in row if x > 0)


@needs_chromium
def test_browser_draws_the_selected_map(tmp_path):
    path, maps = _page(tmp_path), _maps()
    data = _data(path.read_text())
    default = _Dom(_chromium(tmp_path, path.as_uri(), "--dump-dom"))
    info = default.attrs["render-info"]
    assert (info["data-layer"], info["data-head"], info["data-cells"], info["data-nonfinite"]) == ("0", "0", "35", "0")
    assert float(info["data-checksum"]) == pytest.approx(maps["enc.layer0"][0].sum().item(), rel=1e-3)
    assert default.text["h1"] == f"maps </title>{EVIL}"  # the title is shown as text
    assert default.tags.count("script") == 2 and "b" not in default.tags  # no label became markup
    # A URL hash picks layer 1, head 2 and pins the cell (query 1, key 4): what is drawn changes.
    picked = _Dom(_chromium(tmp_path, path.as_uri() + "#layer=1&head=2&q=1&k=4", "--dump-dom"))
    info = picked.attrs["render-info"]
    assert (info["data-layer"], info["data-head"], info["data-cells"]) == ("1", "2", "35")
    assert float(info["data-checksum"]) == pytest.approx(maps["enc.layer1"][0, 2].sum().item(), rel=1e-3)
    assert float(info["data-checksum"]) != float(default.attrs["render-info"]["data-checksum"])
    assert picked.text["hover"].startswith(f"query 1 “{EVIL}” → key 4 “sur”: weight ")
    row = data["maps"][1]["w"][2][7:14]
    entropy = float(re.search(r"entropy ([0-9.]+) nats", picked.text["stats"]).group(1))
    assert entropy == pytest.approx(_row_entropy(row), abs=2e-4)


@needs_chromium
def test_browser_screenshot_is_not_blank(tmp_path):
    image_mod = pytest.importorskip("matplotlib.image")
    path = _page(tmp_path)
    shot = tmp_path / "shot.png"
    _chromium(tmp_path, path.as_uri() + "#layer=enc.layer1&head=1", f"--screenshot={shot}", "--window-size=800,500")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = image_mod.imread(shot)[..., :3]
    assert pixels.var() > 0
    # The largest weight is drawn in viridis' last colour (253, 231, 37).
    yellow = (abs(pixels * 255 - torch.tensor([253, 231, 37]).numpy()) < 4).all(-1)
    assert yellow.sum() >= 100  # at least one whole cell (28 x 28 px for a 5 x 7 map)


@needs_chromium
@pytest.mark.parametrize(("shape", "cells"), [((1, 200), (3, 28)), ((60, 3), (28, 12)), ((1, 1), (28, 28)),
                                              ((30, 40), (18, 18))])
def test_browser_gives_strips_readable_rows(tmp_path, shape, cells):
    """A one-query map over 200 keys is drawn 28 px tall, not as a 3 px line; square-ish maps keep square cells."""
    w = torch.softmax(torch.randn(*shape, generator=torch.Generator().manual_seed(0)), -1)
    path = html_page({"map": w}, path=tmp_path / "strip.html")
    info = _Dom(_chromium(tmp_path, path.as_uri() + "#q=0&k=0", "--dump-dom")).attrs["render-info"]
    assert (int(info["data-cellw"]), int(info["data-cellh"])) == cells
    assert info["data-cells"] == str(w.numel())
    assert float(info["data-checksum"]) == pytest.approx(w.sum().item(), rel=1e-3)


# ------------------------------------------------------------------ long maps and colour scales
def test_pooled_maps_fit_the_budget_keep_row_sums_and_label_groups(tmp_path):
    from attnkit.lab.viz import fit_maps
    from tests.lab.viz.test_pool import pooled_by_hand

    g = torch.Generator().manual_seed(3)
    maps = {f"layers.{i}": torch.softmax(torch.randn(3, 30, 30, generator=g), -1) for i in range(2)}
    tokens = [f"t{i}" for i in range(30)]
    with pytest.raises(ArgumentError, match=r"5,400 weights .* max_weights=2,000\. Pass fewer layers or heads, pool"):
        html_page(maps, q_tokens=tokens, k_tokens=tokens, path=tmp_path / "p.html", max_weights=2000, max_size=None)
    size = fit_maps(maps, 2000, "test")
    assert size == 18 and 6 * 18 * 18 <= 2000 < 6 * 19 * 19
    data = _data(html_page(maps, q_tokens=tokens, k_tokens=tokens, path=tmp_path / "p.html", max_weights=2000,
                           max_size=size).read_text())
    first = data["maps"][0]
    assert (first["lq"], first["lk"], first["n"]) == (18, 18, [30, 30])
    assert first["q"][:3] == ["t0…t1", "t2", "t3…t4"] and first["k"][-1] == "t28…t29"
    torch.testing.assert_close(torch.tensor(first["w"][1], dtype=torch.float64).view(18, 18),
                               pooled_by_hand(maps["layers.0"][1], 18),
                               rtol=5e-4, atol=1e-6)
    assert fit_maps(maps, 5400, "test") is None


def test_the_page_carries_its_colour_scale(tmp_path):
    for scale in ("linear", "log", "row"):
        assert _data(html_page(_maps(), path=tmp_path / "p.html", scale=scale).read_text())["scale"] == scale
    with pytest.raises(ArgumentError, match="html_page: scale must be one of"):
        html_page(_maps(), path=tmp_path / "p.html", scale="sqrt")
    with pytest.raises(ArgumentError, match="html_page: max_size must be an int >= 1"):
        html_page(_maps(), path=tmp_path / "p.html", max_size=0)


NODE = shutil.which("node")
PAINTER = Path(__file__).with_name("paint_in_node.js")
VIRIDIS_FIRST, VIRIDIS_LAST = [68, 1, 84], [253, 231, 37]


def paint(page: Path, hash_: str = "") -> dict:
    """What the page's own script paints, run in node with a stand-in DOM (tests/lab/viz/paint_in_node.js)."""
    done = subprocess.run([NODE, str(PAINTER), str(page), hash_], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_the_page_paints_log_and_row_scales(tmp_path):
    w = torch.tensor([[1.0, 1e-3, 1e-2, 1e-5], [0.5, 0.25, 0.25, 0.0]])
    cells = {scale: paint(html_page({"m": w}, path=tmp_path / f"{scale}.html", scale=scale))["cells"][0]
             for scale in ("linear", "log", "row")}
    assert cells["linear"][0] == cells["log"][0] == cells["row"][0] == VIRIDIS_LAST  # the largest weight
    assert cells["log"][1] == cells["log"][3] == VIRIDIS_FIRST  # 10^-3 of the largest, and below it
    near = lambda a, b: max(abs(x - y) for x, y in zip(a, b, strict=True)) <= 6
    assert near(cells["linear"][2], VIRIDIS_FIRST) and not near(cells["log"][2], VIRIDIS_FIRST)  # 0.01: dark on
    # a linear scale, a third of the way up on the log one
    assert cells["row"][4] == VIRIDIS_LAST and cells["row"][5] == cells["row"][6] != VIRIDIS_FIRST  # row 1: 0.25/0.5
    scores = torch.tensor([[-1.0, 1.0]])
    assert paint(html_page({"s": scores}, path=tmp_path / "s.html", scale="log"))["cells"][0] == [VIRIDIS_FIRST,
                                                                                                  VIRIDIS_LAST]


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_the_viewer_says_a_map_is_pooled_and_draws_every_cell(tmp_path):
    w = torch.softmax(torch.randn(2, 40, 40, generator=torch.Generator().manual_seed(4)), -1)
    shown = paint(html_page({"m": w}, path=tmp_path / "p.html", max_size=10), "#layer=0&head=1")
    assert shown["info"]["cells"] == "100" and float(shown["info"]["checksum"]) == pytest.approx(10, rel=1e-3)
    assert shown["shape"].startswith("10 queries (rows, down) × 10 keys (columns, across), pooled from 40 × 40")
