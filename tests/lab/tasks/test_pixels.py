"""Side and length of a pixel-sequence task."""

import pytest

from attnkit.errors import ArgumentError
from attnkit.lab.tasks.pixels import resolve_side


def test_either_size_gives_the_other():
    assert resolve_side("T", None, None) == (1024, 32)
    assert resolve_side("T", 400, None) == (400, 20) and resolve_side("T", None, 20) == (400, 20)
    assert resolve_side("T", 400, 20) == (400, 20)


@pytest.mark.parametrize(("length", "side", "arg"), [(399, None, "length"), (400, 21, "length"), (None, 3, "side"),
                                                      (9, None, "length")])
def test_bad_sizes(length, side, arg):
    with pytest.raises(ArgumentError, match=rf"T: {arg} must"):
        resolve_side("T", length, side)
