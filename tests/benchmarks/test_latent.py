"""benchmarks/latent.py: both forms decode the same token from the same prefill, timed, written as a section."""

import torch

from benchmarks import latent


def test_both_sides_decode_the_same_token_again_and_again():
    row = latent.pair(40)
    first = row.ours()
    torch.testing.assert_close(first, row.theirs(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(row.ours(), first, rtol=0, atol=0)  # the cache is rolled back: the same step


def test_the_section_is_written(tmp_path):
    doc = tmp_path / "B.md"
    doc.write_text("# B\n")
    assert latent.main(["--lengths", "32", "--rounds", "1", "--write", str(doc)]) == 0
    text = doc.read_text()
    assert "decode 1 token after L=32" in text and "MLA      multi-head-latent" in text
