"""The torch worker: a plan's stages run by torch.distributed.pipelining's own schedule classes
(``python -m pipedream.runtime.torch_worker``, ``pipedream train --runtime torch``).

Each rank builds the whole model from the same seed, cuts it into the plan's stages as our runtime does
(:func:`pipedream.runtime.stage.build_stages`), keeps the ``v`` chunks it runs (:mod:`pipedream.torch_layout`)
and wraps each in a ``torch.distributed.pipelining.PipelineStage`` on its pipeline's process group, with the boundary
shapes known from the split (no shape inference at the first step). torch's schedule class
(:data:`pipedream.torch_schedules.TORCH_CLASSES`) runs each minibatch: ``schedule.step`` on the minibatch's ``m``
microbatches, given pre-split (``arg_mbs``, ``target_mbs``) so that every runtime trains on the same samples, the
loss ``criterion(output, target)`` averaged over the microbatches (``scale_grads``). After the step, each stage's
gradients are averaged over its ``w`` replicas (one per parallel pipeline) and a parameter that stages on several
ranks hold (tied embeddings) has its gradients summed over them (:mod:`pipedream.runtime.shared`); then the
learning-rate policy, clipping (over this rank's parameters) and the optimizer step. Every wait is bounded by the
process group's timeout (``--comm-timeout-s``).

The rest is the PipeDream worker's (:mod:`pipedream.runtime.worker`): the same data order, progress bar, checkpoints
(every minibatch ends in a flush, so a checkpoint may follow any), fault injection, validation (forward only, one
stage after another: :func:`forward_only`) and ``metrics.json`` rows, with ``iteration_s``, the mean seconds of one
minibatch.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pipedream.capture import flat_inputs
from pipedream.data import fashion_mnist as fm
from pipedream.errors import PipeDreamError
from pipedream.plan import Plan
from pipedream.runtime import assemble, lr, shared
from pipedream.runtime import checkpoint as ckpt
from pipedream.runtime import distributed as D
from pipedream.runtime.comm import wait_or_raise
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.optim import hidden_matrices, make_optimizer
from pipedream.runtime.stage import Boundary, build_stages
from pipedream.runtime.task import load_task
from pipedream.runtime.worker import Batches, load_plan, minibatches_per_epoch
from pipedream.torch_layout import TorchLayout, layout, place
from pipedream.torch_schedules import chunks_of, torch_ops


def torch_plan(cfg: TrainConfig, model: nn.Module, world: int, example: Any) -> Plan:
    """The run's plan: ``cfg.plan``, or an even split of the layers into ``world x v`` stages placed as torch's
    schedule places them (:func:`pipedream.torch_layout.place`).

    Raises:
        PipeDreamError: the checks of :func:`pipedream.runtime.worker.load_plan`.
    """
    if cfg.plan is not None:
        return load_plan(cfg, model, world, example)
    v = chunks_of(cfg.schedule)
    return place(load_plan(cfg, model, world * v, example), cfg.schedule, world)


def microbatch_size(cfg: TrainConfig, width: int) -> int:
    """Samples of one microbatch: ``batch_size / (w m)`` (``w`` pipelines share each minibatch).

    Raises:
        PipeDreamError: ``batch_size`` is not a multiple of ``w m``.
    """
    if cfg.batch_size % (width * cfg.microbatches):
        raise PipeDreamError(f"--batch-size {cfg.batch_size} does not split into {width} pipelines x "
                             f"{cfg.microbatches} microbatches; use a multiple of {width * cfg.microbatches}")
    return cfg.batch_size // (width * cfg.microbatches)


class GradSync:
    """The gradient sums after torch's step: each local stage's gradients averaged over its replicas, then the
    parameters that stages on several ranks of one pipeline hold summed over those ranks.

    Args:
        lay: the plan's layout on torch's pipelines.
        held: every parameter several stages hold (:func:`pipedream.runtime.shared.find`), the same list everywhere.
        modules: this rank's stage modules by stage index.
        timeout_s: longest wait for one allreduce, s.
    Every rank constructs it in the same order (``torch.distributed.new_group`` is collective).
    """

    def __init__(self, lay: TorchLayout, held: list[shared.Shared], modules: dict[int, nn.Module],
                 timeout_s: float) -> None:
        rank = dist.get_rank()
        self.timeout_s = timeout_s
        self.replica: list[tuple[Any, list[torch.Tensor]]] = []  # (group, gradients-bearing params) per stage
        for q in range(lay.depth):
            ranks = lay.replicas_at(q)
            group = dist.new_group(ranks) if lay.width > 1 else None
            if rank in ranks:
                for s in lay.stages_of(rank):
                    self.replica.append((group, list(modules[s].parameters())))
        self.tied: list[tuple[Any, list[torch.Tensor]]] = []
        pipeline = lay.pipelines[lay.pipeline_of(rank)]
        for sh in held:
            for ranks in lay.pipelines:
                holders = sorted({ranks[lay.position[s]] for s in sh.stages})
                group = dist.new_group(holders) if len(holders) > 1 else None
                if group is not None and ranks is pipeline and rank in holders:
                    s = next(s for s in sh.stages if s in modules)
                    self.tied.append((group, [dict(modules[s].named_parameters())[sh.name_in(s)]]))
        self.width = lay.width

    def _allreduce(self, group: Any, params: list[torch.Tensor], divisor: float, what: str) -> None:
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads]).div_(divisor)
        wait_or_raise(dist.all_reduce(flat, group=group, async_op=True), self.timeout_s, what)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def __call__(self) -> None:
        """Average over the replicas, then sum the tied parameters (before the step)."""
        if self.width > 1:
            for group, params in self.replica:
                self._allreduce(group, params, self.width, "gradient average over the pipelines")
        for group, params in self.tied:
            self._allreduce(group, params, 1.0, "sum of the gradients of a parameter several stages hold")


class FreshOutputs(nn.Module):
    """A stage whose boundary outputs are copies: torch's split backward (the I of the zero-bubble and DualPipeV
    schedules, ``stage_backward_input``) detaches a stage's outputs in place once it has their input gradients, and a
    tensor that its own operation saved for the backward then fails the W that follows ("a saved tensor that has been
    detached in-place"). A copy is saved by nothing."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        out = self.inner(*args)
        fresh = [t.clone() if isinstance(t, torch.Tensor) and t.requires_grad else t for t in Boundary.unpack(out)]
        return tuple(fresh) if isinstance(out, tuple | list) else fresh[0]


def split_backward(lay: TorchLayout, microbatches: int) -> bool:
    """Whether torch's schedule of ``lay`` runs the backward as I and W apart (its lists have an ``I``)."""
    ops = torch_ops(lay.schedule, lay.depth, microbatches, lay.chunks)
    return any(kind == "I" for rank in ops for _, kind, _ in rank)


def _pipeline_stages(lay: TorchLayout, modules: dict[int, nn.Module], boundaries: list[Boundary], example: Any,
                     micro: int, microbatches: int, device: torch.device, group: Any) -> list[Any]:
    """This rank's ``PipelineStage`` objects, stages in increasing order, with the boundary shapes of a microbatch
    (modules that are not the last wrapped in :class:`FreshOutputs` where the backward is split)."""
    from torch.distributed.pipelining import PipelineStage

    out = []
    fresh = split_backward(lay, microbatches)
    for s, module in modules.items():
        if s == 0:
            args = tuple(t[:1].expand(micro, *t.shape[1:]).contiguous().to(device) for t in flat_inputs(example))
        else:
            args = tuple(torch.empty(shape, dtype=dtype, device=device).requires_grad_(dtype.is_floating_point)
                         for shape, dtype in boundaries[s - 1].batched(micro))
        wrapped = FreshOutputs(module) if fresh and s + 1 < lay.stages else module
        out.append(PipelineStage(wrapped, s, lay.stages, device, input_args=args, group=group))
    return out


def forward_only(lay: TorchLayout, pipe: int, modules: dict[int, nn.Module], boundaries: list[Boundary],
                 inputs: tuple[torch.Tensor, ...] | None, micro: int, device: torch.device, timeout_s: float) -> Any:
    """One microbatch of ``micro`` samples forward through pipeline ``pipe``'s stages, one stage after another, for
    validation (torch's ``schedule.eval`` does not run the V-shaped schedules): every rank of the pipeline calls it;
    ``inputs`` on the first stage's rank. Returns the model output on the last stage's rank, else None.

    Raises:
        CommTimeout: a neighbour did not send or receive within ``timeout_s``.
    """
    ranks, me = lay.pipelines[pipe], dist.get_rank()
    value: Any = inputs
    for s in range(lay.stages):
        owner, prev = ranks[lay.position[s]], ranks[lay.position[s - 1]] if s else None
        if prev is not None and prev != owner and me in (prev, owner):
            what = f"validation activation from stage {s - 1} to stage {s}"
            if me == prev:
                for t in value:
                    wait_or_raise(dist.isend(t.contiguous(), owner), timeout_s, what)
            else:
                value = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in boundaries[s - 1].batched(micro)]
                for t in value:
                    wait_or_raise(dist.irecv(t, prev), timeout_s, what)
        if me == owner:
            out = modules[s](*value)
            value = Boundary.unpack(out) if s + 1 < lay.stages else out
    return value if me == ranks[lay.position[-1]] else None


def _schedule(lay: TorchLayout, stages: list[Any], microbatches: int, criterion: Any) -> Any:
    """torch's schedule class of ``lay`` over this rank's ``stages``, loss ``criterion``, gradients averaged over
    the microbatches."""
    from torch.distributed.pipelining import schedules as ts

    cls = getattr(ts, lay.torch_class)
    single = issubclass(cls, ts.PipelineScheduleSingle)
    return cls(stages[0] if single else stages, microbatches, loss_fn=criterion, scale_grads=True)


def train(cfg: TrainConfig) -> None:
    """Run the whole training on this rank (call inside an initialised process group)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out_dir = cfg.run_dir("pipedream")
    device = D.run_device()
    task = load_task(cfg)
    model = task.model
    m = cfg.microbatches
    probe = task.example if isinstance(model, nn.Sequential) else task.input_batch(1)
    plan = torch_plan(cfg, model, world, probe)
    lay = layout(plan, cfg.schedule)
    micro = microbatch_size(cfg, lay.width)
    example = task.example if isinstance(model, nn.Sequential) else task.input_batch(micro)
    hidden = hidden_matrices(model, task.example) if cfg.optimizer == "muon" else []
    split = build_stages(model, plan, example)
    shared.check(split.shared, [s.replicas for s in plan.stages], cfg.schedule, cfg.clip_norm)
    mine = lay.stages_of(rank)
    modules = {s: split.modules[s].to(device) for s in mine}
    pipe = lay.pipeline_of(rank)
    groups = [dist.new_group(ranks) if lay.width > 1 else None for ranks in lay.pipelines]  # same order everywhere
    sync = GradSync(lay, split.shared, modules, cfg.comm_timeout_s)
    boundaries = split.boundaries
    stages = _pipeline_stages(lay, modules, boundaries, example, micro, m, device, groups[pipe])
    del model, split
    sched = _schedule(lay, stages, m, task.criterion)
    params = list({id(p): p for s in mine for p in modules[s].parameters()}.values())  # a tied one once
    optimizer = make_optimizer(cfg, params, hidden)
    first, last = 0 in mine, lay.stages - 1 in mine

    train_split, val_split = task.train, task.val
    nb = minibatches_per_epoch(cfg, len(train_split), [lay.width])
    n_val = len(val_split) // (micro * m * lay.width)  # validation iterations: every pipeline takes m microbatches
    reporter = rank == lay.pipelines[0][lay.position[-1]]
    bar = D.progress_bar(cfg, reporter, nb)
    fault = D.fault(rank)
    restarted = D.restart_count() > 0
    noted = [rank == 0 and restarted]

    def step(batches: Batches, k: int) -> list[torch.Tensor]:
        """Minibatch ``k`` of ``batches`` through torch's schedule: the losses of its microbatches on the rank of
        this pipeline's last stage (empty elsewhere)."""
        js = range(pipe * m, (pipe + 1) * m)
        args = [tuple(t.to(device) for t in flat_inputs(batches.inputs(k, j))) for j in js] if first else None
        targets = [batches.labels(k, j).to(device) for j in js] if last else None
        losses: list[torch.Tensor] = []
        sched.step(arg_mbs=args, target_mbs=targets, losses=losses if last else None, return_outputs=False)
        return losses

    def validate(batches: Batches, k: int) -> list[float]:
        """(correct, counted, loss sum, samples) of minibatch ``k``'s microbatches on this rank."""
        sums = [0.0] * 4
        for j in range(pipe * m, (pipe + 1) * m):
            x = tuple(t.to(device) for t in flat_inputs(batches.inputs(k, j))) if first else None
            out = forward_only(lay, pipe, modules, boundaries, x, micro, device, cfg.comm_timeout_s)
            if out is not None:
                y = batches.labels(k, j).to(device)
                correct, counted = task.count_correct(out, y)
                sums = [a + b for a, b in zip(sums, [correct, counted, float(task.criterion(out, y)) * micro, micro],
                                              strict=True)]
        return sums

    def part(position: tuple[int, int], rows: list[dict[str, float]], sums: list[float]) -> dict[str, Any]:
        return {"position": list(position), "stages": mine, "pipelines": lay.pipelines,
                "modules": {s: modules[s].state_dict() for s in mine}, "optimizer": optimizer.state_dict(),
                "rng": torch.get_rng_state(), "rows": rows, "partial": sums, "cadence": cadence.state()}

    cadence = ckpt.Cadence(cfg.checkpoint_every, 1, 1, cfg.checkpoint_overhead)
    ck = ckpt.Checkpointer(out_dir, rank, world, cfg.comm_timeout_s) if cfg.checkpoint else None
    (start_epoch, start_mb), rows, partial = (0, 0), [], []
    if cfg.resume or restarted:
        restore_unix_s = time.time()
        got = ckpt.restore(out_dir, rank, (rank,), cfg.comm_timeout_s)
        if got is not None:
            (start_epoch, start_mb), (state,) = got
            if state["stages"] != mine or state["pipelines"] != lay.pipelines:
                raise PipeDreamError(f"the checkpoint is for stages {state['stages']} on {state['pipelines']}, not "
                                     f"{mine} on {lay.pipelines}; resume with the same plan or a fresh --out-dir")
            for s in mine:
                modules[s].load_state_dict(state["modules"][s])
            optimizer.load_state_dict(state["optimizer"])
            torch.set_rng_state(state["rng"])
            cadence.load_state(state["cadence"])
            rows, partial = list(state["rows"]), [float(x) for x in state["partial"]]
        if rank == 0 and restarted:
            ckpt.note_restart(out_dir, None if got is None else got[0], restore_unix_s)

    log = D.MetricsLog(out_dir, rows)
    wall0 = time.time() - (rows[-1]["wall_time_s"] if rows else 0.0)
    for epoch in range(start_epoch, cfg.epochs):
        order = fm.minibatch_indices(len(train_split), cfg.batch_size, cfg.seed, epoch)
        batches = Batches(train_split, order, micro)
        resumed = epoch == start_epoch and start_mb > 0
        # loss sum, loss count, samples, training seconds (checkpoints included), seconds held by checkpoints, checkpoints
        sums = list(partial) if resumed else [0.0] * 6
        D.barrier(cfg.comm_timeout_s, f"start of epoch {epoch + 1}")
        if bar is not None:
            bar.reset(total=nb)
            bar.set_description(f"epoch {epoch + 1}/{cfg.epochs}")
            bar.update(start_mb if resumed else 0)
        for module in modules.values():
            module.train()
        k = start_mb if resumed else 0
        while k < nb:
            n, t0 = cadence.count(nb - k), time.time()
            for kk in range(k, k + n):
                optimizer.zero_grad()
                losses = step(batches, kk)
                sync()
                lr.before_step(cfg, optimizer, params, epoch + kk / nb)
                optimizer.step()
                if last:
                    sums[0] += float(torch.stack(losses).detach().sum()) * micro
                    sums[1] += micro * len(losses)
                    sums[2] += micro * len(losses)
                if bar is not None:
                    bar.update(1)
                if noted[0]:
                    noted[0] = False
                    ckpt.note_first_minibatch(out_dir)
                if fault is not None and epoch * nb + kk >= fault[0]:
                    D.inject_fault(out_dir, fault[1], epoch, kk + 1)
            seg_s = time.time() - t0
            sums[3] += seg_s
            k += n
            if ck is not None and cadence.due and k < nb:
                held_s = ck.snapshot((epoch, k), part((epoch, k), log.rows, sums))
                sums[3:] = [sums[3] + held_s, sums[4] + held_s, sums[5] + 1]
                cadence.measured(seg_s, n, ck, cfg.comm_timeout_s)
        loss_sum, loss_n, samples = D.allreduce_sum(sums[:3], cfg.comm_timeout_s, "end-of-epoch loss reduction")
        epoch_time = sums[3]
        for module in modules.values():
            module.eval()
        val_sums = [0.0] * 4  # correct, counted, loss sum, loss count
        val = Batches(val_split, torch.arange(n_val * micro * m * lay.width).view(n_val, -1), micro)
        with torch.no_grad():
            for kk in range(n_val):
                val_sums = [a + b for a, b in zip(val_sums, validate(val, kk), strict=True)]
        correct, counted, vloss, vn = D.allreduce_sum(val_sums, cfg.comm_timeout_s, "validation reduction")
        row = {"epoch": epoch + 1, "epoch_time_s": epoch_time, "train_loss": loss_sum / max(loss_n, 1),
               "val_accuracy": correct / max(counted, 1), "val_loss": vloss / max(vn, 1),
               "samples_per_s": samples / epoch_time, "iteration_s": (epoch_time - sums[4]) / nb,
               "wall_time_s": time.time() - wall0, "train_samples": samples}
        if ck is not None:
            row.update(cadence.figures(sums[4], int(sums[5]), epoch_time))
        D.log_epoch(row, log, rank == 0, bar)
        if cfg.score_epochs:  # this epoch's model, for the launcher to score after training (not timed)
            t0 = time.time()
            for s in mine if pipe == 0 else []:
                assemble.save_stage(out_dir, s, modules[s], lay.stages if rank == 0 and s == 0 else None, epoch + 1)
            D.barrier(cfg.comm_timeout_s, f"epoch {epoch + 1}'s model saved")
            wall0 += time.time() - t0
        if ck is not None:
            ck.snapshot((epoch + 1, 0), part((epoch + 1, 0), log.rows, []))
    if ck is not None:
        ck.wait()
    if bar is not None:
        bar.close()
    if pipe == 0:
        for s in mine:
            assemble.save_stage(out_dir, s, modules[s], lay.stages if rank == 0 and s == 0 else None)
    if cfg.debug_dump:
        path = out_dir / "debug" / f"rank{rank}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"stages": mine, "params": {n: p.detach().cpu() for s in mine
                                               for n, p in modules[s].named_parameters()}}, path)
    D.barrier(cfg.comm_timeout_s, "end of training")


def main(argv: list[str] | None = None) -> None:
    """torchrun entry point: parse the options of :class:`TrainConfig` and train on torch's runtime."""
    D.worker_main(argv, "python -m pipedream.runtime.torch_worker", __doc__, "pipedream", train)


if __name__ == "__main__":
    main()
