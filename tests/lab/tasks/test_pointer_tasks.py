"""Sorting and convex hull targets, checked by independent geometry."""

import itertools

import pytest
import torch

from attnkit.errors import ShapeError
from attnkit.lab import tasks
from attnkit.lab.tasks import IGNORE_INDEX
from attnkit.lab.tasks.convex_hull import convex_hull


@pytest.mark.parametrize("point_dim", [1, 2])
def test_sorting_targets_are_the_ascending_permutation(point_dim):
    task = tasks.get("sorting", num_points=7, point_dim=point_dim)
    batch = task.sample(20, generator=torch.Generator().manual_seed(0))
    x, y = batch["inputs"], batch["targets"]
    assert x.shape == (20, 7, point_dim) and y.shape == (20, 7)
    for pts, order in zip(x.tolist(), y.tolist(), strict=True):
        assert sorted(order) == list(range(7))
        firsts = [pts[i][0] for i in order]
        assert all(a < b for a, b in itertools.pairwise(firsts))


def test_sorting_second_coordinate_is_ignored():
    task = tasks.get("sorting", num_points=6, point_dim=2)
    batch = task.sample(10, generator=torch.Generator().manual_seed(1))
    by_second = batch["inputs"][..., 1].argsort(-1)
    assert not torch.equal(by_second, batch["targets"])


def _cross(o, a, b):
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


@pytest.mark.parametrize(("points", "hull"), [
    # unit square corners with interior points and a point on an edge (collinear, not a vertex)
    ([(1, 1), (0, 0), (0.5, 0.5), (1, 0), (0, 1), (0.5, 0), (0.2, 0.7)], [0, 4, 1, 3]),
    # triangle listed clockwise; the output is counter-clockwise from index 0
    ([(0, 0), (0, 1), (1, 0)], [0, 2, 1]),
    # collinear points on every edge of a triangle
    ([(0, 0), (2, 0), (1, 0), (1, 1), (0.5, 0.5), (1.5, 0.5), (0.9, 0.2)], [0, 1, 3]),
    # a pentagon, shuffled, lowest index not the leftmost point
    ([(2, 1), (0, 1), (1, 2), (1, 0), (1, 1), (0.2, 0.3)], [0, 2, 1, 5, 3]),
    # duplicates: one vertex per distinct point, named by its lowest index
    ([(0, 0), (0, 0), (0, 0)], [0]),
    ([(1, 1), (1, 1)], [0]),
    ([(2, 2), (0, 0), (2, 2)], [0, 1]),
    ([(0, 0), (1, 0), (1, 0), (0, 1), (1, 0)], [0, 1, 3]),
    ([(0, 1), (0, 0), (1, 0), (0, 0), (1, 1), (1, 1)], [0, 1, 2, 4]),
    # all collinear (with a repeated end): the two ends
    ([(0, 0), (1, 1), (2, 2), (1, 1), (2, 2)], [0, 2]),
])
def test_convex_hull_known_configurations(points, hull):
    assert convex_hull(points) == hull
    assert convex_hull(torch.tensor(points, dtype=torch.float64)) == hull


def test_convex_hull_rejects_non_planar_points():
    with pytest.raises(ShapeError, match="points"):
        convex_hull([(0, 0, 0), (1, 0, 0), (0, 1, 0)])


def test_convex_hull_targets_are_a_convex_ccw_polygon_containing_every_point():
    task = tasks.get("convex_hull", num_points=9)
    batch = task.sample(60, generator=torch.Generator().manual_seed(0))
    x, y, sizes = batch["inputs"].double(), batch["targets"], batch["hull_sizes"]
    assert y.shape == (60, 10) and task.end_index == 9 and task.num_classes == 10
    for pts, row, k in zip(x.tolist(), y.tolist(), sizes.tolist(), strict=True):
        hull = row[:k]
        assert row[k] == 9 and all(t == IGNORE_INDEX for t in row[k + 1:])
        assert 3 <= k <= 9 and len(set(hull)) == k and hull[0] == min(hull)
        poly = [pts[i] for i in hull]
        edges = list(zip(poly, poly[1:] + poly[:1], strict=True))
        # strictly convex and counter-clockwise: every consecutive turn is a left turn
        for (a, b), (_, c) in zip(edges, edges[1:] + edges[:1], strict=True):
            assert _cross(a, b, c) > 0
        # every point lies inside or on the polygon (so no extreme point was left out)
        for p in pts:
            assert all(_cross(a, b, p) >= -1e-12 for a, b in edges)


def test_hull_sizes_vary():
    batch = tasks.get("convex_hull").sample(100, generator=torch.Generator().manual_seed(3))
    assert len(set(batch["hull_sizes"].tolist())) >= 3
