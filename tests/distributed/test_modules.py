"""SequenceParallelSelfAttention in TransformerLM: the losses and gradients of one process, also under DDP and FSDP2.

Each rank runs the language model on its shard of the tokens with the attention factory; the
sum of the ranks' losses and the parameter gradients summed over ranks equal the one-process
model's (float64, 1e-10). Under DistributedDataParallel (which averages gradients) and
FSDP2's ``fully_shard`` (which shards the parameters and reduce-scatters averaged gradients) on
gloo, one SGD step gives the one-process step's parameters.
"""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import attnkit
from attnkit.distributed import shard
from attnkit.distributed.modules import SequenceParallelSelfAttention
from attnkit.models import TransformerLM

from . import cases, spawn

VOCAB, LENGTH, WORLD, TOL = 11, 24, 4, 1e-10


def _models(factory):
    torch.manual_seed(0)
    one = TransformerLM(VOCAB, dim=16, num_heads=4, num_layers=2, positional=None, dropout=0.0).double()
    many = TransformerLM(VOCAB, dim=16, num_heads=4, num_layers=2, positional=None, dropout=0.0,
                         attention=factory).double()
    many.load_state_dict(one.state_dict())
    return one, many


def _data():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (2, LENGTH + 1), generator=g)
    keep = torch.arange(LENGTH)[None, :] < torch.tensor([[LENGTH], [15]])
    return tokens[:, :-1], tokens[:, 1:], keep


def _loss(model, tokens, targets, keep):
    logits = model(tokens, key_keep_mask=keep)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")


def _one_process(one, tokens, targets, keep):
    loss = _loss(one, tokens, targets, keep)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in one.named_parameters()}


def _compare(scheme, layout):
    one, many = _models(functools.partial(SequenceParallelSelfAttention, scheme=scheme, layout=layout))
    tokens, targets, keep = _data()
    want_loss, want_grads = _one_process(one, tokens, targets, keep)
    cut = lambda t: shard(t, dim=1, layout=layout)
    loss = _loss(many, cut(tokens), cut(targets), cut(keep))
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    grad_error = 0.0
    for n, p in many.named_parameters():
        g = p.grad.clone()
        dist.all_reduce(g)
        grad_error = max(grad_error, (g - want_grads[n]).abs().max().item())
    return abs(total - want_loss).item(), grad_error


def _after_one_step(model, tokens, targets, keep, scale):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    (_loss(model, tokens, targets, keep) * scale).backward()
    opt.step()


def _ddp_and_fsdp(layout):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel

    tokens, targets, keep = _data()
    cut = lambda t: shard(t, dim=1, layout=layout)
    found = {}
    factory = functools.partial(SequenceParallelSelfAttention, layout=layout)
    one, many = _models(factory)
    before = {n: p.clone() for n, p in one.state_dict().items()}
    _after_one_step(one, tokens, targets, keep, 1.0)
    want = one.state_dict()
    found["step_size"] = max((p - before[n]).abs().max().item() for n, p in want.items())
    ddp = DistributedDataParallel(many)
    _after_one_step(ddp, cut(tokens), cut(targets), cut(keep), float(WORLD))  # DDP averages: undo it
    found["ddp"] = max((p - want[n]).abs().max().item() for n, p in many.state_dict().items())
    _, sharded = _models(factory)
    for layer in sharded.body.layers:
        fully_shard(layer)
    fully_shard(sharded)
    _after_one_step(sharded, cut(tokens), cut(targets), cut(keep), float(WORLD))  # FSDP2 averages too
    full = {n: p.full_tensor() if isinstance(p, DTensor) else p for n, p in sharded.state_dict().items()}
    found["fsdp2"] = max((p - want[n]).abs().max().item() for n, p in full.items())
    return found


def _empty(scheme, layout):
    module = SequenceParallelSelfAttention(12, 4, causal=True, scheme=scheme, layout=layout).double()
    x = torch.zeros(2, 0, 12, dtype=torch.float64, requires_grad=True)
    out = module(x, key_keep_mask=torch.zeros(2, 0, dtype=torch.bool))
    out.sum().backward()
    return tuple(out.shape), tuple(x.grad.shape), all(p.grad is not None for p in module.parameters())


def _run(rank, world):
    found = {("padding", s, lay): cases.padding_is_inert(
        functools.partial(SequenceParallelSelfAttention, 12, 4, causal=True, scheme=s, layout=lay),
        lambda m, x, keep: m(x, key_keep_mask=keep), layout=lay, padded=9)
        for s, lay in itertools.product(("ring", "ulysses", "allgather"), ("contiguous", "zigzag"))}
    found.update({("empty", s, lay): _empty(s, lay) for s, lay in itertools.product(
        ("ring", "ulysses", "allgather"), ("contiguous", "zigzag"))})
    found |= {(s, lay): _compare(s, lay) for s, lay in itertools.product(("ring", "ulysses", "allgather"),
                                                                          ("contiguous", "zigzag"))}
    found["wrappers"] = {lay: _ddp_and_fsdp(lay) for lay in ("contiguous", "zigzag")}
    try:
        SequenceParallelSelfAttention(16, 4)(torch.randn(1, 3, 16), cache=object())
    except attnkit.AttnkitError as e:
        found["cache_error"] = str(e)
    return found


@pytest.fixture(scope="module")
def results():
    return spawn.run(_run, WORLD)


@pytest.mark.parametrize("scheme", ["ring", "ulysses", "allgather"])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_language_model_loss_and_gradients_equal_one_process(results, scheme, layout):
    for found in results:
        loss_error, grad_error = found[scheme, layout]
        assert loss_error <= TOL and grad_error <= TOL, (loss_error, grad_error)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
def test_one_sgd_step_under_ddp_and_fsdp2_equals_one_process(results, layout, wrapper):
    for found in results:
        assert found["wrappers"][layout][wrapper] <= TOL, found["wrappers"]
        assert found["wrappers"][layout]["step_size"] > 1e-3  # the step moved the parameters


def test_a_kv_cache_is_refused(results):
    assert "no KV cache across ranks" in results[0]["cache_error"]


@pytest.mark.parametrize("scheme", ["ring", "ulysses", "allgather"])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_non_finite_padding_reaches_no_output_and_no_gradient(results, scheme, layout):
    """The padding promise of the one-process modules (tests/nn/test_padding.py), across ranks."""
    for rank, found in enumerate(results):
        for fill, (finite, diff) in found["padding", scheme, layout].items():
            assert finite and diff == 0.0, (rank, fill, finite, diff)


@pytest.mark.parametrize("scheme", ["ring", "ulysses", "allgather"])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_a_sequence_of_length_zero_gives_an_empty_output(results, scheme, layout):
    for found in results:
        assert found["empty", scheme, layout] == ((2, 0, 12), (2, 0, 12), True)
