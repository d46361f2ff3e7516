"""The tree form of the delta-rule recurrences: every draft node's output and state equal its root-to-node path's.

Oracle: the parallel form (:mod:`attnkit.functional.recurrences.local`, a triangular solve, no step-by-step
code shared with the tree walk) run over each node's path alone from the same initial state, float64.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.functional.recurrences import delta_rule, gated_delta_rule, kimi_delta_attention

B, H, DK, DV = 2, 2, 4, 3


def _inputs(nodes: int, family: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, H, nodes, DK, generator=g, dtype=torch.float64), torch.randn(
        B, H, nodes, DK, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, nodes, DV, generator=g, dtype=torch.float64)
    beta = torch.rand(B, H, nodes, generator=g, dtype=torch.float64)
    decay = {"deltanet": None, "gated": (H, 1), "kda": (H, DK)}[family]
    gate = None if decay is None else F.logsigmoid(torch.randn(B, decay[0], nodes, decay[1], generator=g,
                                                               dtype=torch.float64))
    return q, k, v, (None if gate is None else gate[..., 0] if decay[1] == 1 else gate), beta


def _run(family, q, k, v, g, beta, **options):
    if family == "deltanet":
        return delta_rule(q, k, v, beta, normalize_qk=True, **options)
    if family == "gated":
        return gated_delta_rule(q, k, v, g, beta, normalize_qk=True, **options)
    return kimi_delta_attention(q, k, v, g, beta, normalize_qk=True, **options)


def _random_parents(nodes: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = [[-1] + [int(torch.randint(-1, i, (1,), generator=g)) for i in range(1, nodes)] for _ in range(B)]
    return torch.tensor(rows)


def _path(parents: list[int], node: int) -> list[int]:
    out = [node]
    while parents[out[-1]] >= 0:
        out.append(parents[out[-1]])
    return out[::-1]


@pytest.mark.parametrize("family", ["deltanet", "gated", "kda"])
@pytest.mark.parametrize("nodes", [1, 5, 23, 64])
def test_every_tree_nodes_output_and_state_equal_its_root_to_node_path_run_alone(family, nodes):
    q, k, v, g, beta = _inputs(nodes, family, nodes)
    parents = _random_parents(nodes, nodes + 1)  # one tree per batch row
    initial = torch.randn(B, H, DK, DV, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    out, states = _run(family, q, k, v, g, beta, initial_state=initial, parents=parents)
    assert out.shape == (B, H, nodes, DV) and states.shape == (B, H, nodes, DK, DV)
    for b in range(B):
        for node in range(nodes):
            idx = torch.tensor(_path(parents[b].tolist(), node))
            pick = [None if t is None else t[b:b + 1].index_select(2, idx) for t in (q, k, v, g, beta)]
            alone, final = _run(family, *pick, initial_state=initial[b:b + 1], form="parallel")
            torch.testing.assert_close(out[b, :, node], alone[0, :, -1], rtol=0, atol=1e-12)
            torch.testing.assert_close(states[b, :, node], final[0], rtol=0, atol=1e-12)


def test_a_chain_is_the_plain_recurrence_and_one_parents_list_serves_every_batch_row():
    q, k, v, g, beta = _inputs(9, "kda", 3)
    chain = list(range(-1, 8))
    out, states = _run("kda", q, k, v, g, beta, parents=chain)
    plain, final = _run("kda", q, k, v, g, beta, form="chunk", chunk_size=4)
    torch.testing.assert_close(out, plain, rtol=0, atol=1e-12)
    torch.testing.assert_close(states[:, :, -1], final, rtol=0, atol=1e-12)


def test_bad_trees_get_attnkits_errors():
    q, k, v, g, beta = _inputs(4, "gated", 0)
    with pytest.raises(ArgumentError, match=r"parent must precede its node.*parents\[2\] = 2"):
        _run("gated", q, k, v, g, beta, parents=[-1, 0, 2, 1])
    with pytest.raises(ShapeError, match=r"parents must have shape \(4,\) or \(2, 4\).*\(3,\)"):
        _run("gated", q, k, v, g, beta, parents=[-1, 0, 1])
    with pytest.raises(DTypeError, match="integer node indices"):
        _run("gated", q, k, v, g, beta, parents=torch.tensor([-1.0, 0, 1, 2]))
    with pytest.raises(ArgumentError, match=r"parents .* and cu_seqlens .* exclude each other"):
        _run("gated", q[:1], k[:1], v[:1], g[:1], beta[:1], parents=[-1, 0, 1, 2], cu_seqlens=torch.tensor([0, 4]))
