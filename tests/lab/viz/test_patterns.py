"""attnkit.lab.viz mask pictures: drawn pattern = materialize, block shading = layout, large L stays bounded; CLI."""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")

from matplotlib.colors import to_rgb

from attnkit import masks
from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.lab.commands import plots
from attnkit.lab.viz import mask_density, mask_picture
from attnkit.lab.viz import patterns as pat
from attnkit.lab.viz._mask_eval import element_view

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _image(fig) -> np.ndarray:
    (image,) = [im for im in fig.axes[0].images if im.get_gid() == "mask"]
    return np.asarray(image.get_array())


def _expected_rgb(allowed: torch.Tensor, states: torch.Tensor | None, bs: int = 1) -> np.ndarray:
    """Colour of every entry written from the documented scheme, entry by entry."""
    out = np.zeros((*allowed.shape, 3))
    for i in range(allowed.shape[0]):
        for j in range(allowed.shape[1]):
            if states is None:
                colour = pat.ALLOWED if allowed[i, j] else pat.MASKED
            else:
                state = int(states[i // bs, j // bs])
                colour = (pat.ALLOWED_IN if allowed[i, j] else pat.MASKED_IN)[state]
            out[i, j] = to_rgb(colour)
    return out


def _layout_states(mask, q_len, kv_len, bs):
    layout = mask.block_layout(q_len, kv_len, bs)
    active, full = layout.active[0, 0], layout.full[0, 0]
    return torch.where(active & full, 2, torch.where(active, 1, 0)), layout


def test_small_mask_picture_draws_exactly_the_materialized_mask():
    mask = masks.causal() & masks.sliding_window(2, 1)
    fig = mask_picture(mask, 5, 7)  # bottom-right causal, 5 queries x 7 keys
    allowed = mask.materialize(5, 7)[0, 0]
    np.testing.assert_allclose(_image(fig), _expected_rgb(allowed, None))
    assert fig.axes[0].get_xlim() == (-0.5, 6.5) and fig.axes[0].get_ylim() == (4.5, -0.5)


@pytest.mark.parametrize(("expr", "q_len", "kv_len", "bs"), [
    ("causal()", 8, 12, 4),
    ("sliding_window(3, 2) | global_tokens([0])", 13, 11, 4),  # lengths not a block multiple
    ("segments([0, 0, 0, 1, 1, 1, 1, 2, 2])", 9, 9, 2),
])
def test_block_shading_matches_the_block_layout(expr, q_len, kv_len, bs):
    mask = masks.parse(expr)
    fig = mask_picture(expr, q_len, kv_len, block_size=bs)
    states, layout = _layout_states(mask, q_len, kv_len, bs)
    np.testing.assert_allclose(_image(fig), _expected_rgb(mask.materialize(q_len, kv_len)[0, 0], states, bs))
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    n_full = int((layout.active & layout.full).sum())
    n_partial = int((layout.active & ~layout.full).sum())
    n_skipped = int((~layout.active).sum())
    assert f"full block, all allowed ({n_full})" in legend
    assert f"partial block: masked ({n_partial})" in legend
    assert f"skipped block ({n_skipped})" in legend
    assert not any("layout error" in t for t in legend)
    assert f"block density {layout.density:.3f}" in fig.axes[0].get_title()


def test_a_wrong_layout_is_drawn_in_red():
    class SkipsEverything(masks.Mask):
        uses = frozenset({"q", "kv"})

        def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
            return kv_idx <= q_idx

        def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
            empty = torch.zeros(1, 1, -(-q_len // bs), -(-kv_len // bs), dtype=torch.bool)
            return empty, empty

    fig = mask_picture(SkipsEverything(), 6, block_size=3)
    red = np.all(np.isclose(_image(fig), to_rgb(pat.ALLOWED_IN[0])), axis=-1)
    assert red.sum() == 21  # every allowed entry of the lower triangle
    assert any("layout error" in t.get_text() for t in fig.axes[0].get_legend().get_texts())


def test_bool_tensor_and_expression_give_the_same_picture(tmp_path):
    allowed = masks.causal().materialize(6, 6)[0, 0]
    from_tensor = _image(mask_picture(allowed, 6, block_size=2, path=tmp_path / "t.png"))
    from_text = _image(mask_picture("causal()", 6, block_size=2, path=tmp_path / "m.svg"))
    np.testing.assert_array_equal(from_tensor, from_text)
    assert (tmp_path / "t.png").read_bytes()[:8] == PNG_MAGIC
    assert ET.parse(tmp_path / "m.svg").getroot().tag.endswith("svg")


def test_per_sample_masks_draw_sample_zero():
    fig = mask_picture(masks.padding([3, 6]), 4, 6)
    allowed = masks.padding([3, 6]).materialize(4, 6)[0, 0]
    np.testing.assert_allclose(_image(fig), _expected_rgb(allowed, None))


def test_large_masks_are_pooled_exactly_up_to_16m_entries():
    view, fq, fk = element_view(masks.causal(), 4096, 4096)
    assert (fq, fk) == (8, 8) and view.shape == (512, 512)
    assert view[10, 10].item() == pytest.approx(36 / 64)  # an 8x8 diagonal cell: lower triangle with diagonal
    assert view[10, 9].item() == 1.0 and view[9, 10].item() == 0.0
    fig = mask_picture("causal() & sliding_window(256, 0)", 4096, block_size=128)
    assert _image(fig).shape == (512, 512, 3)
    assert "8x8 entries per cell" in fig.axes[0].get_title()


def test_huge_masks_never_evaluate_more_than_16m_entries_at_once():
    calls = []

    class Recorded(masks.Mask):
        uses = frozenset({"q", "kv"})

        def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
            calls.append(torch.broadcast_shapes(q_idx.shape, kv_idx.shape).numel())
            return kv_idx <= q_idx

    view, fq, fk = element_view(Recorded(), 65536, 65536)
    assert (fq, fk) == (128, 128) and view.shape == (512, 512)
    assert sum(calls) <= 1 << 24 and max(calls) <= 1 << 21
    assert view[5, 4].item() == 1.0 and view[4, 5].item() == 0.0 and 0 < view[5, 5].item() < 1


def test_mask_density_counts_uneven_cells_by_the_entries_they_cover():
    mask = masks.causal() & masks.sliding_window(300, 0)
    exact = mask.materialize(1000, 1030)[0, 0].double().mean().item()
    assert mask_density(mask, 1000, 1030) == pytest.approx(exact, rel=1e-6)
    assert mask_density("causal()", 5, 7) == pytest.approx(masks.causal().materialize(5, 7).double().mean().item())
    layout = masks.causal().block_layout(64, 48, 16)
    assert mask_density("causal()", 64, 48, block_size=16) == pytest.approx(layout.density)


@pytest.mark.parametrize(("args", "kwargs", "error", "words"), [
    (("causal()", 0), {}, ArgumentError, "q_len"),
    (("causal()", 4, 0), {}, ArgumentError, "kv_len"),
    (("causal()", 4), {"block_size": 0}, ArgumentError, "block_size"),
    (("causal() +", 4), {}, ArgumentError, "cannot parse mask"),
    ((torch.ones(4, 4), 4), {}, DTypeError, "must be bool"),
    ((torch.ones(4, 5, dtype=torch.bool), 4, 6), {}, ShapeError, "(4, 6)"),
    ((torch.ones(1, 4, 4, dtype=torch.bool), 4), {}, ShapeError, "(q_len, kv_len)"),
    ((3, 4), {}, DTypeError, "attnkit mask"),
    ((masks.segments([0, 0, 1]), 4), {}, ArgumentError, "q_len = 3"),
    (("causal()", 4), {"path": "mask.gif"}, ArgumentError, ".png"),
])
def test_mask_picture_rejects_bad_input(args, kwargs, error, words):
    with pytest.raises(error) as info:
        mask_picture(*args, **kwargs)
    assert words in str(info.value)


def _run_cli(argv):
    parser = argparse.ArgumentParser(prog="attnkit")
    plots.add(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_plot_mask_command_writes_the_file_and_prints_the_block_density(tmp_path, capsys):
    out = tmp_path / "m.svg"
    assert _run_cli(["plot-mask", "causal()", "--q-len", "64", "--block-size", "16", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "block density: 0.6250" in printed  # 10 of 16 blocks
    assert ET.parse(out).getroot().tag.endswith("svg")


def test_plot_mask_command_defaults(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _run_cli(["plot-mask", "causal()", "--q-len", "4", "--kv-len", "6"]) == 0
    printed = capsys.readouterr().out
    assert "wrote attnkit-mask.png" in printed and "allowed fraction: 0.7500" in printed  # 18 of 24
    assert (tmp_path / "attnkit-mask.png").read_bytes()[:8] == PNG_MAGIC


def test_plot_mask_command_reports_bad_input_as_an_attnkit_error(tmp_path):
    with pytest.raises(ArgumentError, match=r"\.png"):
        _run_cli(["plot-mask", "causal()", "--q-len", "4", "--out", str(tmp_path / "m.pdf")])
    with pytest.raises(ArgumentError, match="cannot parse mask"):
        _run_cli(["plot-mask", "__import__('os')", "--q-len", "4"])


def test_mask_pictures_have_whole_index_ticks_and_keep_the_mask_shape():
    wide = mask_picture("sliding_window(2, 2)", 5, 40)
    ax = wide.axes[0]
    assert all(float(t).is_integer() for t in (*ax.get_xticks(), *ax.get_yticks()))
    assert wide.get_figheight() < 0.5 * wide.get_figwidth()  # a 5 x 40 strip is not drawn on a square page
    one = mask_picture("causal()", 1).axes[0]
    shown = [t for t in one.get_yticks() if -0.5 <= t <= 0.5] + [t for t in one.get_xticks() if -0.5 <= t <= 0.5]
    assert shown == [0, 0]
    tall = mask_picture("sliding_window(2, 2)", 40, 5, block_size=4)
    assert tall.get_figheight() > 5.0 and tall.get_figwidth() < 8.0


@pytest.mark.parametrize("mask", [
    masks.full(), masks.causal("top_left"), masks.sliding_window(2, 1), masks.dilated(2, 2), masks.strided(3),
    masks.fixed(4, 1), masks.global_tokens([0, 5]), masks.block_layout(torch.eye(3, dtype=torch.bool), 4),
    masks.segments([0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2]), masks.padding([7, 12]),
    masks.keys(torch.arange(12) % 3 != 0), masks.prefix_lm(4),
    masks.from_function(lambda b, h, q, k: (q - k).abs() % 3 == 0, "every third"),
    ~masks.causal() | masks.global_tokens([3]),
], ids=repr)
def test_every_mask_constructor_is_drawn_exactly(mask):
    allowed = mask.materialize(12, 12)[0, 0]
    np.testing.assert_allclose(_image(mask_picture(mask, 12)), _expected_rgb(allowed, None))
    states, _ = _layout_states(mask, 12, 12, 5)
    np.testing.assert_allclose(_image(mask_picture(mask, 12, block_size=5)), _expected_rgb(allowed, states, 5))


def test_plot_mask_command_reports_an_unwritable_output_and_sampled_fractions(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for out in (blocker / "m.png", blocker / "sub" / "m.png"):
        with pytest.raises(ArgumentError, match=r"cannot write --out .*a-file"):
            _run_cli(["plot-mask", "causal()", "--q-len", "4", "--out", str(out)])
    assert _run_cli(["plot-mask", "causal()", "--q-len", "8192", "--out", str(tmp_path / "big.png")]) == 0
    assert "estimated from 16 samples per drawn cell" in capsys.readouterr().out
