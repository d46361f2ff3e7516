"""attnkit.lab.viz maps: heatmap, head_grid, alignment, save: files, labels, drawn values, colour scales, errors."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")

from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.lab.viz import alignment, head_grid, heatmap, save

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
Q_TOKENS = ["the", "cat", "sat", "on", "mat"]  # 5 queries
K_TOKENS = ["le", "chat", "s'est", "assis", "sur", "le", "tapis"]  # 7 keys


def _weights(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(*shape, generator=g, dtype=torch.float64) * 2, -1)


def _ticks(labels):
    return [t.get_text() for t in labels]


def test_heatmap_writes_a_png_and_an_svg_chosen_by_suffix(tmp_path):
    w = _weights(5, 7)
    heatmap(w, path=tmp_path / "map.png")
    heatmap(w, path=tmp_path / "sub" / "map.SVG")  # parents created, suffix case-insensitive
    assert (tmp_path / "map.png").read_bytes()[:8] == PNG_MAGIC
    root = ET.parse(tmp_path / "sub" / "map.SVG").getroot()
    assert root.tag.endswith("svg")


def test_heatmap_carries_token_labels_on_the_right_axes_and_draws_the_weights():
    w = _weights(5, 7)
    fig = heatmap(w, q_labels=Q_TOKENS, k_labels=K_TOKENS, title="layer 0")
    ax = fig.axes[0]
    assert _ticks(ax.get_xticklabels()) == K_TOKENS
    assert _ticks(ax.get_yticklabels()) == Q_TOKENS
    assert ax.get_title() == "layer 0"
    image = ax.images[0]
    np.testing.assert_array_equal(np.asarray(image.get_array()), w.numpy())  # (Lq, Lk): queries down
    assert image.get_clim() == (0.0, pytest.approx(w.max().item()))
    assert image.get_cmap().name.startswith("viridis")
    assert len(fig.axes) == 2  # the map and its colour bar


def test_heatmap_uses_a_symmetric_diverging_scale_for_negative_scores():
    scores = torch.tensor([[-2.0, 1.0, 0.5], [0.0, 3.0, -1.0]])
    image = heatmap(scores).axes[0].images[0]
    assert image.get_clim() == (-3.0, 3.0)
    assert not image.get_cmap().name.startswith("viridis")


def test_heatmap_draws_nan_as_a_masked_cell_instead_of_failing(tmp_path):
    w = _weights(5, 7)
    w[2, 3] = float("nan")
    w[4, 0] = float("inf")
    fig = heatmap(w, path=tmp_path / "nan.png")
    array = fig.axes[0].images[0].get_array()
    assert array.mask[2, 3] and array.mask[4, 0] and array.mask.sum() == 2
    assert fig.axes[0].images[0].get_clim()[1] == pytest.approx(w[torch.isfinite(w)].max().item())


def test_heatmap_shows_dollar_signs_literally_not_as_mathtext(tmp_path):
    # Unescaped, "$\\frac{$" is broken mathtext and saving would raise.
    fig = heatmap(_weights(2, 3), q_labels=["$\\frac{$", "b"], k_labels=["$x$", "y", "z"], path=tmp_path / "m.png")
    assert _ticks(fig.axes[0].get_xticklabels())[0] == r"\$x\$"


def test_heatmap_thins_long_label_lists_but_keeps_the_first():
    tokens = [f"t{i}" for i in range(200)]
    fig = heatmap(_weights(3, 200), k_labels=tokens)
    shown = _ticks(fig.axes[0].get_xticklabels())
    assert shown[0] == "t0" and 10 < len(shown) <= 64
    assert set(shown) <= set(tokens)


def test_heatmap_accepts_numpy_and_low_precision_tensors():
    w = _weights(5, 7)
    fig = heatmap(w.numpy())
    np.testing.assert_allclose(np.asarray(fig.axes[0].images[0].get_array()), w.numpy())
    fig = heatmap(w.to(torch.bfloat16))
    np.testing.assert_allclose(np.asarray(fig.axes[0].images[0].get_array()), w.to(torch.bfloat16).double().numpy())


def test_heatmap_draws_into_a_given_axes_and_pyplot_holds_no_figure(tmp_path):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    fig = heatmap(_weights(5, 7), path=tmp_path / "a.png")
    head_grid({"l": _weights(3, 5, 7)})
    assert plt.get_fignums() == before
    ax = fig.add_axes((0.0, 0.0, 0.1, 0.1))
    assert heatmap(_weights(2, 2), ax=ax) is fig and len(ax.images) == 1


@pytest.mark.parametrize(("weights", "error", "words"), [
    (torch.rand(2, 5, 7), ShapeError, "(Lq, Lk)"),
    (torch.rand(7), ShapeError, "(Lq, Lk)"),
    (torch.rand(0, 7), ShapeError, "nothing to draw"),
    (torch.rand(5, 7, dtype=torch.complex64), DTypeError, "real"),
    ("weights", DTypeError, "tensor"),
])
def test_heatmap_rejects_bad_weights(weights, error, words):
    with pytest.raises(error) as info:
        heatmap(weights)
    assert words in str(info.value)


def test_heatmap_rejects_label_counts_and_unknown_suffixes(tmp_path):
    with pytest.raises(ShapeError, match="k_labels must have one label per position \\(7\\); got 5"):
        heatmap(_weights(5, 7), k_labels=Q_TOKENS)
    with pytest.raises(ArgumentError, match=r"\.png, \.svg"):
        heatmap(_weights(5, 7), path=tmp_path / "map.jpg")
    assert not (tmp_path / "map.jpg").exists()
    with pytest.raises(ArgumentError, match="path"):
        save(heatmap(_weights(2, 2)), tmp_path / "x.pdf")


def test_head_grid_has_one_row_per_layer_one_column_per_head_and_a_shared_scale_per_row(tmp_path):
    maps = {"layer 0": _weights(3, 5, 7, seed=1), "layer 1": _weights(2, 5, 7, seed=2) * 0.5}
    fig = head_grid(maps, path=tmp_path / "grid.png", title="heads", scale="linear")
    assert (tmp_path / "grid.png").read_bytes()[:8] == PNG_MAGIC
    heads = [ax for ax in fig.axes if ax.get_label() == "head"]
    assert len(heads) == 5
    drawn = [np.asarray(ax.images[0].get_array()) for ax in heads]
    expected = [maps["layer 0"][h].numpy() for h in range(3)] + [maps["layer 1"][h].numpy() for h in range(2)]
    for got, want in zip(drawn, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    clims = [ax.images[0].get_clim() for ax in heads]
    assert clims[0] == clims[1] == clims[2] == (0.0, pytest.approx(maps["layer 0"].max().item()))
    assert clims[3] == clims[4] == (0.0, pytest.approx(maps["layer 1"].max().item()))
    assert [ax.get_ylabel() for ax in heads if ax.get_ylabel()] == ["layer 0\nquery (5)", "layer 1\nquery (5)"]
    assert [ax.get_xlabel() for ax in heads if ax.get_xlabel()] == ["key (7)", "key (7)"]
    assert fig.get_suptitle() == "heads: 2 maps, 3 heads, 5 queries x 7 keys"  # what is drawn, and its sizes


def test_head_grid_takes_one_head_maps_sample_zero_and_max_heads():
    batch = _weights(2, 4, 5, 7)
    fig = head_grid({"one": _weights(5, 7), "batched": batch}, max_heads=2, scale="linear")
    heads = [ax for ax in fig.axes if ax.get_label() == "head"]
    assert len(heads) == 3  # 1 + min(4, 2)
    np.testing.assert_array_equal(np.asarray(heads[2].images[0].get_array()), batch[0, 1].numpy())
    assert "first 2 of 4 heads" in fig.get_suptitle()


def test_head_grid_takes_a_models_attentions_and_a_recordings_tokens():
    from attnkit.lab.analysis import recording_from_outputs

    layers = (_weights(2, 3, 5, 5, seed=3).float(), _weights(2, 3, 5, 5, seed=4).float())  # outputs.attentions
    fig = head_grid(layers, scale="linear")
    heads = [ax for ax in fig.axes if ax.get_label() == "head"]
    assert len(heads) == 6
    assert [ax.get_ylabel().split("\n")[0] for ax in heads if ax.get_ylabel()] == ["layers.0", "layers.1"]
    np.testing.assert_array_equal(np.asarray(heads[4].images[0].get_array()), layers[1][0, 1].numpy())
    assert _integers(heads[0].get_xticks()) and _integers(heads[0].get_yticks())  # no tokens: positions
    assert list(heads[1].get_xticks()) == []  # the other heads share the first one's axes
    rec = recording_from_outputs(layers, attention_mask=torch.tensor([[1] * 5, [1, 1, 1, 0, 0]]), sample=1,
                                 tokens=Q_TOKENS[:3])
    heads = [ax for ax in head_grid(rec).axes if ax.get_label() == "head"]
    assert heads[0].images[0].get_array().shape == (3, 3)  # sample 1 without its padding
    for first in (heads[0], heads[3]):  # each row's first head carries the tokens
        assert _ticks(first.get_xticklabels()) == _ticks(first.get_yticklabels()) == Q_TOKENS[:3]
    assert _ticks(heads[1].get_xticklabels()) == []
    given = [ax for ax in head_grid(rec, k_tokens=["x", "y", "z"]).axes if ax.get_label() == "head"]
    assert _ticks(given[0].get_xticklabels()) == ["x", "y", "z"]  # the caller's keys win, queries stay recorded
    assert _ticks(given[0].get_yticklabels()) == Q_TOKENS[:3]
    with pytest.raises(ShapeError, match=r"q_tokens must have one label per position \(3\); got 2"):
        head_grid(rec, q_tokens=["a", "b"])


def test_head_grid_labels_every_rows_axes_and_gives_tokens_room():
    maps = {"enc": _weights(2, 5, 5, seed=5), "cross": _weights(2, 3, 5, seed=6)}
    plain = head_grid(maps, scale="linear")
    fig = head_grid(maps, q_tokens={"enc": K_TOKENS[:5], "cross": Q_TOKENS[:3]}, k_tokens=K_TOKENS[:5], scale="linear")
    firsts = [ax for ax in fig.axes if ax.get_label() == "head" and ax.get_xlabel()]
    assert [ax.get_xlabel() for ax in firsts] == ["key (5)", "key (5)"]
    assert [ax.get_ylabel() for ax in firsts] == ["enc\nquery (5)", "cross\nquery (3)"]
    assert _ticks(firsts[1].get_yticklabels()) == Q_TOKENS[:3] and _ticks(firsts[1].get_xticklabels()) == K_TOKENS[:5]
    assert "2 maps, 2 heads, 3 queries x 5 keys, 5 queries x 5 keys" in fig.get_suptitle()
    assert fig.get_figheight() > plain.get_figheight()  # token labels get their own room
    assert sum(ax.get_ylabel() == "weight" for ax in fig.axes) == 2  # one labelled colour bar per row


def test_head_grid_rejects_bad_input():
    with pytest.raises(ArgumentError, match="non-empty mapping"):
        head_grid({})
    with pytest.raises(ShapeError, match="maps\\['x'\\]"):
        head_grid({"x": torch.rand(1, 2, 3, 4, 5)})
    with pytest.raises(ArgumentError, match="max_heads"):
        head_grid({"x": torch.rand(2, 3, 4)}, max_heads=0)


def test_alignment_puts_source_tokens_on_x_top_and_target_tokens_on_y(tmp_path):
    src, tgt = K_TOKENS, Q_TOKENS
    w = _weights(5, 7)  # (T, S)
    fig = alignment(w, src, tgt, path=tmp_path / "align.svg", title="fr-en")
    ET.parse(tmp_path / "align.svg")
    ax = fig.axes[0]
    assert _ticks(ax.get_xticklabels()) == src and _ticks(ax.get_yticklabels()) == tgt
    assert ax.xaxis.get_ticks_position() == "top"
    np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), w.numpy())


def test_alignment_rejects_token_lists_of_the_wrong_length():
    with pytest.raises(ShapeError, match=r"src_tokens .* \(7\); got 5"):
        alignment(_weights(5, 7), Q_TOKENS, Q_TOKENS)


def _integers(values) -> bool:
    return len(values) > 0 and all(float(v).is_integer() for v in values)


def test_index_axes_without_labels_have_whole_number_ticks():
    for shape in ((1, 300), (1, 1), (40, 3)):
        ax = heatmap(_weights(*shape)).axes[0]
        assert _integers(ax.get_xticks()) and _integers(ax.get_yticks()), shape


def test_labels_the_font_cannot_draw_become_code_points_without_warnings(tmp_path):
    import warnings

    import matplotlib

    labels = ["日本", "naïve", "a🙂", '"q"', "<b>", "a&b", "x"]
    with matplotlib.rc_context({"font.family": ["DejaVu Sans"]}), warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns "Glyph ... missing from font(s)" for every tofu box
        fig = heatmap(_weights(7, 7), q_labels=labels, k_labels=labels, title="日本 é", path=tmp_path / "u.png")
        heatmap(_weights(7, 7), q_labels=labels, k_labels=labels, path=tmp_path / "u.svg")
    assert _ticks(fig.axes[0].get_xticklabels()) == ["U+65E5U+672C", "naïve", "aU+1F642", '"q"', "<b>", "a&b", "x"]
    assert fig.axes[0].get_title() == "U+65E5U+672C é"
    ET.parse(tmp_path / "u.svg")  # quotes, <, & are escaped in the SVG


def test_long_titles_are_wrapped_inside_the_figure():
    title = "hierarchical-attention: Yang et al. 2016, NAACL-HLT, 'Hierarchical Attention Networks for Document " \
            "Classification', eqs. 5-10"
    for fig in (head_grid({"one head": _weights(1, 5, 7)}, title=title), heatmap(_weights(2, 3), title=title)):
        fig.canvas.draw()
        text = fig._suptitle if fig._suptitle is not None else fig.axes[0].title
        box = text.get_window_extent(fig.canvas.get_renderer())
        assert box.x0 >= 0 and box.x1 <= fig.bbox.width, (box, fig.bbox.width)
        assert text.get_text().replace("\n", " ").startswith(title)


# ------------------------------------------------------------------ colour scales, long maps
def _drawn(fig):
    heads = [ax for ax in fig.axes if ax.get_label() == "head"] or fig.axes[:1]
    return heads, [np.ma.getdata(ax.images[0].get_array()) for ax in heads]


def test_the_log_scale_spans_three_decades_below_the_largest_weight():
    w = torch.tensor([[1.0, 1e-2, 1e-5, 0.0], [0.5, 0.3, 0.2, 0.0]], dtype=torch.float64)
    for fig in (heatmap(w, scale="log"), head_grid({"m": w[None]}, scale="log")):
        (ax, *_), (data, *_) = _drawn(fig)
        norm = ax.images[0].norm
        assert type(norm).__name__ == "LogNorm" and (norm.vmin, norm.vmax) == (pytest.approx(1e-3), 1.0)
        np.testing.assert_allclose(data, w.clamp(min=1e-3).numpy())  # below the floor: the floor's colour
        assert any(ax.get_ylabel() == "weight (log)" for ax in fig.axes)


def test_the_row_scale_divides_each_query_row_by_its_largest_weight():
    w = torch.tensor([[[0.9, 0.1, 0.0], [0.2, 0.2, 0.6]], [[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]], dtype=torch.float64)
    heads, drawn = _drawn(head_grid({"m": w}, scale="row"))
    want = [[[1.0, 1 / 9, 0.0], [1 / 3, 1 / 3, 1.0]], [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]]  # a zero row stays 0
    for got, expected in zip(drawn, want, strict=True):
        np.testing.assert_allclose(got, expected)
    assert heads[0].images[0].get_clim() == (0.0, 1.0)


def test_scores_keep_the_diverging_linear_scale_whatever_the_scale_asked():
    scores = torch.tensor([[-2.0, 1.0], [0.5, 3.0]], dtype=torch.float64)
    for scale in ("log", "row"):
        ax = heatmap(scores, scale=scale).axes[0]
        assert ax.images[0].get_clim() == (-3.0, 3.0) and ax.images[0].get_cmap().name.startswith("RdBu_r")
    with pytest.raises(ArgumentError, match="scale must be one of 'linear', 'log', 'row'; got 'sqrt'"):
        heatmap(scores, scale="sqrt")
    with pytest.raises(ArgumentError, match="scale"):
        head_grid({"m": scores}, scale="Log")


def test_a_map_longer_than_its_panel_is_pooled_and_keeps_its_axes_in_positions():
    from tests.lab.viz.test_pool import pooled_by_hand

    w = _weights(2, 400, 400, seed=7)
    fig = head_grid({"long": w}, scale="linear")
    heads, drawn = _drawn(fig)
    panel_px = heads[0].get_window_extent().width * 150 / fig.dpi
    assert drawn[0].shape[0] == drawn[0].shape[1] < 400 and drawn[0].shape[0] <= 1.5 * panel_px  # about its pixels
    np.testing.assert_allclose(drawn[1], pooled_by_hand(w[1], drawn[0].shape[0]))
    np.testing.assert_allclose(drawn[0].sum(-1), 1.0)  # a pooled row sums as the rows it pools
    assert heads[0].get_xlim() == (-0.5, 399.5) and heads[0].get_ylim() == (399.5, -0.5)  # positions, not cells
    small = head_grid({"long": w}, max_size=4, scale="linear")
    np.testing.assert_allclose(_drawn(small)[1][0], pooled_by_hand(w[0], 4))
    assert _drawn(head_grid({"short": _weights(1, 5, 7)}))[1][0].shape == (5, 7)  # short maps: every position


def test_tick_labels_are_thinned_to_what_the_panel_fits():
    from attnkit.lab.viz._style import tick_budget

    tokens = [f"tok{i}" for i in range(242)]
    fig = head_grid({"layer": _weights(12, 242, 242, seed=8)}, q_tokens=tokens, k_tokens=tokens)
    first = next(ax for ax in fig.axes if ax.get_label() == "head")
    shown, ticks = _ticks(first.get_xticklabels()), list(first.get_xticks())
    panel = first.get_window_extent().width / fig.dpi
    assert 2 <= len(shown) <= tick_budget(panel, 7) < 64
    assert shown == [tokens[int(t)] for t in ticks] and shown[0] == "tok0"  # each label at its own position


def test_titles_are_cut_to_three_lines():
    title = " ".join(["a very long text that a model read"] * 40)
    fig = head_grid({"m": _weights(1, 3, 3)}, title=title)
    lines = fig.get_suptitle().split("\n")
    assert len(lines) == 3 and lines[-1].endswith("…")


def test_head_grid_draws_on_the_log_scale_by_default_as_the_command_line():
    from attnkit import cli
    from attnkit.lab.viz._scale import DEFAULT_SCALE

    maps = {"layer 0": _weights(2, 5, 7, seed=1)}
    image = next(ax for ax in head_grid(maps).axes if ax.get_label() == "head").images[0]
    assert type(image.norm).__name__ == "LogNorm" and DEFAULT_SCALE == "log"
    assert cli.build_parser().parse_args(["record", "x", "--text", "a"]).scale == DEFAULT_SCALE


def test_a_wide_grid_fills_its_page_no_empty_bands_between_rows():
    maps = {f"layers.{i}": _weights(12, 64, 64, seed=i) for i in range(6)}  # 6 layers x 12 heads, as MiniLM
    tokens = [f"t{i}" for i in range(64)]
    fig = head_grid(maps, q_tokens=tokens, k_tokens=tokens)
    heads = [ax for ax in fig.axes if ax.get_label() == "head"]
    height = fig.get_size_inches()[1] * fig.dpi
    drawn = sum(ax.get_window_extent().height for ax in heads[::12])  # one panel per row
    assert drawn > 0.6 * height, (drawn, height)  # the panels, not blank space, take the page
