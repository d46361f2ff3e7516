"""comm.py: byte tallies nest and count per kind; a missing process group is a clear error."""

from __future__ import annotations

import pytest
import torch.distributed as dist

import attnkit
from attnkit.distributed import comm


def test_tallies_nest_and_count_per_kind():
    with comm.count_bytes() as outer:
        comm._record("send", 10)
        with comm.count_bytes() as inner:
            comm._record("all_to_all", 5)
    comm._record("send", 99)  # outside every tally: counted nowhere
    assert dict(outer.by_kind) == {"send": 10, "all_to_all": 5} and outer.total == 15
    assert inner.total == 5


@pytest.mark.skipif(dist.is_initialized(), reason="needs a process without a process group")
def test_no_process_group_is_a_clear_error():
    with pytest.raises(attnkit.ArgumentError, match="init_process_group"):
        comm.Comm()
