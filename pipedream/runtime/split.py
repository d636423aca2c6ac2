"""Cut a model into pipeline stages along a plan with ``torch.fx`` (§3.1 partitions of a DAG).

The model is traced once (:func:`trace`; ``"layer"`` granularity keeps every child of an
``nn.Sequential`` whole, ``"op"`` is torch.fx's own granularity where a ResNet block's skip connection
is a branch of the graph; any other module is captured by :mod:`pipedream.capture`, each layer call one
node). Graph nodes get the ids the profiler gives them (:func:`node_ids`), so the
node sets of a :class:`~pipedream.plan.Plan` name the same operations.

Stage ``s`` becomes its own ``fx.GraphModule`` holding only its operations and their sub-modules
(parameter names stay those of the whole model, e.g. ``layer1.0.conv1.weight``; a captured layer's ops are
inlined). A parameter that operations of several stages read is in each of those stages' modules. What crosses the
boundary after stage ``s`` is every value computed at or before stage ``s`` and used after it: a
skip connection that jumps over several stages rides through the stages in between. Values that are
tuples of tensors (GNMT's layers) cross as their flattened tensors and are rebuilt on the other side,
so every stage but the first takes ``*tensors`` and every stage but the last returns a flat tuple of
tensors (the last returns the model output). A chain of layers is the special case with one value
per boundary.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from pipedream.capture import flat_inputs, get_path, run_graph
from pipedream.errors import PipeDreamError
from pipedream.layers import group_layers, guard_inplace, inline, is_layer

OPS = ("call_module", "call_function", "call_method", "get_attr")


def trace(model: nn.Module, granularity: str = "layer", example: Any = None, training: bool = True) -> fx.GraphModule:
    """The model's graph, whose nodes the profiler times and the plans' stages name.

    An ``nn.Sequential``: one node per child (``"layer"``) or torch.fx's leaf modules and functions (``"op"``).
    Any other module is captured on ``example`` (:mod:`pipedream.capture`: torch.export, torch.fx, the Hugging
    Face tracer): ``"layer"`` fuses each layer call into one node; ``"op"`` is torch.fx's graph where fx can
    trace the model, else the captured ops. Export specialises shapes to the example's: capture on a batch of
    the size that will run.

    Raises:
        PipeDreamError: unknown granularity, no example for a module that needs one, or the model cannot be
            captured (one line naming the failing code).
    """
    if granularity not in ("layer", "op"):
        raise PipeDreamError(f"unknown granularity {granularity!r}; use 'layer' or 'op'")
    if isinstance(model, nn.Sequential) or granularity == "op":
        try:
            if granularity == "layer":
                from pipedream.models import trace_layers

                return trace_layers(model)
            return fx.symbolic_trace(model)
        except Exception as e:  # fx raises many types for untraceable code
            if isinstance(model, nn.Sequential) or example is None:
                raise PipeDreamError(f"cannot trace {type(model).__name__} with torch.fx "
                                     f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if example is None:
        raise PipeDreamError(f"capturing {type(model).__name__} needs an example input (a batch of its data)")
    from pipedream import capture

    ops, how = capture.capture_ops(model, example, training)
    gm = group_layers(ops, model) if granularity == "layer" else ops
    gm.meta["captured_by"] = how
    return gm


def node_ids(gm: fx.GraphModule) -> dict[fx.Node, str]:
    """Graph node id (``node<k>``) of every input and operation of ``gm``, as the profiler numbers them.

    Inputs come first (``node0`` ...), then operations in graph order; the output node has no id.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ids = {ph: f"node{k}" for k, ph in enumerate(placeholders)}
    first = max(len(placeholders), 1)
    for k, n in enumerate(n for n in gm.graph.nodes if n.op in OPS):
        ids[n] = f"node{first + k}"
    return ids


@dataclass(frozen=True)
class Cut:
    """One live value at a stage boundary: fx node ``name`` and how many tensors it flattens to.

    Attributes:
        name: the node's name in the traced graph.
        items: ``None`` when the value is one tensor, else the length of its flat tuple of tensors.
    """

    name: str
    items: int | None

    @property
    def width(self) -> int:
        """Number of tensors the value is sent as."""
        return 1 if self.items is None else self.items


@dataclass
class Partition:
    """The stages of one model under one plan.

    Attributes:
        modules: stage ``s``'s ``fx.GraphModule`` (shares the model's parameters).
    """

    modules: list[fx.GraphModule]


def assign(gm: fx.GraphModule, stage_nodes: list[list[str]]) -> dict[fx.Node, int]:
    """Stage index of every operation of ``gm`` (inputs: -1), from the plan's node ids per stage.

    Raises:
        PipeDreamError: an operation in no stage or in two, a node id the graph does not have, or a
            stage that uses a value computed by a later stage.
    """
    ids = node_ids(gm)
    by_id = {v: k for k, v in ids.items()}
    owner: dict[fx.Node, int] = {n: -1 for n in gm.graph.nodes if n.op == "placeholder"}
    for s, nodes in enumerate(stage_nodes):
        for nid in nodes:
            node = by_id.get(nid)
            if node is None:
                raise PipeDreamError(f"plan stage {s} names {nid!r}, which this model's graph does not have "
                                     f"({len(ids)} nodes); was the plan made for another model, preset or granularity?")
            if node.op == "placeholder":
                continue
            if node in owner:
                raise PipeDreamError(f"{nid} ({node.name}) is in stages {owner[node]} and {s}; a node belongs to one stage")
            owner[node] = s
    missing = [ids[n] for n in gm.graph.nodes if n.op in OPS and n not in owner]
    if missing:
        raise PipeDreamError(f"plan leaves nodes {missing[:5]}{' ...' if len(missing) > 5 else ''} in no stage; "
                             "re-plan from a profile of this model at this granularity")
    for n, s in owner.items():
        for src in n.all_input_nodes:
            if owner[src] > s:
                raise PipeDreamError(f"stage {s} needs {ids[src]} ({src.name}) from the later stage {owner[src]}; "
                                     "stages must follow the graph's order")
    return owner


def split(gm: fx.GraphModule, stage_nodes: list[list[str]], example: Any) -> Partition:
    """Cut ``gm`` into ``len(stage_nodes)`` stage modules (see the module docstring).

    Args:
        gm: the traced model (:func:`trace`).
        stage_nodes: graph node ids of every stage, in pipeline order (``Plan.stages[s].nodes``).
        example: a model input of one sample (or a tuple of inputs), run once through ``gm`` in
            evaluation mode to learn which values are tuples.
    Raises:
        PipeDreamError: see :func:`assign`; or a value crossing a boundary that is neither a tensor
            nor a flat tuple of tensors.
    """
    owner = assign(gm, stage_nodes)
    values = _probe(gm, example)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    last = len(stage_nodes) - 1
    users_after = {n: max((owner.get(u, last + 1) for u in n.users), default=-1) for n in owner}
    cuts: list[list[Cut]] = []
    for s in range(last):
        live = [n for n in gm.graph.nodes if n in owner and owner[n] <= s < users_after[n]]
        cuts.append([_cut(n, values[n], s) for n in live])
    cuts.append([])
    modules = [_stage_module(gm, owner, s, cuts[s - 1] if s else None, cuts[s], output if s == last else None)
               for s in range(last + 1)]
    return Partition(modules)


def _probe(gm: fx.GraphModule, example: Any) -> dict[fx.Node, Any]:
    """Every node's value for ``example`` (no gradients, evaluation mode); a layer that fails is named."""
    values: dict[fx.Node, Any] = {}
    was_training = gm.training
    gm.eval()
    try:
        with torch.no_grad():
            run_graph(gm, flat_inputs(example), node_ids(gm), values)
    finally:
        gm.train(was_training)
    return values


def _cut(n: fx.Node, value: Any, s: int) -> Cut:
    if isinstance(value, torch.Tensor):
        return Cut(n.name, None)
    if isinstance(value, tuple | list) and all(isinstance(t, torch.Tensor) for t in value):
        return Cut(n.name, len(value))
    raise PipeDreamError(f"{n.name} crosses the boundary after stage {s} but is {type(value).__name__}, not a tensor or "
                         "a flat tuple of tensors; move the cut so that this value stays inside one stage")


def _stage_module(gm: fx.GraphModule, owner: dict[fx.Node, int], s: int, cut_in: list[Cut] | None,
                  cut_out: list[Cut], output: fx.Node | None) -> fx.GraphModule:
    """Stage ``s`` as a GraphModule: inputs are the model inputs (s = 0) or ``cut_in``'s flat tensors.

    A fused layer of a captured model (:func:`pipedream.layers.group_layers`) is inlined, so the stage's
    parameters have the model's own names; inputs that an in-place op would overwrite are cloned
    (:func:`pipedream.layers.guard_inplace`: a received tensor is a leaf of autograd)."""
    g = fx.Graph()
    env: dict[str, Any] = {}
    root: dict[str, Any] = {}
    if cut_in is None:
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                env[n.name] = g.placeholder(n.name)
    else:
        for c in cut_in:
            flat = [g.placeholder(c.name if c.items is None else f"{c.name}_{k}") for k in range(c.width)]
            env[c.name] = flat[0] if c.items is None else g.call_function(tuple, (flat,))
    for n in gm.graph.nodes:
        if owner.get(n) != s:
            continue
        target = gm.get_submodule(str(n.target)) if n.op == "call_module" else None
        if is_layer(target):
            out = inline(g, target, fx.map_arg(n.args, lambda a: env[a.name]), root)
            env[n.name] = g.call_function(tuple, (list(out),)) if isinstance(out, tuple) else out
            continue
        if n.op in ("get_attr", "call_module"):
            root[str(n.target)] = target if target is not None else get_path(gm, str(n.target))
        env[n.name] = g.node_copy(n, lambda a: env[a.name])
    if output is not None:
        g.output(fx.map_arg(output.args[0], lambda a: env[a.name]))
    else:
        flat_out: list[fx.Node] = []
        for c in cut_out:
            v = env[c.name]
            flat_out += [v] if c.items is None else [g.call_function(operator.getitem, (v, k)) for k in range(c.items)]
        g.output(tuple(flat_out))
    guard_inplace(g, {k: v for k, v in root.items() if isinstance(v, nn.Module)})
    g.lint()
    return fx.GraphModule(root, g, f"{type(gm).__name__}Stage{s}")
