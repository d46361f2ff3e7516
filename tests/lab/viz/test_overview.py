"""attnkit.lab.viz.overview_page: every head of every map on one offline page, each linking to the one-head viewer."""

from __future__ import annotations

import re
from urllib.parse import urljoin, urlsplit

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab.analysis import recording_from_outputs
from attnkit.lab.viz import html_page, overview_page
from tests.lab.viz.test_html import EVIL, _chromium, _data, _Dom, needs_chromium


def _maps():
    g = torch.Generator().manual_seed(1)
    return {"layers.0": torch.softmax(torch.randn(1, 3, 5, 5, generator=g), -1),  # (B, H, Lq, Lk): sample 0
            "cross.layers.0": torch.softmax(torch.randn(2, 5, 7, generator=g), -1)}


def _pages(tmp_path):
    maps = _maps()
    viewer = html_page(maps, path=tmp_path / "maps.html", overview="heads.html")
    heads = overview_page(maps, viewer="maps.html", path=tmp_path / "heads.html", title=f"heads {EVIL}")
    return maps, viewer, heads


def test_overview_is_self_contained_and_holds_every_head(tmp_path):
    maps, viewer, heads = _pages(tmp_path)
    page = heads.read_text(encoding="utf-8")
    assert not re.search(r"https?:|<link|\bsrc=|@import|url\(", page) and EVIL not in page
    data = _data(page)
    assert [(m["name"], len(m["w"]), m["lq"], m["lk"]) for m in data["maps"]] == [("layers.0", 3, 5, 5),
                                                                                  ("cross.layers.0", 2, 5, 7)]
    torch.testing.assert_close(torch.tensor(data["maps"][1]["w"][1]).view(5, 7), maps["cross.layers.0"][1],
                               rtol=5e-4, atol=0)
    assert 'id="viewer" href="maps.html"' in page
    # the viewer links back to the overview
    assert _Dom(viewer.read_text(encoding="utf-8")).attrs["overview"]["href"] == "heads.html"
    assert "overview" not in _Dom(html_page(maps, path=tmp_path / "alone.html").read_text()).attrs


def test_overview_takes_recordings_and_model_outputs(tmp_path):
    w = torch.softmax(torch.randn(2, 3, 4, 4), -1)
    rec = recording_from_outputs((w, w), attention_mask=torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]), sample=1)
    data = _data(overview_page(rec, viewer="v.html", path=tmp_path / "a.html").read_text())
    assert [(m["name"], m["lq"], m["lk"]) for m in data["maps"]] == [("layers.0", 2, 2), ("layers.1", 2, 2)]
    data = _data(overview_page({"attentions": (w,)}, viewer="v.html", path=tmp_path / "b.html").read_text())
    assert [(m["name"], len(m["w"]), m["lq"]) for m in data["maps"]] == [("layers.0", 3, 4)]


def test_bad_input(tmp_path):
    with pytest.raises(ArgumentError, match=r"\.html"):
        overview_page(_maps(), viewer="maps.html", path=tmp_path / "heads.png")
    with pytest.raises(ArgumentError, match="overview_page: the maps hold 145 weights"):  # 75 + 70
        overview_page(_maps(), viewer="maps.html", path=tmp_path / "heads.html", max_weights=144)
    with pytest.raises(TypeError):
        overview_page(_maps(), path=tmp_path / "heads.html")  # viewer is required


@needs_chromium
def test_browser_draws_every_head_as_a_link_to_the_viewer(tmp_path):
    maps, _, heads = _pages(tmp_path)
    dom = _Dom(_chromium(tmp_path, heads.as_uri(), "--dump-dom"))
    info = dom.attrs["render-info"]
    assert (info["data-maps"], info["data-thumbnails"], info["data-nonfinite"]) == ("2", "5", "0")
    total = maps["layers.0"][0].sum() + maps["cross.layers.0"].sum()
    assert float(info["data-checksum"]) == pytest.approx(total.item(), rel=1e-3)
    links = [a for a in dom.links if a.get("class") == "thumb"]
    assert [(a["data-layer"], a["data-head"]) for a in links] == [("0", "0"), ("0", "1"), ("0", "2"), ("1", "0"),
                                                                  ("1", "1")]
    assert dom.text["h1"] == f"heads {EVIL}"
    # every link opens the viewer on that map and head
    for a in (links[2], links[4]):
        url = urljoin(heads.as_uri(), a["href"])
        target = urlsplit(url)
        assert target.path.endswith("/maps.html")
        assert target.fragment == f"layer={a['data-layer']}&head={a['data-head']}"
        shown = _Dom(_chromium(tmp_path, url, "--dump-dom")).attrs["render-info"]
        assert (shown["data-layer"], shown["data-head"]) == (a["data-layer"], a["data-head"])
        name, head = list(maps)[int(a["data-layer"])], int(a["data-head"])
        w = maps[name][0, head] if maps[name].dim() == 4 else maps[name][head]
        assert float(shown["data-checksum"]) == pytest.approx(w.sum().item(), rel=1e-3)


def test_long_maps_are_pooled_to_their_thumbnails(tmp_path):
    from attnkit.lab.viz.overview import THUMBNAIL

    g = torch.Generator().manual_seed(2)
    maps = {f"layers.{i}": torch.softmax(torch.randn(4, 300, 300, generator=g), -1) for i in range(3)}
    page = overview_page(maps, viewer="v.html", path=tmp_path / "heads.html", scale="log").read_text()
    data = _data(page)
    assert data["scale"] == "log" and "logarithmically" in page
    assert all((m["lq"], m["lk"], m["n"]) == (THUMBNAIL, THUMBNAIL, [300, 300]) for m in data["maps"])
    rows = torch.tensor(data["maps"][2]["w"][3]).view(THUMBNAIL, THUMBNAIL).sum(-1)
    torch.testing.assert_close(rows, torch.ones(THUMBNAIL), rtol=0, atol=2e-3)  # pooled rows keep their sums
    small = _data(overview_page(maps, viewer="v.html", path=tmp_path / "s.html", max_size=20).read_text())
    assert {(m["lq"], m["lk"]) for m in small["maps"]} == {(20, 20)}
    short = _data(overview_page(_maps(), viewer="v.html", path=tmp_path / "short.html").read_text())
    assert [(m["lq"], m["lk"]) for m in short["maps"]] == [(5, 5), (5, 7)]  # shorter than a thumbnail: as they are
