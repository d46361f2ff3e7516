"""The state-passing scan and the affine map of a run of blocks."""

import torch
import torch.nn.functional as F

from attnkit.functional.recurrences.forms import pass_states
from attnkit.functional.recurrences.local import local_terms
from attnkit.functional.recurrences.scan import apply_map, span_map


def _blocks(delta: bool, channel: bool, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    q, k, v = r(2, 3, 4, 5, 6), r(2, 3, 4, 5, 6), r(2, 3, 4, 5, 7)  # (b, h, blocks, c, d)
    gates = F.logsigmoid(r(2, 3, 4, 5, 6 if channel else 1))
    beta = torch.sigmoid(r(2, 3, 4, 5)) if delta else None
    return local_terms(q, k, v, gates, beta)


def test_the_span_map_is_the_scan_for_any_entering_state():
    for delta in (False, True):
        for channel in (False, True):
            blocks = _blocks(delta, channel)
            m, n = span_map(blocks)
            assert m.shape == (2, 3, 6, 6) and n.shape == (2, 3, 6, 7)
            for seed in (1, 2):
                s0 = torch.randn(2, 3, 6, 7, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
                torch.testing.assert_close(apply_map(m, n, s0), pass_states(s0, blocks)[2], rtol=0, atol=1e-12)


def test_without_the_delta_rule_the_map_is_diagonal():
    m, _ = span_map(_blocks(False, True))
    torch.testing.assert_close(m, torch.diag_embed(m.diagonal(dim1=-2, dim2=-1)), rtol=0, atol=0)
