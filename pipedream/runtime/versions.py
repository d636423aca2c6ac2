"""Weight versions of one stage: weight stashing (§3.3), vertical sync, and 2BW double buffering.

The stage's ``nn.Parameter`` objects are the *master* weights that the optimizer updates in place.
Every optimizer step commits an immutable snapshot, numbered by the steps taken so far (version 0 is
the initial weights). A forward pass runs on a snapshot (through ``torch.func.functional_call``), so
the autograd graph of an in-flight minibatch keeps pointing at the exact tensors its forward used;
its backward therefore computes gradients at that version, and the gradients are applied to the
newest weights: ``W(latest + 1) = W(latest) - lr * grad(W(v))``.

Which version a forward uses is a :class:`Policy`:

* ``stash`` (PipeDream weight stashing, §3.3): the newest version at the time of the forward.
* ``vertical`` (vertical sync, §3.3): the input stage uses its newest version, and the minibatch
  carries the *update count* of those weights: how many minibatches' updates they contain. A stage
  whose replicas average ``r`` minibatches per step (1F1B-RR) holds updates of minibatches
  ``< k * r`` in its version ``k``, so its count is ``k * r``. Every stage uses its newest version whose
  count is at most the carried one, ``carried // r``; in an unreplicated pipeline that is the carried
  version number itself, and with a 2-1 plan every stage uses weights of exactly the carried count.
  That version exists when the minibatch arrives: the input stage applied those updates only after
  every stage's backward of those minibatches, and each replica steps right after its backward.
* ``2bw`` (PipeDream-2BW): minibatch ``t`` uses version ``max(t - 1, 0)`` on every stage, so at most
  two versions are alive and ``W(t + 1) = W(t) - lr * grad(W(t - 1))``.
* ``flush`` (GPipe): the newest version; the pipeline is flushed before every step, so all
  microbatches of a minibatch see the same weights.
"""

from __future__ import annotations

from collections import Counter
from enum import StrEnum

import torch
from torch import nn

from pipedream.errors import PipeDreamError


class Policy(StrEnum):
    """Which weight version a stage's forward pass uses (see module docstring)."""

    STASH = "stash"
    VERTICAL = "vertical"
    TWO_BW = "2bw"
    FLUSH = "flush"


class WeightVersions:
    """Snapshots of a stage's parameters, reference-counted by the in-flight (micro)batches using them.

    Args:
        module: the stage's module; its parameters are the master weights.
        policy: how forwards pick their version.
    """

    def __init__(self, module: nn.Module, policy: Policy) -> None:
        self.policy = Policy(policy)
        self.names = [n for n, _ in module.named_parameters()]
        self.master = [p for _, p in module.named_parameters()]
        self.latest = 0
        self._store: dict[int, dict[str, torch.Tensor]] = {0: self._snapshot()}
        self._users: Counter[int] = Counter()
        self._floor = 0  # no future forward uses a version below this one
        self.max_alive = 1

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone().requires_grad_(p.requires_grad) for n, p in zip(self.names, self.master, strict=True)}

    def version_for(self, minibatch: int, carried: int | None, updates_per_version: int = 1) -> int:
        """The version a forward of ``minibatch`` uses.

        Args:
            minibatch: global minibatch number (2BW).
            carried: update count that came with the minibatch from the input stage (None there).
            updates_per_version: minibatches whose updates one step of this stage applies (its replicas
                in 1F1B-RR, else 1); vertical sync uses version ``carried // updates_per_version``.
        Raises:
            PipeDreamError: the policy needs a version this stage no longer (or not yet) has.
        """
        if self.policy == Policy.VERTICAL and carried is not None:
            v = carried // updates_per_version
        elif self.policy == Policy.TWO_BW:
            v = max(minibatch - 1, 0)
        else:
            v = self.latest
        if v not in self._store:
            raise PipeDreamError(f"weight version {v} for minibatch {minibatch} is not available (have "
                                 f"{sorted(self._store)}, policy {self.policy}); the schedule and policy disagree")
        return v

    def acquire(self, version: int) -> dict[str, torch.Tensor]:
        """Parameters of ``version`` (leaf tensors requiring grad) for one forward; pairs with :meth:`release`."""
        self._users[version] += 1
        self._floor = max(self._floor, version)
        return self._store[version]

    def release(self, version: int) -> None:
        """One user of ``version`` (a finished backward) is done with it."""
        self._users[version] -= 1
        if self._users[version] <= 0:
            del self._users[version]
        self._prune()

    def commit(self) -> int:
        """After an optimizer step on the master weights: snapshot them as the next version; returns it."""
        self.latest += 1
        self._store[self.latest] = self._snapshot()
        if self.policy in (Policy.STASH, Policy.FLUSH):
            self._floor = self.latest
        self._prune()
        self.max_alive = max(self.max_alive, len(self._store))
        return self.latest

    def _prune(self) -> None:
        for v in [v for v in self._store if v != self.latest and v < self._floor and self._users[v] == 0]:
            del self._store[v]
        if self.policy == Policy.TWO_BW:
            # minibatch t needs version t - 1 while t + 1 is being produced: keep the newest two
            for v in [v for v in self._store if v < self.latest - 1 and self._users[v] == 0]:
                del self._store[v]

    def alive(self) -> list[int]:
        """Version numbers currently stored, oldest first."""
        return sorted(self._store)

    def version_of(self, params: dict[str, torch.Tensor]) -> int:
        """The stored version whose tensors ``params`` are (the very tensor objects, not equal values),
        or -1 if none is (also for a stage without parameters: it has nothing to stash)."""
        if not self.names:
            return -1
        first = params.get(self.names[0])
        return next((v for v, d in self._store.items() if d[self.names[0]] is first), -1)

    def params_of(self, version: int) -> dict[str, torch.Tensor]:
        """The stored parameters of ``version`` without taking a reference (for checks and checkpoints)."""
        return self._store[version]

    def state(self) -> dict[str, object]:
        """Checkpointable state: latest number and every stored version's tensors."""
        return {"latest": self.latest, "floor": self._floor,
                "store": {v: {n: t.detach().clone() for n, t in d.items()} for v, d in self._store.items()}}

    def load_state(self, state: dict[str, object]) -> None:
        """Inverse of :meth:`state` (at an epoch boundary, when no minibatch is in flight)."""
        self.latest = int(state["latest"])  # type: ignore[arg-type]
        self._floor = int(state["floor"])  # type: ignore[arg-type]
        store = state["store"]
        assert isinstance(store, dict)
        self._store = {int(v): {n: t.clone().requires_grad_(True) for n, t in d.items()} for v, d in store.items()}
        self._users.clear()
