"""Data-parallel baseline: the same model, data and metrics as the PipeDream workers, with DDP.

Started by torchrun (``python -m pipedream.baselines.ddp ...``, built by ``pipedream train --mode dp``).
Every worker holds the whole model; gradients are averaged by ``DistributedDataParallel``'s bucketed
allreduce after every step (gloo on CPU, NCCL on GPU). Two minibatch semantics (``cfg.dp_batch``):

* ``per_worker`` (the paper's DP baselines): each worker takes a whole minibatch of ``batch_size``
  samples, dealt round robin, so a step consumes ``workers`` minibatches and an epoch has ``workers``
  times fewer updates than a pipeline's; the learning rate follows the linear scaling rule with
  gradual warm-up (Goyal et al. 2017; :mod:`pipedream.runtime.lr`), ``lr x workers``, for SGD, the
  optimizer the rule is derived for; Adam keeps ``lr``.
* ``global``: each minibatch of ``batch_size`` samples is split over the workers, so DP makes the same
  updates as single-process SGD on the pipeline's minibatch, at the same learning rate.

An epoch is one pass over the same training samples as a PipeDream epoch. Checkpoints (:mod:`pipedream.runtime.checkpoint`)
are taken between steps; rank 0's part holds what the replicas share (weights, optimizer state, metrics rows), every
rank's its own RNG and partial sums. With ``score_epochs`` rank 0
saves the epoch's whole model as one stage (:mod:`pipedream.runtime.assemble`), outside the wall time,
as the PipeDream workers do.

Buckets hold ``cfg.bucket_bytes`` (DDP's ``bucket_cap_mb``; left to DDP's own default, with its 1 MiB
first bucket, when it is the default 25 MiB). With ``emulate_bandwidth_Bps`` the buckets' allreduces share
one emulated link by the PipeDream runtime's rule (:mod:`pipedream.runtime.buckets`, :func:`_throttled_allreduce`).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from pipedream.capture import call_model, tensors, to_device
from pipedream.costmodel import DDP_BUCKET_CAP_BYTES
from pipedream.data.fashion_mnist import minibatch_indices
from pipedream.errors import PipeDreamError
from pipedream.runtime import assemble, lr
from pipedream.runtime import checkpoint as ckpt
from pipedream.runtime import distributed as D
from pipedream.runtime.actions import memory_minibatches
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.launch_board import LaunchBoard, link_finish_s
from pipedream.runtime.memory_meter import CATEGORIES, MemoryMeter, SavedTensors
from pipedream.runtime.optim import hidden_matrices, make_optimizer
from pipedream.runtime.task import load_task


def _throttled_allreduce(bandwidth_Bps: float, board: LaunchBoard):  # type: ignore[no-untyped-def]
    """A DDP comm hook: allreduce (mean) that completes no sooner than the emulated link allows
    (:func:`~pipedream.runtime.launch_board.link_finish_s`: buckets one after the other on one link, each from the
    last replica's launch, posted on ``board``; a step is a round of the board). Gloo's threads may finish a
    step's buckets out of order, so bucket ``k``'s completion is computed from the launches of buckets ``0 .. k``
    of its step (the chain restarts each step)."""
    world = board.replicas
    launched: list[int] = []  # this step's bucket sizes, bytes, by index
    rounds = [-1]  # the step: its round on the board
    launch_s = [0.0]  # when this replica launched its latest bucket (perf_counter): where its backward's compute ended

    # no annotations: DDP compares them with dist.GradBucket at run time, and this module's
    # `from __future__ import annotations` would turn them into strings that fail that check
    def hook(state, bucket):  # type: ignore[no-untyped-def]
        buf, k = bucket.buffer(), bucket.index()
        if k == 0:
            rounds[0] += 1
            launched.clear()
        step = rounds[0]
        launched.append(buf.numel() * buf.element_size())
        sizes = list(launched)  # buckets 0 .. k
        launch_s[0] = time.perf_counter()
        board.post(step, k, launch_s[0])
        fut = dist.all_reduce(buf.div_(world), async_op=True).get_future()

        def finish(f: torch.futures.Future) -> torch.Tensor:
            done_s = link_finish_s([board.latest(step, j) for j in range(len(sizes))], sizes, world, bandwidth_Bps)
            delay = done_s - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            return f.value()[0]

        return fut.then(finish)

    hook.launch_s = launch_s  # type: ignore[attr-defined]
    return hook


@dataclass
class Busy:
    """Where a DP worker's epoch goes, as a pipeline stage's :class:`~pipedream.runtime.executor.EpochStats` counts
    it (``compute_check.csv``: loading the minibatch, the forward, the loss, the backward; not the optimizer step).

    Attributes:
        compute_s: wall seconds of the forwards and backwards, a backward ending at its last bucket's launch when
            the link is emulated, at ``loss.backward()``'s return otherwise.
        wait_s: wall seconds inside ``loss.backward()`` after the last bucket's launch (with the emulated link).
    """

    NAMES: ClassVar[tuple[str, ...]] = ("compute_s", "wait_s")
    compute_s: float = 0.0
    wait_s: float = 0.0

    def add_forward(self, wall0: float) -> None:
        """A forward (with its minibatch's loading and the loss) began at ``wall0`` (perf_counter) and has just
        ended."""
        self.compute_s += time.perf_counter() - wall0

    def add_backward(self, wall0: float, last_launch_s: float | None) -> None:
        """A backward began at ``wall0`` and ``loss.backward()`` has just returned; its last bucket was launched at
        ``last_launch_s`` (perf_counter; None: not known, no wait counted)."""
        end = time.perf_counter()
        done = end if last_launch_s is None or last_launch_s < wall0 else last_launch_s
        self.compute_s += done - wall0
        self.wait_s += end - done

    def values(self) -> list[float]:
        """The figures in the order of :attr:`NAMES`."""
        return [getattr(self, k) for k in self.NAMES]


def minibatches_per_epoch(cfg: TrainConfig, num_samples: int, world: int) -> tuple[int, int]:
    """``(minibatches, steps)`` of one DP epoch over ``num_samples`` training samples on ``world`` workers.

    Minibatches have ``cfg.batch_size`` samples (capped by ``cfg.max_minibatches``). ``per_worker``: each
    step takes ``world`` of them at once, one per worker (so the count is a multiple of ``world``), with the
    learning rate scaled by ``world`` (Goyal et al. 2017); ``global``: each step takes one minibatch, split
    over the workers.

    Raises:
        PipeDreamError: fewer samples than one step needs.
    """
    per_worker = cfg.dp_batch == "per_worker"
    nb = num_samples // cfg.batch_size
    if cfg.max_minibatches is not None:
        nb = min(nb, cfg.max_minibatches)
    if per_worker:
        nb -= nb % world
    if nb < 1:
        raise PipeDreamError(f"{num_samples} training samples give fewer than {world} minibatches of "
                             f"{cfg.batch_size}; raise --train-subset or lower --batch-size")
    return nb, (nb // world if per_worker else nb)


def train(cfg: TrainConfig) -> None:
    """Train data-parallel on this rank (inside an initialised process group)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = D.run_device()
    task = load_task(cfg)
    hidden = hidden_matrices(task.model, task.example) if cfg.optimizer == "muon" else []  # Muon's matrices
    model = task.model.to(device)
    out_dir = cfg.run_dir("dp")
    restarted = D.restart_count() > 0
    # rank 0's part of a checkpoint holds what every replica shares (weights, optimizer state, metrics rows); each
    # rank's own, its RNG and partial sums
    restore_unix_s = time.time()
    got = ckpt.restore(out_dir, rank, (rank, 0) if rank else (0,), cfg.comm_timeout_s) \
        if cfg.resume or restarted else None
    if got is not None:
        model.load_state_dict(got[1][-1]["module"])  # before DDP broadcasts rank 0's weights
    if rank == 0 and restarted:
        ckpt.note_restart(out_dir, None if got is None else got[0], restore_unix_s)
    # bucket_cap_mb=None is DDP's default (25 MiB, first bucket 1 MiB); an explicit cap applies to every bucket
    cap_mb = None if cfg.bucket_bytes == DDP_BUCKET_CAP_BYTES else cfg.bucket_bytes / 2**20
    # gradient_as_bucket_view: the gradients are views into DDP's buckets, so a worker holds one copy of them
    # (the memory model's), not the gradients and a bucket copy of them
    ddp = DistributedDataParallel(model, device_ids=None if device.type == "cpu" else [device.index],
                                  bucket_cap_mb=cap_mb, gradient_as_bucket_view=True)
    launch_s = None  # with the throttle: when the latest bucket was launched (the backward's compute ended)
    if cfg.emulate_bandwidth_Bps:
        board = LaunchBoard(None, len(list(model.parameters())))  # DDP's buckets hold a parameter at least
        hook = _throttled_allreduce(cfg.emulate_bandwidth_Bps, board)
        launch_s = hook.launch_s
        ddp.register_comm_hook(None, hook)
    optimizer = make_optimizer(cfg, list(model.parameters()), hidden)
    train_split, val_split = task.train, task.val
    per_worker = cfg.dp_batch == "per_worker"
    if not per_worker and cfg.batch_size % world:
        raise PipeDreamError(f"--dp-batch global splits each minibatch over the workers: --batch-size "
                             f"{cfg.batch_size} is not a multiple of {world} workers")
    nb, steps = minibatches_per_epoch(cfg, len(train_split), world)
    # the linear rule is SGD's; Adam keeps its learning rate
    scale = float(world) if per_worker and cfg.optimizer == "sgd" else 1.0
    bar = D.progress_bar(cfg, rank == 0, steps)
    fault = D.fault(rank)
    meter = MemoryMeter(device) if cfg.measure_memory else None
    counted_steps = memory_minibatches(1)  # each epoch's first steps: every step holds the same (one stage)
    saved = SavedTensors()
    cadence = ckpt.Cadence(cfg.checkpoint_every, 1, 1, cfg.checkpoint_overhead)
    ck = ckpt.Checkpointer(out_dir, rank, world, cfg.comm_timeout_s) if cfg.checkpoint else None
    (start_epoch, start_step), rows, partial = (0, 0), [], []
    if got is not None:
        (start_epoch, start_step), (own, *shared) = got
        state = shared[0] if shared else own
        optimizer.load_state_dict(state["optimizer"])
        cadence.load_state(state["cadence"])
        torch.set_rng_state(own["rng"])
        rows, partial = list(state["rows"]), [float(x) for x in own["partial"]]

    def part(position: tuple[int, int], sums: list[float]) -> dict[str, Any]:
        """This rank's state at ``position``: rank 0's with the replicas' shared state (references: the snapshot
        copies them)."""
        state: dict[str, Any] = {"position": list(position), "rng": torch.get_rng_state(), "partial": sums}
        if rank == 0:
            state.update(module=model.state_dict(), optimizer=optimizer.state_dict(), rows=log.rows,
                         cadence=cadence.state())
        return state

    log = D.MetricsLog(out_dir, rows)
    wall0 = time.time() - (rows[-1]["wall_time_s"] if rows else 0.0)
    first_loss: float | None = None
    first = rank == 0 and restarted  # rank 0 notes the first minibatch after a restart
    for epoch in range(start_epoch, cfg.epochs):
        batches = minibatch_indices(len(train_split), cfg.batch_size, cfg.seed, epoch)[:nb]
        resumed = epoch == start_epoch and start_step > 0
        # this rank's running sums of the epoch: loss, samples, training seconds (checkpoints included), seconds the
        # loop was held by checkpoints, checkpoints
        sums = list(partial) if resumed else [0.0] * 5
        D.barrier(cfg.comm_timeout_s, f"start of epoch {epoch + 1}")
        t0 = time.time()
        if bar is not None:
            bar.reset(total=steps)
            bar.set_description(f"epoch {epoch + 1}/{cfg.epochs}")
            if resumed:
                bar.update(start_step)
        model.train()
        if meter is not None:
            meter.reset()
        busy = Busy()
        mine = batches[rank::world] if per_worker else [b[rank::world] for b in batches]
        i = seg0 = start_step if resumed else 0
        while i < steps:
            w0 = time.perf_counter()
            x, y = (to_device(t, device) for t in train_split.batch(mine[i]))
            counting = meter is not None and i < counted_steps
            with saved.hooks(i) if counting else nullcontext():
                loss = task.criterion(call_model(ddp, x), y)
            busy.add_forward(w0)
            if counting:  # the peak: every activation saved, and the gradients and state kept
                meter.count(held(model, optimizer, [x, y], saved.tensors_of(i)), copies=1)
            optimizer.zero_grad(set_to_none=False)
            w0 = time.perf_counter()
            loss.backward()
            busy.add_backward(w0, launch_s[0] if launch_s is not None else None)
            saved.drop(i)
            lr.before_step(cfg, optimizer, list(model.parameters()), epoch + i / steps, scale)
            optimizer.step()
            if counting:
                meter.count(held(model, optimizer, [x, y], []), copies=1)
            value = float(loss.detach())
            first_loss = value if first_loss is None else first_loss
            sums[0] += value * y.shape[0]
            sums[1] += y.shape[0]
            i += 1
            if bar is not None:
                bar.update(1)
            if first:
                first = False
                ckpt.note_first_minibatch(out_dir)
            if fault is not None and epoch * steps + i > fault[0]:
                D.inject_fault(out_dir, fault[1], epoch, i)  # tests: die (or freeze) without a word
            if ck is not None and cadence.due and i < steps and i - seg0 == cadence.count(steps - seg0):
                seg_s = time.time() - t0
                sums[2] += seg_s
                held_s = ck.snapshot((epoch, i), part((epoch, i), sums))
                sums[2:] = [sums[2] + held_s, sums[3] + held_s, sums[4] + 1]
                cadence.measured(seg_s, i - seg0, ck, cfg.comm_timeout_s)
                seg0, t0 = i, time.time()
        loss_total, n, *spent = D.allreduce_sum([*sums[:2], *busy.values()], cfg.comm_timeout_s,
                                                "end-of-epoch loss and time reduction")
        sums[2] += time.time() - t0
        epoch_time = sums[2]  # this rank's training seconds (rank 0 logs its own), checkpoint snapshots included
        model.eval()
        correct = counted = 0
        vloss, vn = 0.0, 0
        n_val = len(val_split) // cfg.batch_size
        with torch.no_grad():
            for k in range(rank, n_val, world):
                x, y = (to_device(t, device)
                        for t in val_split.batch(torch.arange(k * cfg.batch_size, (k + 1) * cfg.batch_size)))
                out = call_model(model, x)
                c, m = task.count_correct(out, y)
                correct, counted = correct + c, counted + m
                vloss += float(task.criterion(out, y)) * y.shape[0]
                vn += y.shape[0]
        correct, counted, vloss, vn = D.allreduce_sum([correct, counted, vloss, vn], cfg.comm_timeout_s,
                                                      "validation reduction")
        row = {"epoch": epoch + 1, "epoch_time_s": epoch_time, "train_loss": loss_total / max(n, 1),
               "val_accuracy": correct / max(counted, 1), "val_loss": vloss / max(vn, 1), "samples_per_s": n / epoch_time,
               "wall_time_s": time.time() - wall0, "train_samples": n,
               **{f"{k}_stage0": v / world for k, v in zip(Busy.NAMES, spent, strict=True)}}  # replicas' mean
        if meter is not None:  # rank 0's count (every worker holds the same); as a pipeline's one stage
            rec = meter.record()
            row["peak_memory_bytes_stage0"] = float(rec["peak_bytes"])
            row.update({f"peak_{c}_bytes_stage0": float(rec["breakdown"][c]) for c in CATEGORIES})
        if ck is not None:
            row.update(cadence.figures(sums[3], int(sums[4]), epoch_time))
        D.log_epoch(row, log, rank == 0, bar)
        if cfg.score_epochs:  # this epoch's model, for the launcher to score after training (not timed)
            wall0 += assemble.save_epoch(out_dir, 0, model, 1, epoch + 1, rank == 0, cfg.comm_timeout_s)
        if ck is not None:
            ck.snapshot((epoch + 1, 0), part((epoch + 1, 0), []))
    if ck is not None:
        ck.wait()
    if bar is not None:
        bar.close()
    if rank == 0:
        assemble.save_stage(out_dir, 0, model, 1)
    if cfg.debug_dump:
        path = out_dir / "debug" / f"rank{rank}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"first_loss": first_loss, "memory": meter.record() if meter is not None else None,
                    "params": {k: v.detach().cpu() for k, v in model.state_dict().items()}}, path)
    D.barrier(cfg.comm_timeout_s, "end of training")


def held(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: list[torch.Tensor],
         activations: list[torch.Tensor]) -> list[tuple[str, list[torch.Tensor]]]:
    """What a DP worker holds, by category (:mod:`pipedream.runtime.memory_meter`): its weights and buffers,
    the gradients (views into DDP's buckets), the optimizer's state, the minibatch, the saved activations."""
    params = list(model.parameters())
    return [("weights", params + list(model.buffers())), ("versions", []),
            ("gradients", [p.grad for p in params if p.grad is not None]),
            ("optimizer", tensors(list(optimizer.state.values()))), ("buffers", tensors(batch)),
            ("activations", activations)]


def main(argv: list[str] | None = None) -> None:
    """torchrun entry point: the options of :class:`TrainConfig` (plan and schedule options are ignored)."""
    D.worker_main(argv, "python -m pipedream.baselines.ddp", __doc__, "dp", train)


if __name__ == "__main__":
    main()
