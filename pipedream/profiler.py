"""Per-layer profiling of any ``torch.nn.Module`` with stock PyTorch (paper §3.1, "Profiling").

The model is traced with ``torch.fx``; every operation node (a leaf module, a function such as
``torch.add`` for a residual connection, or a tensor method) becomes one :class:`~pipedream.graph.Node`
and every data dependency an edge, so branching models (ResNet's skip connections) give a real DAG.
Each node is then timed in isolation on its recorded inputs:

- forward: ``warmup`` untimed calls, then the median of ``iters`` timed calls (robust to the other
  processes of a shared machine, which inflate a mean); the calls' interquartile range is kept too
  (:attr:`LayerGraph.spread`, ``graph.json``), and a layer whose calls spread by more than 20% of their median
  is named in a warning (:func:`noise_warning`);
- backward: ``torch.autograd.backward`` of the node's outputs with random output gradients, timed
  the same way (the graph is rebuilt by an untimed forward before each timed backward). As in training,
  only what depends on a parameter gets a gradient: a layer fed by the model's input does not compute
  the gradient of that input;
- the backward's two halves (:attr:`LayerGraph.split`), timed the same way and apart, as zero-bubble schedules run
  them: ``I``, ``torch.autograd.grad`` of the outputs with respect to the node's inputs only, and ``W``, with
  respect to its weights only (0 for a layer without weights, or whose inputs need no gradient);
- the loss: with ``loss`` given, its forward and backward on the model's output are timed the same way and
  added to the node that produces the output, since the runtime's last stage computes the loss in its
  forward and starts its backward from it;
- activation bytes: bytes of each output tensor for the whole minibatch;
- parameter bytes: bytes of the node's own parameters; a tensor several nodes use (tied embeddings) is in each
  of theirs and recorded once in :attr:`LayerGraph.tied` (:func:`tied_parameters`);
- hidden-matrix bytes (:attr:`LayerGraph.hidden`): those of the node's parameters that Muon updates
  (:func:`pipedream.runtime.optim.hidden_matrices`, decided on the whole model).
- module names (:attr:`LayerGraph.modules`): the fully qualified name of the module a node calls
  (:func:`pipedream.layers.module_name`), which a plan's ``split_spec`` for torch.distributed.pipelining names.

On CUDA every timed region is bracketed by ``torch.cuda.synchronize`` (public APIs only). Node ids follow the
original format (:func:`pipedream.runtime.split.node_ids`): ``node0`` is the input, then ``node1``, ``node2``, ...
in execution order. The optimizer step is timed by :mod:`pipedream.step_rates`.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from pipedream.capture import batch_size, describe, first_line, flat_inputs, shapes, tensors, to_device
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph, Node
from pipedream.in_situ import in_situ_times
from pipedream.io import atomic_write_json
from pipedream.layers import module_name
from pipedream.runtime.optim import hidden_matrices
from pipedream.runtime.split import OPS, node_ids, trace
from pipedream.tied import Tied


@dataclass
class ProfileSettings:
    """How to profile.

    Attributes:
        warmup: untimed calls before timing each node.
        iters: timed calls per node; their median is kept.
        device: ``"cpu"`` or ``"cuda"``.
        in_situ: on the CPU, keep each node's times inside whole steps (:mod:`pipedream.in_situ`), the times
            alone in :attr:`LayerGraph.isolated`; False (and on CUDA): the times alone.
    """

    warmup: int = 2
    iters: int = 5
    device: str = "cpu"
    in_situ: bool = True


def _fresh(value: Any) -> Any:
    """A copy of ``value`` whose tensors that require grad are new graph leaves that require grad (the
    rest, such as the model's input, stay as they are); clone: in-place layers act on a non-leaf."""
    return pytree.tree_map(lambda v: v.detach().requires_grad_(True).clone()
                           if isinstance(v, torch.Tensor) and v.requires_grad else v, value)


def _held(gm: fx.GraphModule, node: fx.Node) -> list[torch.Tensor]:
    """The tensors a node holds as weights, each once: a module's parameters, or the tensor a ``get_attr`` reads."""
    if node.op == "call_module":
        return list(gm.get_submodule(str(node.target)).parameters())
    if node.op == "get_attr":
        t = getattr(gm, str(node.target), None)
        return [t] if isinstance(t, torch.Tensor) else []
    return []


def tied_parameters(gm: fx.GraphModule, ids: dict[fx.Node, str]) -> list[Tied]:
    """The parameters that more than one of ``gm``'s operation nodes hold (:func:`_held`; the same tensor object),
    in order of first use: each with its first name in ``gm``, the ids of the nodes using it in graph order, and
    its bytes. (A constant that two ``get_attr`` nodes read is not one: no gradient is summed for it.)"""
    names = {id(p): name for name, p in gm.named_parameters()}
    users: dict[int, tuple[torch.Tensor, list[fx.Node]]] = {}
    for node in gm.graph.nodes:
        if node.op in OPS:
            for t in _held(gm, node):
                users.setdefault(id(t), (t, []))[1].append(node)
    return [Tied(names[key], tuple(ids[n] for n in nodes), float(t.numel() * t.element_size()))
            for key, (t, nodes) in users.items() if key in names and len(nodes) > 1]


def _timed(fn: Callable[[], Any], settings: ProfileSettings, prepare: Callable[[], Any] | None = None,
           spread: list[float] | None = None, budget_s: float | None = None) -> float:
    """Median seconds of ``fn(prepared)`` over ``settings.iters`` calls after ``settings.warmup``; the calls'
    interquartile range (seconds, :func:`iqr`) is appended to ``spread`` when given.

    With ``budget_s``, a slow call is timed fewer times: a first call longer than ``budget_s`` is the only
    warm-up, and the timing stops once two or more timed calls have taken ``budget_s`` in all."""
    cuda = settings.device.startswith("cuda")
    times: list[float] = []
    warmup, calls = settings.warmup, 0
    while calls < warmup + settings.iters:
        arg = prepare() if prepare else None
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn(arg) if prepare else fn()
        if cuda:
            torch.cuda.synchronize()
        took = time.perf_counter() - start
        if calls >= warmup:
            times.append(took)
        calls += 1
        if budget_s is not None and calls == 1 and took > budget_s:
            warmup = min(warmup, 1)
        if budget_s is not None and len(times) >= 2 and sum(times) >= budget_s:
            break
    if spread is not None:
        spread.append(iqr(times))
    return statistics.median(times)


def iqr(times: list[float]) -> float:
    """Interquartile range of timed calls, seconds (0 for fewer than two): the spread one slow call, a burst of
    another process's work, does not move, as the median does not."""
    if len(times) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return q3 - q1


NOISE_IQR = 0.2  # a layer whose timed calls spread by more than this fraction of their median is noisy
NOISE_SHARE = 0.01  # ... if it is at least this share of the model's time (a microsecond op is always noisy)


def noisy_layers(graph: LayerGraph, threshold: float = NOISE_IQR, share: float = NOISE_SHARE) -> list[tuple[str, float]]:
    """``(node id, IQR / median)`` of the layers whose forward or backward calls spread by more than ``threshold``
    of their median, among those holding at least ``share`` of the profile's time (:attr:`LayerGraph.spread`)."""
    total = sum(n.fwd_s + n.bwd_s for n in graph.nodes.values())
    out = []
    for nid, spreads in graph.spread.items():
        node = graph.nodes[nid]
        ratios = [s / t for t, s in zip((node.fwd_s, node.bwd_s), spreads, strict=True) if t > 0 and t >= share * total]
        if ratios and max(ratios) > threshold:
            out.append((nid, max(ratios)))
    return out


def noise_warning(graph: LayerGraph, threshold: float = NOISE_IQR) -> str | None:
    """One line naming the noisy layers (:func:`noisy_layers`) and what to do, or None when the profile is quiet."""
    noisy = noisy_layers(graph, threshold)
    if not noisy:
        return None
    named = ", ".join(f"{nid} ({graph.nodes[nid].desc[:40]}) {r:.0%}" for nid, r in noisy[:6])
    more = f" and {len(noisy) - 6} more" if len(noisy) > 6 else ""
    return (f"timings of {len(noisy)} layers spread by more than {threshold:.0%} of their median (interquartile "
            f"range): {named}{more}; another process is probably busy: profile on a quiet machine or raise --iters")


def _progress(items: list[fx.Node], desc: str) -> Iterator[fx.Node]:
    try:
        from tqdm import tqdm

        return iter(tqdm(items, desc=desc, unit="layer", leave=False))
    except ImportError:  # pragma: no cover - tqdm is a pinned requirement
        return iter(items)


def profile_module(model: nn.Module, example_input: Any, settings: ProfileSettings | None = None, name: str = "model",
                   granularity: str = "layer", loss: Callable[[Any], torch.Tensor] | None = None) -> LayerGraph:
    """Profile ``model`` on ``example_input`` (a whole minibatch) and return its layer graph.

    Args:
        model: any module: an ``nn.Sequential``, or a module :mod:`pipedream.capture` captures.
        example_input: one minibatch, e.g. shape ``(batch, 3, 32, 32)``; a tuple or dict for several inputs
            (the model is called as :func:`pipedream.capture.call_model` calls it).
        settings: warm-up, iterations and device.
        name: shown on the progress bar.
        granularity: ``"layer"``: each child of an ``nn.Sequential`` is one node (what the planner's
            stages and the runtime's slices are made of; a ResNet block or a GNMT layer stays whole);
            ``"op"``: torch.fx's default, every leaf ``torch.nn`` module and function is a node, so a
            block's skip connection shows as a branch in the DAG.
        loss: ``loss(output) -> scalar`` (the criterion bound to the minibatch's targets), or None; its
            forward and backward seconds (:func:`profile_loss`) are added to the node producing the output.
    Returns:
        A :class:`LayerGraph` with ``minibatch_size`` set to the first input's batch dimension; node
        times in seconds per minibatch, activations and parameters in bytes; its tied parameters
        (:func:`tied_parameters`) in ``tied``; the bytes of each node's hidden matrices in ``hidden``; how many
        parameter tensors that require a gradient each node holds in ``tensors``.
    Raises:
        PipeDreamError: if the model cannot be traced or the device is unavailable.
    """
    settings = settings or ProfileSettings()
    if settings.device.startswith("cuda") and not torch.cuda.is_available():
        raise PipeDreamError("--device cuda requested but no CUDA device is available; use --device cpu")
    device = torch.device(settings.device)
    example_input = to_device(example_input, device)
    inputs = flat_inputs(example_input)
    model = model.to(device).train()
    gm = trace(model, granularity, example_input)

    graph = LayerGraph(minibatch_size=batch_size(example_input))
    values: dict[fx.Node, Any] = {}
    ids = node_ids(gm)  # the ids the runtime cuts the model by
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        raise PipeDreamError(f"{name} takes {len(placeholders)} inputs but {len(inputs)} were given")
    for k, (ph, x) in enumerate(zip(placeholders, inputs, strict=True)):
        values[ph] = x
        suffix = str(k) if len(placeholders) > 1 else ""
        graph.add_node(Node(ids[ph], f"Input{suffix}", 0.0, 0.0, (float(x.numel() * x.element_size()),), 0.0))
        graph.hidden[ids[ph]] = 0.0
    ops = [n for n in gm.graph.nodes if n.op in OPS]
    params = {p.untyped_storage().data_ptr() for p in (*gm.parameters(), *gm.buffers())}  # held as weights
    trained = {id(p) for p in gm.parameters() if p.requires_grad}
    needs_grad: set[fx.Node] = set()  # nodes whose output depends on a parameter: the runtime differentiates it
    for node in _progress(ops, f"profile {name}"):
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: values[a])
        run = _runner(gm, node)
        try:
            with torch.no_grad():
                out = run(*args, **kwargs)
        except Exception as e:  # a shape or dtype error of the model's: name the layer
            raise PipeDreamError(f"layer {ids[node]} ({describe(gm, node)[:80]}) failed on {shapes((args, kwargs))}: "
                                 f"{first_line(e)}") from None
        if _owns_parameter(gm, node, trained) or any(src in needs_grad for src in node.all_input_nodes):
            needs_grad.add(node)
            for t in tensors(out):
                if t.is_floating_point() and t.is_leaf and not t.requires_grad:
                    t.requires_grad_(True)  # a leaf, made under no_grad: marks what _fresh differentiates
        values[node] = out
        spread: list[float] = []
        fwd_s = _timed(lambda r=run, a=args, k=kwargs: r(*a, **k), settings, spread=spread) if node.op != "get_attr" else 0.0
        bwd_s = _backward_time(run, args, kwargs, settings, spread)
        graph.split[ids[node]] = _split_times(run, args, kwargs, _held(gm, node), settings) if bwd_s else (0.0, 0.0)
        graph.spread[ids[node]] = (spread[0] if fwd_s else 0.0, spread[-1] if bwd_s else 0.0)
        acts = tuple(float(t.numel() * t.element_size()) for t in tensors(out)) or (0.0,)
        param_bytes = float(sum(t.numel() * t.element_size() for t in _held(gm, node)))
        graph.add_node(Node(ids[node], describe(gm, node), fwd_s, bwd_s, acts, param_bytes))
        graph.saved[ids[node]] = _saved(run, args, kwargs, params)
        if (fqn := module_name(gm, node)) is not None:
            graph.modules[ids[node]] = fqn
        for src in node.all_input_nodes:
            graph.add_edge(ids[src], ids[node])
    graph.tied = tied_parameters(gm, ids)
    if loss is not None:
        output = next(n for n in gm.graph.nodes if n.op == "output")
        sinks = [n for n in ops if n in output.all_input_nodes]
        if sinks:
            fwd_s, bwd_s = profile_loss(fx.node.map_arg(output.args[0], lambda a: values[a]), loss, settings)
            sink = graph.nodes[ids[sinks[-1]]]
            graph.nodes[sink.node_id] = dataclasses.replace(sink, fwd_s=sink.fwd_s + fwd_s, bwd_s=sink.bwd_s + bwd_s)
            i_s, w_s = graph.split[sink.node_id]  # the loss's backward is the gradient of the output: I's
            graph.split[sink.node_id] = (i_s + bwd_s, w_s)
    if settings.in_situ and not settings.device.startswith("cuda"):
        _time_in_situ(gm, {n: ids[n] for n in ops}, inputs, loss, settings, graph)
    # after the layers ran one by one, so that a layer that fails is named (a whole forward would not say which);
    # gm holds the model's parameter objects
    hidden = {id(p) for p in hidden_matrices(model, example_input)}
    for node in ops:
        graph.hidden[ids[node]] = float(sum(t.numel() * t.element_size() for t in _held(gm, node) if id(t) in hidden))
        graph.tensors[ids[node]] = sum(1 for t in _held(gm, node) if t.requires_grad)
    return graph


def _time_in_situ(gm: fx.GraphModule, ids: dict[fx.Node, str], inputs: list[Any], loss: Callable[[Any], torch.Tensor] | None,
                  settings: ProfileSettings, graph: LayerGraph) -> None:
    """Replace every node's times by its times inside whole steps (:func:`pipedream.in_situ.in_situ_times`), keeping
    the isolated ones in ``graph.isolated``; a model the interpreter cannot step keeps its isolated times, with a
    warning naming why."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    sinks = [n for n in ids if n in output.all_input_nodes]
    sink = ids[sinks[-1]] if sinks else list(ids.values())[-1]
    try:
        situ = in_situ_times(gm, ids, inputs, sink, loss, settings.warmup, settings.iters)
    except Exception as e:  # the layers' own times still stand
        print(f"warning: layer times inside whole steps failed ({type(e).__name__}: {first_line(e)}); "
              "keeping each layer's time alone", file=sys.stderr)
        return
    for nid, (fwd_s, bwd_s) in situ.items():
        node = graph.nodes[nid]
        graph.isolated[nid] = (node.fwd_s, node.bwd_s)
        graph.nodes[nid] = dataclasses.replace(node, fwd_s=fwd_s, bwd_s=bwd_s)


def profile_loss(output: Any, loss: Callable[[Any], torch.Tensor], settings: ProfileSettings) -> tuple[float, float]:
    """Forward and backward seconds of ``loss(output)`` on a model's ``output`` (one profiled minibatch),
    timed as a node is: ``(forward_s, backward_s)``; the backward from the scalar loss to the output."""
    fresh = _fresh(output)
    with torch.no_grad():
        forward_s = _timed(lambda: loss(fresh), settings)
    return forward_s, _backward_time(loss, (output,), {}, settings)


def _owns_parameter(gm: fx.GraphModule, node: fx.Node, trained: set[int]) -> bool:
    """Whether ``node`` uses a parameter that trains (a module's or a ``get_attr``'s)."""
    if node.op == "call_module":
        return any(id(p) in trained for p in gm.get_submodule(str(node.target)).parameters())
    if node.op == "get_attr":
        return id(getattr(gm, str(node.target), None)) in trained
    return False


def _runner(gm: fx.GraphModule, node: fx.Node) -> Callable[..., Any]:
    if node.op == "call_module":
        return gm.get_submodule(str(node.target))
    if node.op == "call_function":
        return node.target  # type: ignore[return-value]
    if node.op == "call_method":
        method = str(node.target)
        return lambda self, *a, **k: getattr(self, method)(*a, **k)
    attr = getattr(gm, str(node.target))
    return lambda: attr


def _saved(run: Callable[..., Any], args: Any, kwargs: Any, params: set[int]) -> tuple[float, bool, bool]:
    """What autograd saves for the backward of one node's forward, counted by storage, each once:
    ``(bytes of saved storages other than the node's parameters, inputs and outputs, whether it saves an
    input, whether it saves an output)``; the first scales with the batch like activation bytes. Module
    buffers (running statistics) count as parameters: the stage holds them anyway."""
    a, k = _fresh(args), _fresh(kwargs)
    inputs = {t.untyped_storage().data_ptr() for t in tensors((a, k))}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run(*a, **k)
    outs = {t.untyped_storage().data_ptr() for t in tensors(out)}
    others = inputs | outs | params
    own = sum(b for ptr, b in saved.items() if ptr not in others)
    return float(own), any(ptr in inputs for ptr in saved), any(ptr in outs for ptr in saved)


def _backward_time(run: Callable[..., Any], args: Any, kwargs: Any, settings: ProfileSettings,
                   spread: list[float] | None = None) -> float:
    """Mean seconds of the backward pass of one node; 0 if nothing it outputs needs a gradient."""

    def prepare() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        a, k = _fresh(args), _fresh(kwargs)
        outs = [t for t in tensors(run(*a, **k)) if t.requires_grad]
        return outs, [torch.randn_like(t) for t in outs]

    outs, _ = prepare()
    if not outs:
        return 0.0
    return _timed(lambda og: torch.autograd.backward(og[0], og[1]), settings, prepare, spread)


def _split_times(run: Callable[..., Any], args: Any, kwargs: Any, weights: list[torch.Tensor],
                 settings: ProfileSettings) -> tuple[float, float]:
    """``(I, W)``: median seconds of one node's backward to its inputs alone and to its weights alone
    (``torch.autograd.grad`` with ``inputs=`` those, on a graph rebuilt before each call); 0 for a half with nothing
    to differentiate."""

    def prepare() -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        a, k = _fresh(args), _fresh(kwargs)
        outs = [t for t in tensors(run(*a, **k)) if t.requires_grad]
        return outs, [torch.randn_like(t) for t in outs], [t for t in tensors((a, k)) if t.requires_grad]

    _, _, inputs = prepare()
    trained = [w for w in weights if w.requires_grad]

    def grad(og: tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]], wrt: list[torch.Tensor]) -> None:
        torch.autograd.grad(og[0], wrt, og[1], allow_unused=True)

    i_s = _timed(lambda og: grad(og, og[2]), settings, prepare) if inputs else 0.0
    w_s = _timed(lambda og: grad(og, trained), settings, prepare) if trained else 0.0
    return i_s, w_s


def data_load_s(load: Callable[[], Any], settings: ProfileSettings) -> float:
    """Median seconds of ``load()``, collating one profiled minibatch from the data set (``meta.json``
    ``data_s``): the first stage of a pipeline, and every DP worker, does it before each forward, on the CPU."""
    return _timed(load, ProfileSettings(**{**vars(settings), "device": "cpu"}))


def whole_step_s(step: Callable[[], Any], settings: ProfileSettings) -> float:
    """Median seconds of one whole training step, ``step()`` (forward, loss and backward of the profiled
    minibatch through the model in one call, as a worker runs a stage: :mod:`pipedream.commands.profile` calls
    the model with ``torch.func.functional_call`` on a weight version; ``meta.json`` ``whole_step_s``).

    The layer-by-layer profile times each layer with its weights and activations warm in the caches; a step
    through the whole model finds them evicted by the other layers. Predictions scale the layers' times by the
    ratio (:func:`pipedream.sim.profiled.profiled_composition`).
    """
    return _timed(step, settings)


def write_profile(graph: LayerGraph, out_dir: Path, meta: dict[str, Any]) -> None:
    """Write ``graph.txt``, ``graph.json`` (per node its times, spreads, bytes, hidden-matrix bytes, parameter
    tensors, what it saves and its backward's halves ``input_grad_s`` and ``weight_grad_s``; the edges; the tied
    parameters, ``"tied"``: :meth:`pipedream.tied.Tied.to_json`; and ``meta``) and ``meta.json`` (minibatch size,
    the module each node calls, ``"modules"``: :attr:`LayerGraph.modules`, device, ...) into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    nodes = [
        {"id": n.node_id, "desc": n.desc, "fwd_s": n.fwd_s, "bwd_s": n.bwd_s,
         **dict(zip(("fwd_iqr_s", "bwd_iqr_s"), graph.spread.get(n.node_id, ()), strict=False)),
         **dict(zip(("isolated_fwd_s", "isolated_bwd_s"), graph.isolated.get(n.node_id, ()), strict=False)),
         "activation_bytes": list(n.activation_bytes), "param_bytes": n.param_bytes,
         **({"hidden_bytes": graph.hidden[n.node_id]} if n.node_id in graph.hidden else {}),
         **({"param_tensors": graph.tensors[n.node_id]} if n.node_id in graph.tensors else {}),
         **dict(zip(("saved_bytes", "saves_input", "saves_output"), graph.saved.get(n.node_id, ()), strict=False)),
         **dict(zip(("input_grad_s", "weight_grad_s"), graph.split.get(n.node_id, ()), strict=False))}
        for n in graph.nodes.values()
    ]
    atomic_write_json(out_dir / "graph.json", {"nodes": nodes, "edges": graph.edges,
                                               "tied": [t.to_json() for t in graph.tied], **meta})
    atomic_write_json(out_dir / "meta.json", {"minibatch_size": graph.minibatch_size, "modules": graph.modules, **meta})
    graph.write(out_dir / "graph.txt")  # last: the Snakemake output that marks completion
