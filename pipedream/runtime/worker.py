"""The PipeDream worker: one process per rank, started by torchrun (``python -m pipedream.runtime.worker``).

Each rank builds the whole model from the same seed (so every stage starts from the weights a
single-process run would have), keeps the layers of its stage of the plan, and executes its action
list of the schedule (:mod:`pipedream.schedules`) once per epoch, in segments where it checkpoints
(:mod:`pipedream.runtime.checkpoint`: the pipeline drains at a segment's end). After every epoch the validation set
goes through the pipeline forward-only, the loss and accuracy are summed over all ranks, and rank 0
appends the epoch to ``<out_dir>/metrics.json``; with ``score_epochs`` replica 0 of every stage then
saves its stage of the epoch's model (:mod:`pipedream.runtime.assemble`), outside the wall time.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipedream import schedules
from pipedream.data import fashion_mnist as fm
from pipedream.errors import PipeDreamError
from pipedream.models import node_layer_index
from pipedream.plan import Plan
from pipedream.runtime import assemble, lr, shared, split
from pipedream.runtime import checkpoint as ckpt
from pipedream.runtime import distributed as D
from pipedream.runtime.actions import memory_minibatches
from pipedream.runtime.comm import P2P
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.executor import StageData, StageExecutor
from pipedream.runtime.memory_meter import CATEGORIES
from pipedream.runtime.optim import hidden_matrices, make_optimizer
from pipedream.runtime.shared import SharedGrads
from pipedream.runtime.stage import build_stages, straight_plan
from pipedream.runtime.task import load_task
from pipedream.runtime.versions import Policy, WeightVersions

FAULT_ENV = D.FAULT_ENV
# the EpochStats fields each rank sums over the epoch's training and rank 0 logs per stage (``<name>_stage<s>``,
# mean over the stage's replicas; :func:`_stage_row`)
BUSY = ("compute_s", "wait_s")
BATCHED_ENV = "PIPEDREAM_P2P_BATCHED"  # "1": batch each step's sends and receives on gloo too (tests)


@dataclass
class Batches:
    """Minibatch ``m``, microbatch ``j`` of one epoch as model input and target (same on every rank).

    A rank that needs both (a one-stage pipeline) collates each (micro)batch once; a last stage needs only
    the targets and takes them with the data set's ``targets(indices)`` where it has one.
    """

    data: Any  # len() and batch(indices) -> (input, target); optionally targets(indices) -> target
    indices: torch.Tensor  # (minibatches, minibatch size): row m holds minibatch m's sample indices
    micro: int  # samples per microbatch
    _last: tuple[tuple[int, int], Any] | None = None  # the last (micro)batch collated: ((m, j), (input, target))

    def rows(self, m: int, j: int) -> torch.Tensor:
        return self.indices[m][j * self.micro:(j + 1) * self.micro]

    def _batch(self, m: int, j: int) -> Any:
        if self._last is None or self._last[0] != (m, j):
            self._last = ((m, j), self.data.batch(self.rows(m, j)))
        return self._last[1]

    def inputs(self, m: int, j: int) -> torch.Tensor:
        return self._batch(m, j)[0]

    def labels(self, m: int, j: int) -> torch.Tensor:
        if (self._last is None or self._last[0] != (m, j)) and hasattr(self.data, "targets"):
            return self.data.targets(self.rows(m, j))
        return self._batch(m, j)[1]


def load_plan(cfg: TrainConfig, model: torch.nn.Module, world: int, example: Any = None) -> Plan:
    """The plan of the run: ``cfg.plan`` checked against model and world size, or an even straight split.

    Without ``cfg.plan`` the model's layers (the operations of its layer-granularity graph, captured on
    ``example`` for a model that is not an ``nn.Sequential``) are split into ``world`` consecutive stages of
    nearly equal length.
    """
    if cfg.plan is None:
        gm = split.trace(model, "layer", example)
        ops = [i for n, i in split.node_ids(gm).items() if n.op in split.OPS]
        if world > len(ops):
            raise PipeDreamError(f"{world} workers but the model has only {len(ops)} layers")
        sizes = [len(ops) // world + (1 if i < len(ops) % world else 0) for i in range(world)]
        plan = straight_plan(cfg.model, len(ops), sizes)
        for stage in plan.stages:  # a model with several inputs numbers its layers after them
            stage.nodes = [ops[node_layer_index(n)] for n in stage.nodes]
        return plan
    plan = Plan.load(cfg.plan)
    if cfg.model_factory is None and ":" not in cfg.model and plan.model != cfg.model:
        raise PipeDreamError(f"plan {cfg.plan} is for model {plan.model!r}, not {cfg.model!r}")
    if plan.workers != world:
        raise PipeDreamError(f"plan {cfg.plan} needs {plan.workers} workers but {world} were started; "
                             f"use --workers {plan.workers}")
    return plan


def policy_of(cfg: TrainConfig) -> Policy:
    """Weight-version policy for the schedule (§3.3; 2BW; the flush of GPipe and PipeDream-Flush). Every policy runs
    on replicated stages: vertical sync carries update counts rather than version numbers
    (:mod:`pipedream.runtime.versions`), and the replicas of a GPipe or 2BW stage share each minibatch's microbatches.
    """
    if cfg.schedule in ("gpipe", "pipedream_flush"):
        return Policy.FLUSH
    if cfg.schedule == "2bw":
        return Policy.TWO_BW
    return Policy.VERTICAL if cfg.weight_sync == "vertical" else Policy.STASH


def minibatches_per_epoch(cfg: TrainConfig, num_samples: int, replicas: list[int]) -> int:
    """Full minibatches of one epoch: with 1F1B-RR a multiple of every stage's replica count (round robin
    over minibatches, §3.2); GPipe, 2BW and PipeDream-Flush share each minibatch's microbatches among replicas
    instead."""
    n = num_samples // cfg.batch_size
    if cfg.max_minibatches is not None:
        n = min(n, cfg.max_minibatches)
    step = minibatch_step(cfg, replicas)
    n -= n % step
    if n < 1:
        raise PipeDreamError(f"{num_samples} training samples give no full round of {step} minibatches of "
                             f"{cfg.batch_size}; raise --train-subset or lower --batch-size")
    return n


def minibatch_step(cfg: TrainConfig, replicas: list[int]) -> int:
    """Minibatches of one round: 1F1B-RR hands whole minibatches to replicas in turn (§3.2), the others microbatches."""
    return math.lcm(*replicas) if cfg.schedule == "1f1b" else 1


def train_schedules(cfg: TrainConfig, plan: Plan, num_minibatches: int) -> list[tuple[int, schedules.Schedule]]:
    """The schedules one epoch runs with a fixed ``--checkpoint-every`` (or none): ``(first minibatch, schedule)`` per
    segment (:class:`pipedream.runtime.checkpoint.Cadence`), each built from the plan's placement,
    ``[s.ranks for s in plan.stages]`` (round-robin order), exactly as the simulator builds it for the same plan
    (:func:`pipedream.sim.simulate_plan`)."""
    stage_ranks = [list(s.ranks) for s in plan.stages]
    every = None if cfg.checkpoint_every == "auto" else cfg.checkpoint_every
    cadence = ckpt.Cadence(every, minibatch_step(cfg, [s.replicas for s in plan.stages]), 1, cfg.checkpoint_overhead)
    out, m0 = [], 0
    while m0 < num_minibatches:
        n = cadence.count(num_minibatches - m0)
        out.append((m0, schedules.build(cfg.schedule, stage_ranks, n, cfg.microbatches, cfg.warmup)))
        m0 += n
    return out


def train(cfg: TrainConfig) -> None:
    """Run the whole training on this rank (call inside an initialised process group)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out_dir = cfg.run_dir("pipedream")
    device = D.run_device()
    task = load_task(cfg)
    model = task.model
    micro = cfg.batch_size // cfg.microbatches
    # a captured model's graph is specialised to the batch it was captured on: the microbatch that runs
    example = task.example if isinstance(model, torch.nn.Sequential) else task.input_batch(micro)
    plan = load_plan(cfg, model, world, example)
    replicas = [s.replicas for s in plan.stages]
    stage_ranks = [list(s.ranks) for s in plan.stages]
    s = plan.stage_of_rank(rank)
    # Muon's matrices are chosen on the whole model, so every stage splits its parameters alike; the stage modules
    # share the model's parameter objects
    hidden = hidden_matrices(model, task.example) if cfg.optimizer == "muon" else []
    stages = build_stages(model, plan, example)
    shared.check(stages.shared, replicas, cfg.schedule, cfg.clip_norm)
    shapes, module, held = stages.boundaries, stages.modules[s].to(device), stages.shared
    del model, stages
    groups = [dist.new_group(rs) if len(rs) > 1 else None for rs in stage_ranks]  # same order everywhere
    shared_grads = SharedGrads(held, s, module, stage_ranks, cfg.comm_timeout_s) if held else None
    versions = WeightVersions(module, policy_of(cfg))
    optimizer = make_optimizer(cfg, versions.master, hidden)
    # NCCL matches point-to-point operations in issue order: one batch per step of the schedule
    batched = dist.get_backend() == "nccl" or os.environ.get(BATCHED_ENV) == "1"
    p2p = P2P(cfg.comm_timeout_s, device, cfg.emulate_bandwidth_Bps, batched=batched, log=cfg.debug_dump)

    train_split, val_split = task.train, task.val
    nb = minibatches_per_epoch(cfg, len(train_split), replicas)
    built: dict[int, schedules.Schedule] = {}  # the schedule of a segment of n minibatches

    def segment(n: int) -> schedules.Schedule:
        if n not in built:
            built[n] = schedules.build(cfg.schedule, stage_ranks, n, cfg.microbatches, cfg.warmup)
        return built[n]

    n_val = len(val_split) // micro
    eval_sched = schedules.forward_only(stage_ranks, n_val)
    is_reporter = rank == stage_ranks[-1][0]
    backwards = sum(1 for a in segment(nb).order[rank] if a.kind == schedules.Kind.B)
    bar = D.progress_bar(cfg, is_reporter, backwards)
    fault = D.fault(rank)
    offset, epoch = 0, 0  # first minibatch of the segment being run, within its epoch
    restarted = D.restart_count() > 0
    first: list[bool] = [rank == 0 and restarted]  # rank 0 notes the first minibatch after a restart

    def on_backward(m: int, j: int) -> None:
        if bar is not None:
            bar.update(1)
        if first[0]:
            first[0] = False
            ckpt.note_first_minibatch(out_dir)
        if fault is not None and epoch * nb + offset + m >= fault[0]:  # minibatches of the run
            D.inject_fault(out_dir, fault[1], epoch, offset + m + 1)  # tests: die (or freeze) without a word

    lr_factor = lr.stage_lr_factor(cfg, replicas, s)
    executor = StageExecutor(s, len(plan.stages), module, versions, optimizer, p2p,
                             in_shape=shapes[s - 1] if s > 0 else None, out_shape=shapes[s],
                             stage_group=groups[s], timeout_s=cfg.comm_timeout_s, trace=cfg.debug_dump,
                             criterion=task.criterion, count_correct=task.count_correct,
                             before_step=lambda g: lr.before_step(cfg, optimizer, versions.master, g / nb, factor=lr_factor),
                             on_backward=on_backward, bucket_bytes=cfg.bucket_bytes,
                             measure_memory=cfg.measure_memory,
                             memory_minibatches=memory_minibatches(len(plan.stages)),
                             recompute=cfg.recompute, shared=shared_grads)

    flushes = cfg.schedule in ("1f1b", "2bw")  # GPipe and PipeDream-Flush drain at every minibatch anyway
    cadence = ckpt.Cadence(cfg.checkpoint_every, minibatch_step(cfg, replicas), len(plan.stages) if flushes else 1,
                           cfg.checkpoint_overhead)
    ck = ckpt.Checkpointer(out_dir, rank, world, cfg.comm_timeout_s) if cfg.checkpoint else None
    (start_epoch, start_mb), rows, partial = (0, 0), [], []
    if cfg.resume or restarted:
        restore_unix_s = time.time()
        got = ckpt.restore(out_dir, rank, (rank,), cfg.comm_timeout_s)
        if got is not None:
            (start_epoch, start_mb), (state,) = got
            rows, partial = _load(state, s, stage_ranks, module, optimizer, versions, cadence)
        if rank == 0 and restarted:
            ckpt.note_restart(out_dir, None if got is None else got[0], restore_unix_s)

    def part(position: tuple[int, int], rows: list[dict[str, float]], sums: list[float]) -> dict[str, Any]:
        """This rank's state at ``position`` (references: the snapshot copies them)."""
        return {"position": list(position), "stage": s, "stage_ranks": stage_ranks, "module": module.state_dict(),
                "optimizer": optimizer.state_dict(), "versions": versions.state(), "rng": torch.get_rng_state(),
                "rows": rows, "partial": sums, "cadence": cadence.state()}

    log = D.MetricsLog(out_dir, rows)
    wall0 = time.time() - (rows[-1]["wall_time_s"] if rows else 0.0)
    for epoch in range(start_epoch, cfg.epochs):
        order = fm.minibatch_indices(len(train_split), cfg.batch_size, cfg.seed, epoch)
        resumed = epoch == start_epoch and start_mb > 0
        # this rank's running sums of the epoch: loss, loss count, samples, training seconds (checkpoints included),
        # seconds the loop was held by checkpoints, checkpoints
        sums = list(partial) if resumed else [0.0] * 6
        busy = [0.0] * len(BUSY)  # this rank's compute and wait seconds of the epoch's training
        D.barrier(cfg.comm_timeout_s, f"start of epoch {epoch + 1}")
        if bar is not None:
            bar.reset(total=backwards)
            bar.set_description(f"epoch {epoch + 1}/{cfg.epochs}")
            if resumed:
                bar.update(sum(1 for a in segment(start_mb).order[rank] if a.kind == schedules.Kind.B))
        module.train()
        if executor.memory is not None:
            executor.memory.reset()
        offset = start_mb if resumed else 0
        while offset < nb:
            n, t0 = cadence.count(nb - offset), time.time()
            sched = segment(n)
            batches = Batches(train_split, order[offset:], micro)  # the segment's minibatches, numbered from 0
            stats = executor.run(sched.order[rank], sched, StageData(batches.inputs, batches.labels), micro,
                                 minibatch_offset=epoch * nb + offset)
            seg_s = time.time() - t0
            sums = [a + b for a, b in zip(sums, [stats.loss_sum, stats.loss_count, stats.samples, seg_s, 0, 0],
                                          strict=True)]
            busy = [b + getattr(stats, name) for b, name in zip(busy, BUSY, strict=True)]
            offset += n
            if ck is not None and cadence.due and offset < nb:
                held_s = ck.snapshot((epoch, offset), part((epoch, offset), log.rows, sums))
                sums[3:] = [sums[3] + held_s, sums[4] + held_s, sums[5] + 1]
                cadence.measured(seg_s, n, ck, cfg.comm_timeout_s)
        loss_sum, loss_n, samples, *_ = D.allreduce_sum(sums[:3], cfg.comm_timeout_s, "end-of-epoch loss reduction")
        epoch_time = sums[3]  # this rank's training seconds (rank 0 logs its own), checkpoint snapshots included
        per_stage = _stage_row(executor, busy, rank, world, stage_ranks, cfg.comm_timeout_s)
        module.eval()
        val = Batches(val_split, [torch.arange(i * micro, (i + 1) * micro) for i in range(n_val)], micro)
        ev = executor.run(eval_sched.order[rank], eval_sched, StageData(val.inputs, val.labels), micro, phase=1)
        correct, counted, vloss, vn = D.allreduce_sum([ev.correct, ev.counted, ev.loss_sum, ev.loss_count],
                                                      cfg.comm_timeout_s, "validation reduction")
        row = {"epoch": epoch + 1, "epoch_time_s": epoch_time, "train_loss": loss_sum / max(loss_n, 1),
               "val_accuracy": correct / max(counted, 1), "val_loss": vloss / max(vn, 1),
               "samples_per_s": samples / epoch_time,
               "wall_time_s": time.time() - wall0, "train_samples": samples,
               "bytes_sent_rank0": float(p2p.bytes_sent), "throttle_s_rank0": p2p.throttle_s,
               "max_weight_versions": float(versions.max_alive), **per_stage}
        if ck is not None:
            row.update(cadence.figures(sums[4], int(sums[5]), epoch_time))
        D.log_epoch(row, log, rank == 0, bar)
        if cfg.score_epochs:  # this epoch's model, for the launcher to score after training (not timed)
            wall0 += assemble.save_epoch(out_dir, s, module, len(plan.stages) if rank == 0 else None, epoch + 1,
                                         rank == stage_ranks[s][0], cfg.comm_timeout_s)
        if ck is not None:
            ck.snapshot((epoch + 1, 0), part((epoch + 1, 0), log.rows, []))
    if ck is not None:
        ck.wait()
    if bar is not None:
        bar.close()
    if rank == stage_ranks[s][0]:
        assemble.save_stage(out_dir, s, module, len(plan.stages) if rank == 0 else None)
    if cfg.debug_dump:
        _dump(out_dir, rank, s, executor, versions, p2p)
    D.barrier(cfg.comm_timeout_s, "end of training")


def _load(state: dict[str, Any], stage: int, stage_ranks: list[list[int]], module: torch.nn.Module,
          optimizer: torch.optim.Optimizer, versions: WeightVersions, cadence: ckpt.Cadence
          ) -> tuple[list[dict[str, float]], list[float]]:
    """Restore this rank from its part of a checkpoint; returns the metrics rows and the partial sums of the epoch.

    Raises:
        PipeDreamError: the checkpoint was written for another plan.
    """
    if state["stage"] != stage or state["stage_ranks"] != stage_ranks:
        raise PipeDreamError(f"the checkpoint is for stage {state['stage']} of {state['stage_ranks']}, not stage "
                             f"{stage} of {stage_ranks}; resume with the same plan or start a fresh --out-dir")
    module.load_state_dict(state["module"])
    optimizer.load_state_dict(state["optimizer"])
    versions.load_state(state["versions"])
    torch.set_rng_state(state["rng"])
    cadence.load_state(state["cadence"])
    return list(state["rows"]), [float(x) for x in state["partial"]]


def _stage_row(ex: StageExecutor, busy: list[float], rank: int, world: int, stage_ranks: list[list[int]],
               timeout_s: float) -> dict[str, float]:
    """Every stage's figures of the epoch's training for rank 0's metrics row, gathered in one collective
    (every rank calls it):

    * ``compute_s_stage<s>`` (forwards, backwards, the loss; :attr:`EpochStats.compute_s`) and
      ``wait_s_stage<s>`` (blocked on receives and allreduces), seconds, mean over the stage's replicas;
    * with ``measure_memory``: ``peak_memory_bytes_stage<s>``, the categories at that peak as
      ``peak_<category>_bytes_stage<s>`` (:data:`pipedream.runtime.memory_meter.CATEGORIES`) and on CUDA
      ``cuda_max_allocated_bytes_stage<s>``, bytes, of the stage's largest replica.
    """
    rec = ex.memory.record() if ex.memory is not None else None
    values = list(busy)
    if rec is not None:
        values += [float(rec["peak_bytes"]), *(float(rec["breakdown"][c]) for c in CATEGORIES),
                   float(rec["cuda_max_allocated_bytes"] or 0)]
    n = len(values)
    slots = [0.0] * (n * world)  # this rank's values in its slot, summed over ranks: a gather
    slots[rank * n:(rank + 1) * n] = values
    flat = D.allreduce_sum(slots, timeout_s, "per-stage time and memory gather")
    got = [flat[q * n:(q + 1) * n] for q in range(world)]
    row: dict[str, float] = {}
    k = len(BUSY)
    for s, ranks in enumerate(stage_ranks):
        row.update({f"{name}_stage{s}": sum(got[q][i] for q in ranks) / len(ranks) for i, name in enumerate(BUSY)})
        if rec is None:
            continue
        peak = got[max(ranks, key=lambda q: got[q][k])]
        row[f"peak_memory_bytes_stage{s}"] = peak[k]
        row.update({f"peak_{c}_bytes_stage{s}": v for c, v in zip(CATEGORIES, peak[k + 1:-1], strict=True)})
        if rec["cuda_max_allocated_bytes"] is not None:
            row[f"cuda_max_allocated_bytes_stage{s}"] = max(got[q][-1] for q in ranks)
    return row


def _dump(out_dir: Path, rank: int, stage: int, ex: StageExecutor, versions: WeightVersions, p2p: P2P) -> None:
    """Per-rank debug record for tests: trace of versions, first applied gradients, final weights, losses,
    the weight copies held after each action (``copies``, the master included), the communication
    operations in issue order (:attr:`P2P.log`) and whether they were batched, the
    backward and bucket-allreduce timestamps (:attr:`StageExecutor.comm_trace`), the parameter names of
    each gradient bucket and the storage addresses of the buckets' buffers and of the master gradients,
    the last epoch's memory peaks (:meth:`pipedream.runtime.memory_meter.MemoryMeter.record`, None without
    ``measure_memory``), the final weights (``params``) and module buffers (``buffers``)."""
    path = out_dir / "debug" / f"rank{rank}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"stage": stage, "trace": ex.trace, "first_grads": ex.first_grads,
                "losses": ex.stats_history, "max_versions": versions.max_alive,
                "copies": ex.copies_trace,
                "comm_log": p2p.log, "batched": p2p.batched, "comm_trace": ex.comm_trace, "buckets": ex.buckets.names,
                "bucket_ptrs": [b.buffer.untyped_storage().data_ptr() for b in ex.buckets.buckets],
                "grad_ptrs": {n: p.grad.untyped_storage().data_ptr() for n, p in zip(versions.names, versions.master,
                                                                                     strict=True) if p.grad is not None},
                "memory": ex.memory.record() if ex.memory is not None else None,
                "params": {n: p.detach().cpu() for n, p in zip(versions.names, versions.master, strict=True)},
                "buffers": {n: b.detach().cpu() for n, b in ex.module.named_buffers()}},
               path)


def main(argv: list[str] | None = None) -> None:
    """torchrun entry point: parse the options of :class:`TrainConfig` and train."""
    D.worker_main(argv, "python -m pipedream.runtime.worker", __doc__, "pipedream", train)


if __name__ == "__main__":
    main()
