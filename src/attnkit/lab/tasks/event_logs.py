"""Event-sequence logs with injected anomalies (for language-model anomaly detection)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import ArgumentError, ShapeError, check_int
from .base import IGNORE_INDEX, Task, check_float, register

__all__ = ["EventLogs"]


@register
@dataclass(frozen=True)
class EventLogs(Task):
    """Sessions of log events from a role-dependent Markov chain, some with one impossible event.

    For Brown, Tuor, Hutchinson & Nichols 2018, "Recurrent Neural Network Attention Mechanisms
    for Interpretable System Log Anomaly Detection", arXiv:1803.04967: a language model of
    normal logs scores each sequence by its loss; anomalies are the poorly predicted ones.
    One session reads ``user login e2 e3 ... logout PAD ...``; the user's role is
    ``(user - 1) % num_roles``. For each role and previous event the normal process allows
    ``branching`` next events (fixed by ``process_seed``, with fixed probabilities);
    ``logout`` ends the session, which is otherwise cut at ``max_events`` events.

    An anomalous session (probability ``anomaly_rate``) has one event that the normal process
    never emits after that previous event for that role (``transitions[role, prev, event] == 0``),
    injected at a uniform step (earlier if the session would end first); the session then
    continues normally from it. ``anomaly_position`` indexes ``events`` (-1 when normal).
    Train on ``anomaly_rate=0`` (or a small contamination); test on ``test_task()`` (half).

    Token ids: PAD 0; users ``1 .. num_users``; event ``e`` is ``1 + num_users + e``, with
    ``e = 0`` login and ``e = num_events - 1`` logout. The ``tokens`` kind is next-event
    prediction: ``inputs = events[:, :-1]``, ``targets = events[:, 1:]`` with PAD -> -100, so
    ``inputs[:, t + 1]`` *is* ``targets[:, t]``: train causal models only (a bidirectional one
    copies the answer; ``needs_causal_model`` is True).

    Differences from the paper: the paper models the fields of single LANL authentication log
    lines; here a generated session of event types stands in, with the user as context.

    Shapes:
        ``events (n, 1 + max_events)``, ``lengths (n,)``, ``is_anomaly (n,)`` bool,
        ``anomaly_position (n,)``, ``inputs``/``targets (n, max_events)``.

    Complexity: ``O(n max_events num_events)`` per batch, vectorised over examples.

    Args:
        num_users, num_roles: users, each with role ``(user - 1) % num_roles``.
        num_events: event types including login and logout (>= 3).
        branching: allowed next events per (role, previous event).
        max_events: longest session in events.
        anomaly_rate: probability that a session carries an anomaly.
        process_seed: seed of the normal process (its transition table).

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("event_logs").test_task()
        >>> batch = task.sample(64, generator=torch.Generator().manual_seed(0))
        >>> row = int(batch["is_anomaly"].nonzero()[0])
        >>> p = int(batch["anomaly_position"][row])
        >>> role, prev, event = task.context(batch["events"][row], p)
        >>> task.transitions[role, prev, event].item()
        0.0
    """

    name: ClassVar[str] = "event_logs"
    kind: ClassVar[str] = "tokens"
    needs_causal_model: ClassVar[bool] = True

    num_users: int = 8
    num_roles: int = 2
    num_events: int = 12
    branching: int = 3
    max_events: int = 16
    anomaly_rate: float = 0.0
    process_seed: int = 0

    def __post_init__(self):
        check_int("EventLogs", "num_users", self.num_users, 1)
        check_int("EventLogs", "num_roles", self.num_roles, 1)
        check_int("EventLogs", "num_events", self.num_events, 3)
        check_int("EventLogs", "branching", self.branching, 1)
        if self.branching > self.num_events - 1:
            raise ArgumentError(f"EventLogs: branching must be <= num_events - 1 = {self.num_events - 1}; "
                                f"got {self.branching}")
        check_int("EventLogs", "max_events", self.max_events, 2)
        check_float("EventLogs", "anomaly_rate", self.anomaly_rate, 0.0, 1.0)
        check_int("EventLogs", "process_seed", self.process_seed, 0)
        object.__setattr__(self, "transitions", self._process())

    def _process(self) -> torch.Tensor:
        """``(num_roles, num_events, num_events)`` next-event probabilities; login is never a successor."""
        g = torch.Generator().manual_seed(self.process_seed)
        e = self.num_events
        table = torch.zeros(self.num_roles, e, e)
        for role in range(self.num_roles):
            for prev in range(e - 1):  # logout has no successor
                nxt = torch.randperm(e - 1, generator=g)[:self.branching] + 1
                table[role, prev, nxt] = torch.rand(self.branching, generator=g) + 0.5
        return table / table.sum(-1, keepdim=True).clamp_min(1e-30)

    @property
    def vocab_size(self) -> int:
        return 1 + self.num_users + self.num_events

    @property
    def num_classes(self) -> int:
        return self.vocab_size

    def test_task(self, anomaly_rate: float = 0.5) -> EventLogs:
        """The same process with ``anomaly_rate`` (a mix of normal and anomalous sessions)."""
        return dataclasses.replace(self, anomaly_rate=anomaly_rate)

    def context(self, events: torch.Tensor, position: int) -> tuple[int, int, int]:
        """``(role, previous event, event)`` of ``events[position]`` in one session (event types, not ids)."""
        first = 1 + self.num_users
        role = (int(events[0]) - 1) % self.num_roles
        return role, int(events[position - 1]) - first, int(events[position]) - first

    def _sample(self, n, generator):
        g, logout, steps = generator, self.num_events - 1, self.max_events
        users = torch.randint(1, 1 + self.num_users, (n,), generator=g)
        roles = (users - 1) % self.num_roles
        anomalous = torch.rand(n, generator=g) < self.anomaly_rate
        when = torch.randint(1, steps, (n,), generator=g)  # step of the anomaly, if the session lasts
        types = torch.full((n, steps), -1, dtype=torch.long)  # -1 = after the end
        types[:, 0] = 0
        position = torch.full((n,), -1, dtype=torch.long)
        for t in range(1, steps):
            prev = types[:, t - 1]
            alive = (prev >= 0) & (prev != logout)
            rows = self.transitions[roles, prev.clamp_min(0)]  # (n, E)
            rows[~alive] = 1.0  # any valid row for finished sessions; masked below
            nxt = torch.multinomial(rows, 1, generator=g).squeeze(1)
            inject = alive & anomalous & (position < 0) & ((t == when) | (nxt == logout))
            forbidden = (self.transitions[roles, prev.clamp_min(0)] == 0).float()
            wrong = torch.multinomial(forbidden, 1, generator=g).squeeze(1)
            nxt = torch.where(inject, wrong, nxt)
            position = torch.where(inject, torch.tensor(t + 1), position)  # +1: the user token comes first
            types[:, t] = torch.where(alive, nxt, torch.tensor(-1))
        lengths = 1 + (types >= 0).sum(1)
        events = torch.where(types >= 0, types + 1 + self.num_users, torch.tensor(0))
        events = torch.cat([users.unsqueeze(1), events], dim=1)  # (n, 1 + max_events)
        targets = events[:, 1:].masked_fill(events[:, 1:] == 0, IGNORE_INDEX)
        return {"events": events, "lengths": lengths, "is_anomaly": position >= 0, "anomaly_position": position,
                "inputs": events[:, :-1], "targets": targets}

    def detection_auc(self, scores: torch.Tensor, batch: dict[str, torch.Tensor]) -> float:
        """ROC AUC of per-session anomaly ``scores (n,)`` (higher = more anomalous) against ``is_anomaly``."""
        labels = batch["is_anomaly"]
        if not isinstance(scores, torch.Tensor) or scores.shape != labels.shape:
            got = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
            raise ShapeError(f"EventLogs.detection_auc: scores must have shape {tuple(labels.shape)}; got {got}")
        pos, neg = int(labels.sum()), int((~labels).sum())
        if pos == 0 or neg == 0:
            raise ArgumentError("EventLogs.detection_auc: batch needs both normal and anomalous sessions")
        s = scores.detach().double()
        # Mann-Whitney: P(score of an anomaly > score of a normal session), ties count one half
        greater = (s[labels].unsqueeze(1) > s[~labels].unsqueeze(0)).double().sum()
        ties = (s[labels].unsqueeze(1) == s[~labels].unsqueeze(0)).double().sum()
        return ((greater + 0.5 * ties) / (pos * neg)).item()

    def describe(self) -> str:
        return (f"event_logs: sessions of {self.num_events} event types for {self.num_users} users in "
                f"{self.num_roles} roles, <= {self.max_events} events, anomaly rate {self.anomaly_rate:g} "
                f"(tokens; next-event accuracy)")
