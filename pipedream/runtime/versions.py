"""Weight versions of one stage: weight stashing (§3.3), vertical sync, and 2BW double buffering.

The stage's ``nn.Parameter`` objects are the *master* weights that the optimizer updates in place;
version ``k`` is the weights after ``k`` steps (version 0 is the initial weights). The newest version
is the master weights themselves (aliases of their storage), and an older one lives on as its own copy
only while an in-flight minibatch or a future forward still needs it (copy on write at the step). A
forward pass runs on a version (through ``torch.func.functional_call``), so the autograd graph of an
in-flight minibatch keeps pointing at the exact tensors its forward used; its backward therefore
computes gradients at that version, and the gradients are applied to the newest weights:
``W(latest + 1) = W(latest) - lr * grad(W(v))``.

Which version a forward uses is a :class:`Policy`:

* ``stash`` (PipeDream weight stashing, §3.3): the newest version at the time of the forward.
* ``vertical`` (vertical sync, §3.3): the input stage uses its newest version, and the minibatch carries the
  *update count* of those weights (how many minibatches' updates they contain). A stage whose replicas average
  ``r`` minibatches per step (1F1B-RR) holds updates of minibatches ``< k * r`` in its version ``k``; every stage
  uses its newest version whose count is at most the carried one, ``carried // r`` (the carried version itself
  when unreplicated). That version exists when the minibatch arrives: the input stage applied those updates
  only after every stage's backward of those minibatches, and each replica steps right after its backward.
* ``2bw`` (PipeDream-2BW): minibatch ``t`` uses version ``max(t - 1, 0)`` on every stage, so at most
  two versions are alive and ``W(t + 1) = W(t) - lr * grad(W(t - 1))``.
* ``flush`` (GPipe, PipeDream-Flush): the newest version; the pipeline is flushed before every step, so
  all microbatches of a minibatch see the same weights, one version is alive, and
  ``W(t + 1) = W(t) - lr * grad(W(t))``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
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
    """A stage's weight versions, reference-counted by the in-flight (micro)batches using them.

    The newest version is the live parameters themselves (aliases of the master parameters' storage, with their
    own autograd version counters). An older version exists only while something still needs it, and costs one
    copy of the weights: copy on write at the optimizer step (:meth:`stepping`) moves the master parameters to
    fresh storage only when a minibatch in flight (or, by the policy, a future forward) still needs the version
    about to change. Copies held: flush 1; 2BW 2; weight stashing one per version still needed (NOAM on the
    input stage of 1F1B, 1 on its output stage).

    Args:
        module: the stage's module; its parameters are the master weights.
        policy: how forwards pick their version.
    """

    def __init__(self, module: nn.Module, policy: Policy) -> None:
        self.policy = Policy(policy)
        self.names = [n for n, _ in module.named_parameters()]
        self.master = [p for _, p in module.named_parameters()]
        self.latest = 0
        self._store: dict[int, dict[str, torch.Tensor]] = {0: self._aliases()}
        self._users: Counter[int] = Counter()
        self._floor = 0  # no future forward uses a version below this one
        self.max_alive = 1

    def _aliases(self) -> dict[str, torch.Tensor]:
        """Leaf tensors sharing the master parameters' storage, each with its own autograd version counter
        (the optimizer's in-place update of the master must not invalidate a graph built on a version that
        copy on write has already moved away from the master's storage)."""
        out = {}
        with torch.no_grad():
            for n, p in zip(self.names, self.master, strict=True):
                alias = torch.empty(0, dtype=p.dtype, device=p.device)
                alias.set_(p.untyped_storage(), p.storage_offset(), p.size(), p.stride())
                out[n] = alias.requires_grad_(p.requires_grad)
        return out

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

    @contextmanager
    def stepping(self) -> Iterator[None]:
        """Wrap the optimizer's in-place step on the master weights; on exit the result is the next version.

        Before the step, versions nothing needs after it are dropped, and the newest version is copied
        on write (the master parameters move to fresh storage, the version keeps the old one) only if an
        in-flight minibatch or, by the policy, a future forward still needs it.
        """
        after = self.latest + 1
        if self.policy in (Policy.STASH, Policy.FLUSH):
            self._floor = after  # every later forward uses the version this step produces
        kept = self._kept(after)
        self._store = {v: d for v, d in self._store.items() if v in kept}
        if self.latest in kept:
            with torch.no_grad():
                for p in self.master:
                    p.data = p.detach().clone()
        yield
        self.latest = after
        self._store[after] = self._aliases()
        self.max_alive = max(self.max_alive, len(self._store))

    def _kept(self, latest: int) -> set[int]:
        """Stored versions that survive when ``latest`` is the newest version."""
        kept = {v for v in self._store if v == latest or v >= self._floor or self._users[v] > 0}
        if self.policy == Policy.TWO_BW:
            # minibatch t needs version t - 1 while t + 1 is being produced: keep the newest two
            kept = {v for v in kept if v >= latest - 1 or self._users[v] > 0}
        return kept

    def _prune(self) -> None:
        kept = self._kept(self.latest)
        self._store = {v: d for v, d in self._store.items() if v in kept}

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
        """Inverse of :meth:`state` (at an epoch boundary, when no minibatch is in flight), after the master
        parameters are restored: the newest version is their aliases again, older ones own copies."""
        self.latest = int(state["latest"])  # type: ignore[arg-type]
        self._floor = int(state["floor"])  # type: ignore[arg-type]
        store = state["store"]
        assert isinstance(store, dict)
        self._store = {int(v): {n: t.clone().requires_grad_(t.requires_grad) for n, t in d.items()}
                       for v, d in store.items() if int(v) != self.latest}
        self._store[self.latest] = self._aliases()
        self._users.clear()
