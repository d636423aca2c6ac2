"""The PipeDream runtime on several gloo processes, checked against single-process references.

Each test starts a few workers (:func:`pipedream.runtime.launch.spawn_local`) on a tiny model and tiny
IDX data, and compares the per-rank debug dumps (losses, first applied gradients, final weights,
weight-version traces) with numbers computed here in one process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pipedream import schedules
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.launch import spawn_local
from pipedream.runtime.stage import straight_plan
from tests.tiny import (
    bn_model,
    build,
    linear_model,
    reference_batches,
    stage_params,
    stash_model,
    tiny_model,
    tuple_model,
    write_data,
)

pytestmark = pytest.mark.slow
LAYERS = [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]  # the even split of tiny_model on 4 stages


def run(tmp_path: Path, workers: int, factory=tiny_model, plan=None, fn=None, env=None,  # type: ignore[no-untyped-def]
        **kw) -> list[dict]:
    """Train on ``workers`` ranks (``fn``: the PipeDream worker by default) and load their debug dumps."""
    data = write_data(tmp_path / "data")
    if plan is not None:
        plan.save(tmp_path / "plan.json")
    cfg = TrainConfig(model="tiny", model_factory=factory, data_dir=str(data), out_dir=str(tmp_path / "out"),
                      progress=False, debug_dump=True, comm_timeout_s=30, plan=str(tmp_path / "plan.json") if plan else None,
                      **{"epochs": 1, "batch_size": 8, "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0, **kw})
    spawn_local(cfg, workers, fn=fn, env=env, timeout_s=180)
    return [torch.load(tmp_path / "out" / "debug" / f"rank{r}.pt", weights_only=False) for r in range(workers)]


def test_1f1b_first_minibatch_matches_single_process(tmp_path: Path) -> None:
    dumps = run(tmp_path, 4, max_minibatches=8)
    model = build(tiny_model)
    x, y = reference_batches(tmp_path / "data", 8, 0, 0)[0]
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    m, j, pipeline_loss = dumps[3]["losses"][0][0]
    assert (m, j) == (0, 0)
    assert pipeline_loss == pytest.approx(float(loss.detach()), rel=1e-6)
    for s, d in enumerate(dumps):  # minibatch 0 is every stage's first update, at version 0
        ref = {n: p.grad for n, p in stage_params(model, LAYERS[s]).items()}
        assert d["first_grads"].keys() == ref.keys()
        for n in ref:
            torch.testing.assert_close(d["first_grads"][n], ref[n], rtol=1e-5, atol=1e-7)


def _steps_before(actions: list[schedules.Action]) -> dict[int, int]:
    """Minibatch -> number of STEPs that precede its forward in a rank's list."""
    steps, out = 0, {}
    for a in actions:
        if a.kind == schedules.Kind.STEP:
            steps += 1
        elif a.kind == schedules.Kind.F:
            out[a.minibatch] = steps
    return out


def test_weight_stashing_backward_uses_the_forwards_version(tmp_path: Path) -> None:
    dumps = run(tmp_path, 4, max_minibatches=8)
    sched = schedules.build("1f1b", schedules.consecutive_ranks([1, 1, 1, 1]), 8)
    for rank, d in enumerate(dumps):
        fwd = {m: v for kind, _, m, _, v in d["trace"] if kind == "F"}
        bwd = {m: v for kind, _, m, _, v in d["trace"] if kind == "B"}
        assert fwd == bwd
        assert fwd == _steps_before(sched.order[rank])  # forward uses the newest version
    assert dumps[0]["max_versions"] == 4  # the input stage stashes NOAM = 4 versions


# 1F1B on 2 stages (NOAM = 2): rank 0 runs F0 F1 B0 STEP F2 B1 STEP F3 ..., rank 1 runs F0 B0 STEP F1 B1 STEP
# ...; so minibatch m meets version max(m - 1, 0) of stage 0 (m - 1 steps precede its forward) and version m
# of stage 1, and weight stashing keeps that version for the backward.
STASH_VERSIONS = [[0, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5]]  # [stage][minibatch]
STASH_STAGES = [range(0, 5), range(5, 6)]  # layers of stash_model per stage


def _stash_reference(batches, lr: float) -> list[dict[str, torch.Tensor]]:  # type: ignore[no-untyped-def]
    """Weights after each 1F1B step of weight stashing, computed in one process: minibatch m runs forward
    and backward through the whole model with each stage's weights at ``STASH_VERSIONS[stage][m]`` (one
    autograd graph, so the gradient stage 0 gets is the one stage 1 computed at its version), and each
    stage then applies the gradient to its newest weights: ``W_s(m + 1) = W_s(m) - lr * grad_s``."""
    model = build(stash_model)
    names = [list(stage_params(model, layers)) for layers in STASH_STAGES]
    history = [{n: p.detach().clone() for n, p in model.named_parameters()}]  # history[k]: after k steps
    for m, (x, y) in enumerate(batches):
        params = {n: history[STASH_VERSIONS[s][m]][n].clone().requires_grad_() for s in (0, 1) for n in names[s]}
        loss = F.cross_entropy(torch.func.functional_call(model, params, (x,)), y)
        grads = dict(zip(params, torch.autograd.grad(loss, list(params.values())), strict=True))
        history.append({n: history[-1][n] - lr * grads[n] for n in history[-1]})
    return history


def test_weight_stashing_equals_the_hand_computed_updates(tmp_path: Path) -> None:
    """Six minibatches of 1F1B on 2 stages: the final weights are those of :func:`_stash_reference`.

    Stage 0's backward of minibatch m >= 2 runs one step after its forward; without stashing it would
    read the newer weights of layer 3 and this comparison fails (checked by hand: overwriting every
    stashed version with the newest weights at each step made it fail)."""
    lr = 0.1
    dumps = run(tmp_path, 2, factory=stash_model, plan=straight_plan("t", 6, [5, 1]), max_minibatches=6, lr=lr)
    for s, d in enumerate(dumps):
        for kind in ("F", "B"):
            assert [v for k, _, _, _, v in d["trace"] if k == kind] == STASH_VERSIONS[s]
    history = _stash_reference(reference_batches(tmp_path / "data", 8, 0, 0)[:6], lr)
    final = {**dumps[0]["params"], **dumps[1]["params"]}
    assert final.keys() == history[-1].keys()
    for n, w in history[-1].items():
        torch.testing.assert_close(final[n], w, rtol=1e-5, atol=1e-6)


def test_vertical_sync_every_stage_uses_the_input_stages_version(tmp_path: Path) -> None:
    dumps = run(tmp_path, 4, max_minibatches=8, weight_sync="vertical")
    per_stage = [{m: v for kind, _, m, _, v in d["trace"] if kind == "F"} for d in dumps]
    assert per_stage[0] == {m: max(m - 3, 0) for m in range(8)}
    assert all(p == per_stage[0] for p in per_stage)
    for d in dumps:
        assert {m: v for kind, _, m, _, v in d["trace"] if kind == "B"} == per_stage[0]


@pytest.mark.parametrize("replicas", [[2, 1], [1, 2]])
def test_vertical_sync_on_replicated_stages_carries_update_counts(tmp_path: Path, replicas: list[int]) -> None:
    """Minibatch m carries c(m) = updates in the input stage's weights at its forward (version x replicas
    there); every stage runs its forward and backward on its newest version with at most c(m) updates."""
    plan = straight_plan("t", 8, [4, 4], replicas=replicas)
    dumps = run(tmp_path, 3, plan=plan, max_minibatches=8, weight_sync="vertical")
    sched = schedules.build("1f1b", schedules.consecutive_ranks(replicas), 8)
    carried = {m: replicas[0] * steps for r in plan.stages[0].ranks for m, steps in _steps_before(sched.order[r]).items()}
    assert sorted(carried) == list(range(8)) and max(carried.values()) > 0
    for d in dumps:
        r = replicas[d["stage"]]  # updates per version of this stage
        mine = {m for _, _, m, _, _ in d["trace"]}
        for kind in ("F", "B"):
            updates = {m: v * r for k, _, m, _, v in d["trace"] if k == kind}
            assert updates == {m: carried[m] - carried[m] % r for m in mine}
            if replicas == [2, 1]:  # every stage's weights hold exactly the carried updates
                assert updates == {m: carried[m] for m in mine}


def reference(batches, steps: int, optimizer: str = "sgd", lr: float = 0.1, momentum: float = 0.0,  # type: ignore[no-untyped-def]
              wd: float = 0.0, factory=tiny_model, microbatches: int = 1):
    """The model after ``steps`` single-process steps on ``batches``, and the gradients of the first step; with
    ``microbatches`` each step's gradient is the sum over the minibatch's consecutive microbatches of their mean
    loss / ``microbatches`` (the same as the whole minibatch's unless a layer, e.g. BatchNorm, mixes samples)."""
    model = build(factory)
    opt = (torch.optim.Adam(model.parameters(), lr=lr, weight_decay=wd) if optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=wd))
    first = None
    for x, y in batches[:steps]:
        opt.zero_grad()
        for xj, yj in zip(x.chunk(microbatches), y.chunk(microbatches), strict=True):
            (F.cross_entropy(model(xj), yj) / microbatches).backward()
        if first is None:
            first = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
    return model, first


@pytest.mark.parametrize("schedule,optimizer,lr", [("gpipe", "sgd", 0.1), ("gpipe", "adam", 0.01),
                                                   ("pipedream_flush", "sgd", 0.1), ("pipedream_flush", "adam", 0.01)])
def test_gpipe_equals_synchronous_training(tmp_path: Path, schedule: str, optimizer: str, lr: float) -> None:
    """GPipe and PipeDream-Flush: W(t + 1) = W(t) - lr * grad f(W(t)), synchronous training on the whole
    minibatch, with one weight version (every microbatch of minibatch t on version t, one copy of the weights)."""
    # with a throttled link (50 MB/s): slower, never different
    dumps = run(tmp_path, 4, schedule=schedule, microbatches=4, max_minibatches=3, momentum=0.9, weight_decay=5e-4,
                optimizer=optimizer, lr=lr, emulate_bandwidth_Bps=5e7)
    for d in dumps:
        assert {(m, v) for _, _, m, _, v in d["trace"]} == {(0, 0), (1, 1), (2, 2)}
        assert max(d["copies"]) == 1 and d["max_versions"] == 1
    model, first = reference(reference_batches(tmp_path / "data", 8, 0, 0), 3, optimizer, lr, 0.9, 5e-4)
    for s, d in enumerate(dumps):
        for n, p in stage_params(model, LAYERS[s]).items():
            torch.testing.assert_close(d["params"][n], p.detach(), rtol=1e-5, atol=1e-6)
        ref_first = {f"{i}.{k}": first[f"{i}.{k}"] for i in LAYERS[s] for k in ("weight", "bias") if f"{i}.{k}" in first}
        for n, g in ref_first.items():
            torch.testing.assert_close(d["first_grads"][n], g, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("schedule,replicas,optimizer,lr", [("gpipe", [2, 1], "sgd", 0.1), ("gpipe", [1, 2], "adam", 0.01),
                                                            ("pipedream_flush", [2, 1], "adam", 0.01)])
def test_gpipe_on_replicated_stages_equals_synchronous_training(tmp_path: Path, schedule: str, replicas: list[int],
                                                                optimizer: str, lr: float) -> None:
    """Replicas take a minibatch's microbatches round robin and sum gradients at the flush: still SGD (GPipe and
    PipeDream-Flush)."""
    plan = straight_plan("t", 8, [4, 4], replicas=replicas)
    dumps = run(tmp_path, 3, plan=plan, schedule=schedule,
                microbatches=4, max_minibatches=3, momentum=0.9, weight_decay=5e-4, optimizer=optimizer, lr=lr)
    model, first = reference(reference_batches(tmp_path / "data", 8, 0, 0), 3, optimizer, lr, 0.9, 5e-4)
    halves = [range(0, 4), range(4, 8)]
    for rank, d in enumerate(dumps):
        layers = halves[d["stage"]]
        replica = plan.stages[d["stage"]].ranks.index(rank)  # runs microbatches replica, replica + r, ...
        assert sorted({j for k, _, _, j, _ in d["trace"]}) == list(range(replica, 4, replicas[d["stage"]]))
        for n, p in stage_params(model, layers).items():
            torch.testing.assert_close(d["params"][n], p.detach(), rtol=1e-5, atol=1e-6)
        ref_first = {f"{i}.{k}": first[f"{i}.{k}"] for i in layers for k in ("weight", "bias") if f"{i}.{k}" in first}
        for n, g in ref_first.items():
            torch.testing.assert_close(d["first_grads"][n], g, rtol=1e-5, atol=1e-7)


def test_2bw_one_microbatch_in_flight_equals_sgd(tmp_path: Path) -> None:
    """One stage, one microbatch: nothing is in flight, 2BW's delay term vanishes only in its first step."""
    dumps = run(tmp_path, 2, schedule="2bw", microbatches=2, max_minibatches=1, plan=straight_plan("t", 8, [4, 4]))
    model, first = reference(reference_batches(tmp_path / "data", 8, 0, 0), 1, "sgd", 0.1, 0.0, 0.0)
    for s, layers in enumerate([range(0, 4), range(4, 8)]):
        for n, p in stage_params(model, layers).items():
            torch.testing.assert_close(dumps[s]["params"][n], p.detach(), rtol=1e-5, atol=1e-6)


def _2bwreference(batches, lr: float) -> list[dict[str, torch.Tensor]]:  # type: ignore[no-untyped-def]
    """Weights of :func:`linear_model` after each 2BW update ``W(t+1) = W(t) - lr * grad f_t(W(t-1))``."""
    ws = [{n: p.detach().clone() for n, p in build(linear_model).named_parameters()}]
    for t, (x, y) in enumerate(batches):
        old = {n: w.clone().requires_grad_() for n, w in ws[max(t - 1, 0)].items()}
        h = F.linear(x.flatten(1), old["1.weight"], old["1.bias"])
        loss = F.cross_entropy(F.linear(h, old["2.weight"], old["2.bias"]), y)
        grads = dict(zip(old, torch.autograd.grad(loss, list(old.values())), strict=True))
        ws.append({n: ws[t][n] - lr * grads[n] for n in ws[t]})
    return ws


def test_2bw_update_rule_on_a_linear_model(tmp_path: Path) -> None:
    """W(t+1) = W(t) - lr * grad f_t(W(t-1)) over two epochs of two minibatches of two microbatches."""
    lr = 0.05
    dumps = run(tmp_path, 2, factory=linear_model, schedule="2bw", microbatches=2, max_minibatches=2, epochs=2,
                lr=lr, plan=straight_plan("t", 3, [2, 1]))
    batches = [b for e in range(2) for b in reference_batches(tmp_path / "data", 8, 0, e)[:2]]
    ws = _2bwreference(batches, lr)
    final = {**dumps[0]["params"], **dumps[1]["params"]}  # stages keep the model's parameter names
    for n, w in ws[-1].items():
        torch.testing.assert_close(final[n], w, rtol=1e-5, atol=1e-6)
    # minibatch t (numbered per epoch in the trace) runs on version max(t - 1, 0) on both stages
    for d in dumps:
        assert [v for kind, _, _, j, v in d["trace"] if kind == "F" and j == 0] == [0, 0, 1, 2]
    assert max(d["max_versions"] for d in dumps) == 2


def test_2bw_update_rule_on_replicated_stages(tmp_path: Path) -> None:
    """Plan 2-1: replicas take microbatches round robin, sum the coalesced gradients, and the update is
    still W(t+1) = W(t) - lr * grad f_t(W(t-1)) over the whole minibatch (two epochs of two minibatches)."""
    lr = 0.05
    dumps = run(tmp_path, 3, factory=linear_model, schedule="2bw", microbatches=4, max_minibatches=2, epochs=2,
                lr=lr, plan=straight_plan("t", 3, [2, 1], replicas=[2, 1]))
    batches = [b for e in range(2) for b in reference_batches(tmp_path / "data", 8, 0, e)[:2]]
    ws = _2bwreference(batches, lr)
    for rank, d in enumerate(dumps):
        final = d["params"]  # stages keep the model's parameter names
        assert final.keys() == {n for n in ws[-1] if n.startswith("1.") == (d["stage"] == 0)}
        for n, w in final.items():
            torch.testing.assert_close(w, ws[-1][n], rtol=1e-5, atol=1e-6)
        # this rank's microbatches of minibatch t (per epoch in the trace) run on version max(t - 1, 0)
        assert sorted({j for _, _, _, j, _ in d["trace"]}) == ([rank, rank + 2] if d["stage"] == 0 else [0, 1, 2, 3])
        first_micro = min(j for _, _, _, j, _ in d["trace"])
        assert [v for k, _, _, j, v in d["trace"] if k == "F" and j == first_micro] == [0, 0, 1, 2]
        assert sorted(v for k, *_, v in d["trace"] if k == "B") == sorted(v for k, *_, v in d["trace"] if k == "F")
    assert max(d["max_versions"] for d in dumps) == 2


def test_replicated_stage_round_robin_and_gradient_sync(tmp_path: Path) -> None:
    plan = straight_plan("t", 8, [4, 4], replicas=[2, 1])
    dumps = run(tmp_path, 3, plan=plan, max_minibatches=4)
    assert sorted({m for k, _, m, _, _ in dumps[0]["trace"] if k == "F"}) == [0, 2]
    assert sorted({m for k, _, m, _, _ in dumps[1]["trace"] if k == "F"}) == [1, 3]
    for n in dumps[0]["params"]:
        assert torch.equal(dumps[0]["params"][n], dumps[1]["params"][n])  # replicas stay identical
    # stage 0's first update averages minibatch 0 (stage 1 at version 0) and minibatch 1 (stage 1 at
    # version 1 = one SGD step on minibatch 0 at lr 0.1 x 1/2, the release's per-stage rate), both at
    # stage 0's version 0
    (x0, y0), (x1, y1) = reference_batches(tmp_path / "data", 8, 0, 0)[:2]
    model = build(tiny_model)
    front, back = model[:4], model[4:]
    F.cross_entropy(back(front(x0)), y0).backward()
    g0 = {n: p.grad.clone() for n, p in front.named_parameters()}
    with torch.no_grad():
        for p in back.parameters():
            p -= 0.05 * p.grad
    front.zero_grad()
    F.cross_entropy(back(front(x1)), y1).backward()
    for n, p in front.named_parameters():
        torch.testing.assert_close(dumps[0]["first_grads"][n], (g0[n] + p.grad) / 2, rtol=1e-5, atol=1e-7)


def test_tuple_boundaries_with_integer_tensors_equal_sgd(tmp_path: Path) -> None:
    """Stages exchange (features, ids) tuples, like GNMT's layers; GPipe must still equal plain SGD."""
    dumps = run(tmp_path, 4, factory=tuple_model, schedule="gpipe", microbatches=2, max_minibatches=3,
                plan=straight_plan("t", 4, [1, 1, 1, 1]))
    model = build(tuple_model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in reference_batches(tmp_path / "data", 8, 0, 0)[:3]:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    for s, d in enumerate(dumps):
        for n, p in stage_params(model, range(s, s + 1)).items():
            torch.testing.assert_close(d["params"][n], p.detach(), rtol=1e-5, atol=1e-6)


def test_gpipe_follows_the_polynomial_lr_policy(tmp_path: Path) -> None:
    """The learning rate of minibatch m is the policy's at progress m / minibatches per epoch (runtime/lr.py)."""
    from pipedream.runtime.lr import lr_at

    dumps = run(tmp_path, 4, schedule="gpipe", microbatches=4, max_minibatches=3, lr_policy="polynomial", lr_power=2.0)
    cfg = TrainConfig(lr=0.1, epochs=1, lr_policy="polynomial", lr_power=2.0)
    model = build(tiny_model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(reference_batches(tmp_path / "data", 8, 0, 0)[:3]):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.param_groups[0]["lr"] = lr_at(cfg, i / 3)  # 0.1, 0.1 (2/3)^2, 0.1 (1/3)^2
        opt.step()
    for s, d in enumerate(dumps):
        for n, p in stage_params(model, LAYERS[s]).items():
            torch.testing.assert_close(d["params"][n], p.detach(), rtol=1e-5, atol=1e-6)


def test_stage_without_parameters_equals_sgd(tmp_path: Path) -> None:
    """Stage 1 holds only ReLU and Flatten (like AlexNet's pooling stages): nothing to update, still SGD."""
    dumps = run(tmp_path, 3, plan=straight_plan("t", 8, [1, 2, 5]), schedule="gpipe", microbatches=2,
                max_minibatches=3, momentum=0.9)
    model, _ = reference(reference_batches(tmp_path / "data", 8, 0, 0), 3, momentum=0.9)
    assert dumps[1]["params"] == {}
    for s, layers in ((0, range(0, 1)), (2, range(3, 8))):
        for n, p in stage_params(model, layers).items():
            torch.testing.assert_close(dumps[s]["params"][n], p.detach(), rtol=1e-5, atol=1e-6)


def _replay(sched: schedules.Schedule, model: torch.nn.Sequential, stages: list[range], batches,  # type: ignore[no-untyped-def]
            lr: float, stage_lr: bool) -> dict[int, dict[str, torch.Tensor]]:
    """Every rank's action list executed in one process, each rank in its own order, a receive waiting for
    its send and an ALLREDUCE for all of its stage's replicas: a forward uses the rank's newest weights and
    its backward the same (stashed) version, an ALLREDUCE averages the gradients the replicas accumulated,
    a STEP is plain SGD at ``lr``, times replicas(s) / replicas(0) with ``stage_lr`` (the release's per-stage
    learning rate). Returns rank -> final weights (whole-model parameter names)."""
    Kind = schedules.Kind
    replicas = [len(ranks) for ranks in sched.stage_ranks]
    lrs = [lr * (r / replicas[0] if stage_lr else 1.0) for r in replicas]
    last = len(stages) - 1
    weights = {r: {n: p.detach().clone() for n, p in stage_params(model, stages[acts[0].stage]).items()}
               for r, acts in sched.order.items()}
    grads = {r: {n: torch.zeros_like(w) for n, w in ws.items()} for r, ws in weights.items()}
    units: dict[tuple[int, int], dict] = {}  # (rank, minibatch) -> the forward's tensors
    msgs: dict[tuple[Kind, int, int], torch.Tensor] = {}  # (send kind, sending stage, minibatch) -> tensor
    pos, reduces = dict.fromkeys(sched.order, 0), dict.fromkeys(sched.order, 0)
    arrived: dict[tuple[int, int], set[int]] = {}  # (stage, k-th allreduce) -> replicas that reached it
    while any(pos[r] < len(acts) for r, acts in sched.order.items()):
        progress = False
        for r, acts in sched.order.items():
            while pos[r] < len(acts):
                a = acts[pos[r]]
                s, m = a.stage, a.minibatch
                if a.kind in (Kind.RECV_F, Kind.RECV_B):
                    if (Kind.SEND_F if a.kind == Kind.RECV_F else Kind.SEND_B, s + (-1 if a.kind == Kind.RECV_F else 1),
                            m) not in msgs:
                        break
                elif a.kind == Kind.ALLREDUCE:
                    group, key = sched.stage_ranks[s], (s, reduces[r])
                    if len(arrived.setdefault(key, set()) | {r}) < len(group):
                        arrived[key].add(r)
                        break
                    if r not in arrived[key]:  # the last replica to arrive averages for all of them
                        arrived[key].add(r)
                        for n in grads[r]:
                            mean = sum(grads[q][n] for q in group) / len(group)
                            for q in group:
                                grads[q][n] = mean.clone()
                    reduces[r] += 1
                elif a.kind == Kind.F:
                    x, y = batches[m]
                    inp = x if s == 0 else msgs[(Kind.SEND_F, s - 1, m)].clone().requires_grad_()
                    params = {n: w.clone().requires_grad_() for n, w in weights[r].items()}
                    # a slice of a Sequential keeps the model's layer names
                    out = torch.func.functional_call(model[stages[s].start:stages[s].stop], params, (inp,))
                    units[(r, m)] = {"inp": inp, "params": params, "out": F.cross_entropy(out, y) if s == last else out}
                elif a.kind == Kind.SEND_F:
                    msgs[(Kind.SEND_F, s, m)] = units[(r, m)]["out"].detach()
                elif a.kind == Kind.B:
                    u = units.pop((r, m))
                    wrt = list(u["params"].values()) + ([u["inp"]] if s > 0 else [])
                    g = torch.autograd.grad(u["out"], wrt, grad_outputs=None if s == last else msgs[(Kind.SEND_B, s + 1, m)])
                    for n, gn in zip(u["params"], g, strict=False):
                        grads[r][n] += gn
                    if s > 0:
                        msgs[(Kind.SEND_B, s, m)] = g[-1]
                elif a.kind == Kind.STEP:
                    weights[r] = {n: w - lrs[s] * grads[r][n] for n, w in weights[r].items()}
                    grads[r] = {n: torch.zeros_like(w) for n, w in weights[r].items()}
                pos[r] += 1
                progress = True
        assert progress, "the action lists deadlock"
    return weights


@pytest.mark.parametrize("replicas,stage_lr", [([1, 1], "sgd"), ([1, 2], "sgd"), ([2, 1], "sgd"), ([1, 3], "sgd"),
                                               ([2, 1], "none")])
def test_replicated_1f1b_equals_a_one_process_replay(tmp_path: Path, replicas: list[int], stage_lr: str) -> None:
    """Six minibatches of 1F1B-RR with weight stashing on replicated stages end at the weights of
    :func:`_replay`, which runs the same action lists in one process; with SGD each stage's learning rate
    is the release's ``lr x replicas(s) / replicas(0)`` unless ``stage_lr`` is ``none``."""
    lr, stages = 0.1, [range(0, 3), range(3, 6)]
    plan = straight_plan("t", 6, [3, 3], replicas=replicas)
    dumps = run(tmp_path, sum(replicas), factory=stash_model, plan=plan, max_minibatches=6, lr=lr, stage_lr=stage_lr)
    sched = schedules.build("1f1b", schedules.consecutive_ranks(replicas), 6)
    expected = _replay(sched, build(stash_model), stages, reference_batches(tmp_path / "data", 8, 0, 0), lr,
                       stage_lr != "none")
    for rank, d in enumerate(dumps):
        assert d["params"].keys() == expected[rank].keys()
        for n, w in expected[rank].items():
            torch.testing.assert_close(d["params"][n], w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("recompute", [False, True])
def test_four_stage_1f1b_equals_a_one_process_replay(tmp_path: Path, recompute: bool) -> None:
    """Eight minibatches of 1F1B with weight stashing on 4 stages, where the input stage holds 4 versions
    at once (copy on write, :class:`pipedream.runtime.versions.WeightVersions`): the final weights are the
    replay's; also when every backward recomputes its forward (on the stashed version it used)."""
    lr, stages = 0.1, [range(0, 2), range(2, 4), range(4, 5), range(5, 6)]
    dumps = run(tmp_path, 4, factory=stash_model, plan=straight_plan("t", 6, [2, 2, 1, 1]), max_minibatches=8, lr=lr,
                recompute=recompute)
    sched = schedules.build("1f1b", schedules.consecutive_ranks([1, 1, 1, 1]), 8)
    expected = _replay(sched, build(stash_model), stages, reference_batches(tmp_path / "data", 8, 0, 0), lr, True)
    for rank, d in enumerate(dumps):
        assert d["params"].keys() == expected[rank].keys()
        for n, w in expected[rank].items():
            torch.testing.assert_close(d["params"][n], w, rtol=1e-5, atol=1e-6)


def test_recomputation_equals_the_one_process_reference(tmp_path: Path) -> None:
    """PipeDream-Flush on 3 stages with every forward recomputed in its backward (torch.utils.checkpoint): the
    gradients and weights are those of one process stepping on the sum over 4 microbatches, and so are
    BatchNorm's running statistics, which the recomputation leaves alone (one update per microbatch)."""
    layers = [range(0, 3), range(3, 5), range(5, 7)]  # conv, BatchNorm, ReLU | Flatten, Linear | Tanh, Linear
    dumps = run(tmp_path, 3, factory=bn_model, plan=straight_plan("t", 7, [3, 2, 2]), schedule="pipedream_flush",
                microbatches=4, max_minibatches=3, momentum=0.9, recompute=True)
    model, first = reference(reference_batches(tmp_path / "data", 8, 0, 0), 3, momentum=0.9, factory=bn_model,
                             microbatches=4)
    for s, d in enumerate(dumps):
        for n, p in stage_params(model, layers[s]).items():
            torch.testing.assert_close(d["first_grads"][n], first[n], rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(d["params"][n], p.detach(), rtol=1e-5, atol=1e-6)
    buffers = dict(model.named_buffers())
    assert dumps[0]["buffers"].keys() == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    assert int(dumps[0]["buffers"]["1.num_batches_tracked"]) == 3 * 4  # once per microbatch, not twice
    for n, b in dumps[0]["buffers"].items():
        torch.testing.assert_close(b, buffers[n], rtol=1e-5, atol=1e-6)
