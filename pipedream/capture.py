"""Capture any ``nn.Module`` as a graph of layers that the profiler times and the planner cuts.

An ``nn.Sequential`` keeps the registry's form: one node per child (:class:`pipedream.models.LayerTracer`).
Any other module is captured once, on an example batch, by the first of these that works:

1. ``torch.export.export(strict=False)``: ATen operations, shapes specialised to the example's (so a
   graph is captured at the batch size it will run: the profiled minibatch, the run's microbatch);
2. ``torch.fx.symbolic_trace``: shape-agnostic Python tracing, where export fails;
3. for a ``transformers`` model, the Hugging Face fx tracer (``transformers.utils.fx``, which
   transformers 5 no longer ships) where both fail.

The module is called as ``model(x)`` for a tensor ``x``, ``model(*x)`` for a tuple, ``model(**x)`` for a dict
(:func:`call_model`); the graph takes the flat tensors (:func:`flat_inputs`) and returns the model's output
in its own structure (a tensor, a tuple, a Hugging Face ``ModelOutput``) with only its tensors: anything else in
it (a key/value cache object, a flag) is None. Export bakes the training mode into its ops; dropout and batch
norm are turned back into modules, so ``stage.eval()`` switches them. A Hugging Face model's key/value cache
(``config.use_cache``) is turned off first (:func:`turn_off_kv_cache`): training never reads it.

Layers (:func:`pipedream.layers.layer_paths`): the root, the containers (``Sequential``, ``ModuleList``,
``ModuleDict``) and every module holding more than 1/16 of the parameters are opened; what is left is a layer (a
ResNet ``BasicBlock``, a GPT-2 block, an embedding). The ops of one call of a layer, and each run of consecutive
ops outside any layer (a ``flatten``, a causal mask), become one node (a small ``fx.GraphModule``). A stage's
module is made of the inlined ops (:func:`pipedream.layers.inline`), so its parameters keep the model's names; a
parameter two layers use (tied embeddings) is held by each of their stages (:mod:`pipedream.runtime.shared`).
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from pipedream.capture_fixes import fix_for
from pipedream.errors import PipeDreamError

PREFIX = "model"  # the wrapper's attribute holding the user's model (stripped from every name)
OUTPUT = "_pd_output"


def call_args(x: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` a model is called with for input ``x``: a dict is keywords, a tuple or list is positional
    arguments, anything else the one argument."""
    if isinstance(x, dict):
        return (), dict(x)
    if isinstance(x, tuple | list):
        return tuple(x), {}
    return (x,), {}


def call_model(model: nn.Module, x: Any) -> Any:
    """``model`` on input ``x`` (:func:`call_args`)."""
    args, kwargs = call_args(x)
    return model(*args, **kwargs)


def to_device(x: Any, device: torch.device | str) -> Any:
    """``x`` (a tensor, or a tuple or dict of them) with every tensor on ``device``."""
    return pytree.tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, x)


def flat_inputs(x: Any) -> tuple[Any, ...]:
    """The flat inputs of a captured graph for input ``x``: its tensors (pytree leaves) in order."""
    if isinstance(x, torch.Tensor):
        return (x,)
    return tuple(pytree.tree_leaves(x))


def tensors(values: Any) -> list[torch.Tensor]:
    """The tensors in ``values`` (a tensor, or nested tuples, lists and dicts of them), in order (pytree leaves)."""
    return [t for t in pytree.tree_leaves(values) if isinstance(t, torch.Tensor)]


def batch_size(x: Any) -> int:
    """Samples in input ``x``: the first dimension of its first tensor."""
    return int(next(t for t in flat_inputs(x) if isinstance(t, torch.Tensor)).shape[0])


class Restructure(nn.Module):
    """The last node of a captured graph: the model's output structure rebuilt from its flat values."""

    def __init__(self, spec: pytree.TreeSpec) -> None:
        super().__init__()
        self.spec = spec

    def forward(self, *leaves: Any) -> Any:
        return pytree.tree_unflatten(list(leaves), self.spec)

    def extra_repr(self) -> str:
        return getattr(self.spec.type, "__name__", str(self.spec.type))


class TrainingOp(nn.Module):
    """An op that export captured in training mode (dropout's ``train=True``, attention's ``dropout_p``), run
    with this module's training flag instead: argument ``slot`` (an index or a keyword) is ``on`` in training
    and ``off`` in evaluation. The op's other tensor arguments are this module's inputs, in order."""

    def __init__(self, op: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], slot: int | str,
                 on: Any, off: Any) -> None:
        super().__init__()
        self.op, self.args, self.kwargs, self.slot, self.on, self.off = op, args, kwargs, slot, on, off

    def forward(self, *tensors: Any) -> Any:
        it = iter(tensors)
        args, kwargs = pytree.tree_map(lambda a: next(it) if isinstance(a, _Slot) else a,
                                       (list(self.args), dict(self.kwargs)))
        mode = self.on if self.training else self.off
        if isinstance(self.slot, int):
            args[self.slot] = mode
        else:
            kwargs[self.slot] = mode
        return self.op(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"{self.op}, {self.slot}={self.on} in training"


class _Slot:
    """Where a :class:`TrainingOp`'s input goes in its op's arguments (a type, so that copies still match)."""


def _training_op(n: fx.Node) -> tuple[TrainingOp, list[fx.Node]] | None:
    """A :class:`TrainingOp` for a dropout or an attention with dropout that export captured in training mode,
    and the nodes it takes; None for any other node."""
    aten = torch.ops.aten
    dropouts = {aten.dropout.default, aten.feature_dropout.default, aten.alpha_dropout.default,
                aten.feature_alpha_dropout.default}
    if n.op != "call_function":
        return None
    if n.target in dropouts and len(n.args) >= 3:
        slot, on, off = 2, n.args[2], False
    elif n.target is aten.scaled_dot_product_attention.default:
        slot = 4 if len(n.args) > 4 else "dropout_p"
        on = n.args[4] if len(n.args) > 4 else n.kwargs.get("dropout_p", 0.0)
        if not on:
            return None
        off = 0.0
    else:
        return None
    nodes: list[fx.Node] = []

    def mark(a: Any) -> Any:
        if isinstance(a, fx.Node):
            nodes.append(a)
            return _Slot()
        return a

    args, kwargs = pytree.tree_map(mark, (tuple(n.args), dict(n.kwargs)))
    return TrainingOp(n.target, args, kwargs, slot, on, off), nodes


def turn_off_kv_cache(model: nn.Module) -> bool:
    """Set ``config.use_cache = False`` on ``model`` and every submodule whose ``config`` has ``use_cache`` on (a
    Hugging Face model, or one inside the user's module), as transformers does itself to train with gradient
    checkpointing: training never reads the key/value cache, and a cache object is no output a graph can return.
    Says so in one ``note:`` line on stderr when it turned one off (on rank 0 of a process group).

    Returns:
        whether a cache was on.
    """
    configs = {id(c): c for c in (getattr(m, "config", None) for m in model.modules())
               if getattr(c, "use_cache", None) is True}
    for config in configs.values():
        config.use_cache = False
    if configs and not (torch.distributed.is_available() and torch.distributed.is_initialized()
                        and torch.distributed.get_rank() != 0):
        print(f"note: {type(model).__name__}: use_cache turned off for capture (training needs no key/value cache)",
              file=sys.stderr, flush=True)
    return bool(configs)


def tensors_only(output: Any) -> Any:
    """``output`` in its own structure with every leaf that is not a tensor (a key/value cache object, a
    ``ModelOutput``'s flag) replaced by None, which a ``ModelOutput`` leaves out: what export can return."""
    return pytree.tree_map(lambda v: v if isinstance(v, torch.Tensor) else None, output)


def _flat_wrapper(model: nn.Module, spec: pytree.TreeSpec, n: int, tensors_out: bool = False) -> nn.Module:
    """A module whose ``forward(x0, ..., x{n-1})`` rebuilds the model's arguments from ``spec`` and calls it
    (explicit parameters: fx makes one placeholder of each); with ``tensors_out``, its output is
    :func:`tensors_only` the model's (for export; fx's values are proxies)."""
    names = ", ".join(f"x{i}" for i in range(n))
    scope: dict[str, Any] = {}
    exec(f"def forward(self, {names}):\n    return self.call([{names}])\n", scope)  # noqa: S102 - generated arity

    class Flat(nn.Module):
        forward = scope["forward"]

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def call(self, leaves: list[Any]) -> Any:
            args, kwargs = pytree.tree_unflatten(leaves, spec)
            output = self.model(*args, **kwargs)
            return tensors_only(output) if tensors_out else output

    return Flat()


def strip_prefix(name: str) -> str:
    """A name inside the wrapper as the model's own: ``model.fc.weight`` -> ``fc.weight``, ``model`` -> ``""``."""
    if name == PREFIX:
        return ""
    return name.removeprefix(PREFIX + ".")


def get_path(module: nn.Module, target: str) -> Any:
    """The attribute at dotted path ``target`` of ``module`` (a submodule, parameter or buffer)."""
    return functools.reduce(getattr, target.split("."), module)


_NOT_USERS = (os.path.dirname(torch.__file__), os.path.dirname(__file__))  # torch's frames and ours


def _user_frame(e: BaseException) -> str:
    """``file:line (`source`)`` of the deepest traceback frame outside torch and pipedream, or ``""``."""
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if not f.filename.startswith(_NOT_USERS) and "<" not in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    return f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} (`{(f.line or '').strip()[:60]}`)"


def _user_layer(e: BaseException, model: nn.Module) -> str:
    """``path (Type)`` of the innermost module of ``model`` whose ``forward`` the traceback passes through."""
    names = {id(m): name for name, m in model.named_modules()}
    found = ""
    tb = e.__traceback__
    while tb is not None:
        me = tb.tb_frame.f_locals.get("self")
        if isinstance(me, nn.Module) and names.get(id(me)):
            found = f"{names[id(me)]} ({type(me).__name__})"
        tb = tb.tb_next
    return found


def first_line(e: BaseException, limit: int = 160) -> str:
    """The first non-empty line of an exception's message (its type if it has none), at most ``limit`` chars."""
    line = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
    return line[:limit]


def _reason(e: BaseException, model: nn.Module) -> str:
    layer, where = _user_layer(e, model), _user_frame(e)
    return first_line(e) + (f" in layer {layer}" if layer else "") + (f" at {where}" if where else "")


def shapes(values: Any) -> str:
    """``(4, 16) int64, (4, 16) float32``: shape and dtype of each tensor in ``values``."""
    return ", ".join(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in tensors(values)) or "no tensors"


def describe(gm: fx.GraphModule, node: fx.Node) -> str:
    """What node ``node`` of a graph is, for messages and profiles: a layer's class and name, a module's repr,
    a function's name."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        return getattr(module, "_pd_desc", None) or repr(module).replace("\n", " ")
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    return str(node.target)


def run_graph(gm: fx.GraphModule, inputs: tuple[Any, ...], ids: dict[fx.Node, str] | None = None,
              record: dict[fx.Node, Any] | None = None) -> Any:
    """``gm(*inputs)``, node by node; a node that raises is named in a one-line error.

    Args:
        ids: node ids to name nodes by (the profile's), else their graph names.
        record: filled with every node's value.
    Raises:
        PipeDreamError: ``layer <id> (<what it is>) failed on <input shapes and dtypes>: <reason>``.
    """

    failure: list[str] = []

    class Runner(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            try:
                value = super().run_node(n)
            except Exception as e:  # shape and dtype errors of the model's own code
                if not failure:  # the innermost node (fx re-raises through the nodes that contain it)
                    args = fx.node.map_arg((n.args, n.kwargs), lambda a: self.env.get(a))
                    name = (ids or {}).get(n, n.name)
                    failure.append(e.args[0] if isinstance(e, PipeDreamError) else
                                   f"layer {name} ({describe(gm, n)[:80]}) failed on {shapes(args)}: {first_line(e)}")
                raise
            if record is not None:
                record[n] = value
            return value

    try:
        return Runner(gm).run(*inputs)
    except Exception:
        if failure:  # fx appends its own notes to the exception: say it in one line instead
            raise PipeDreamError(failure[0]) from None
        raise


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the tracers' own warnings and logs (a failed export logs the graph it got): the reason is in
    the one line :func:`capture_ops` raises."""
    names = ("torch.fx.experimental.symbolic_shapes", "torch.export", "torch._export", "torch._dynamo",
             "torch.fx._symbolic_trace", "torch._subclasses", "transformers")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):  # export prints what failed
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _export(model: nn.Module, leaves: list[Any], spec: pytree.TreeSpec) -> tuple[fx.GraphModule, pytree.TreeSpec]:
    ep = torch.export.export(_flat_wrapper(model, spec, len(leaves), tensors_out=True), tuple(leaves), strict=False)
    return ep.module(), ep.call_spec.out_spec


def _fx(model: nn.Module, leaves: list[Any], spec: pytree.TreeSpec) -> tuple[fx.GraphModule, pytree.TreeSpec | None]:
    return fx.symbolic_trace(_flat_wrapper(model, spec, len(leaves))), None


def _hf_fx(model: nn.Module, leaves: list[Any], spec: pytree.TreeSpec) -> tuple[fx.GraphModule, pytree.TreeSpec | None]:
    from transformers.utils import fx as hf_fx  # transformers < 5

    args, kwargs = pytree.tree_unflatten(list(leaves), spec)
    if args:
        import inspect

        names = list(inspect.signature(model.forward).parameters)[:len(args)]
    else:
        names = list(kwargs)
    gm = hf_fx.symbolic_trace(model, input_names=names)
    # its names are the model's own: prefix them as the wrapper's would be
    for n in gm.graph.nodes:
        if n.op in ("get_attr", "call_module"):
            n.target = f"{PREFIX}.{n.target}"
    wrapped = nn.Module()
    wrapped.model = model
    return fx.GraphModule(wrapped, gm.graph), None


def is_transformers_model(model: nn.Module) -> bool:
    """Whether ``model`` is a Hugging Face ``transformers`` model (without importing transformers)."""
    return any(c.__module__.startswith("transformers.") for c in type(model).__mro__)


def capture_ops(model: nn.Module, example: Any, training: bool = True) -> tuple[fx.GraphModule, str]:
    """The model's op graph and how it was captured (``"torch.export"``, ``"torch.fx"``, ``"transformers fx"``).

    The graph takes :func:`flat_inputs` of an input and ends with the model's output rebuilt in its own
    structure (a :class:`Restructure` node, unless the output is one tensor); its ``get_attr`` and
    ``call_module`` targets are the model's own names, holding the model's own parameters. The model is
    captured in training mode (``training``; in evaluation mode dropout leaves no op and batch norm accepts a
    batch of one) and left in the mode it was in.

    Raises:
        PipeDreamError: no capture worked; one line with each one's reason (the layer and the failing line of
            the model's code where there is one) and the fix (:func:`pipedream.capture_fixes.fix_for`).
    """
    turn_off_kv_cache(model)
    args, kwargs = call_args(example)
    leaves, spec = pytree.tree_flatten((args, kwargs))
    ways: list[tuple[str, Callable[..., tuple[fx.GraphModule, Any]]]] = [("torch.export", _export), ("torch.fx", _fx)]
    if is_transformers_model(model):
        ways.append(("transformers fx", _hf_fx))
    failures = []
    was_training = model.training
    model.train(training)
    try:
        with _quiet():
            for how, way in ways:
                try:
                    gm, out_spec = way(model, leaves, spec)
                    return _clean(gm, out_spec, model), how
                except ImportError:
                    failures.append(f"{how}: not installed")
                except Exception as e:  # the tracers raise anything the model's code raises
                    failures.append(f"{how}: {_reason(e, model)}")
    finally:
        model.train(was_training)
    raise PipeDreamError(f"cannot capture {type(model).__name__} as a graph ({'; '.join(failures)}); "
                         f"fix: {fix_for(failures)}")


def _clean(gm: fx.GraphModule, out_spec: pytree.TreeSpec | None, model: nn.Module) -> fx.GraphModule:
    """A plain copy of a captured graph: the model's names and objects (export's module holds copies of the
    model's modules), no export guards or asserts, dropout and batch norm as modules (training flag at run
    time), flat output rebuilt by :class:`Restructure`."""
    g = fx.Graph()
    env: dict[fx.Node, Any] = {}
    root: dict[str, Any] = {}
    aten = torch.ops.aten
    output = None
    for n in gm.graph.nodes:
        if n.op == "output":
            output = n
            continue
        if _is_check(n):
            continue
        if n.op in ("get_attr", "call_module"):  # the model's own object, not export's copy
            name = strip_prefix(n.target)
            root[name] = get_path(model, name) if n.target.startswith(PREFIX + ".") else get_path(gm, n.target)
        mode_op = _training_op(n)
        if mode_op is not None:
            name = f"_pd_train_mode{sum(1 for k in root if k.startswith('_pd_train_mode'))}"
            root[name] = mode_op[0]
            env[n] = g.call_module(name, tuple(env[a] for a in mode_op[1]))
            env[n].meta = dict(n.meta)
            continue
        if n.op == "call_function" and n.target is aten.batch_norm.default:
            bn = _batch_norm_module(model, n)
            if bn is not None:
                root[bn[0]] = bn[1]
                env[n] = g.call_module(bn[0], (env[n.args[0]],))
                env[n].meta = dict(n.meta)
                continue
        counter = n.args[0] if n.args else None
        if (n.op == "call_function" and n.target is aten.add_.Tensor and isinstance(counter, fx.Node)
                and counter.op == "get_attr" and str(counter.target).endswith("num_batches_tracked")):
            continue  # num_batches_tracked += 1: the batch norm module counts itself
        node = g.node_copy(n, lambda a: env[a])
        if n.op in ("get_attr", "call_module"):
            node.target = strip_prefix(n.target)
        env[n] = node
    assert output is not None
    result = fx.map_arg(output.args[0], lambda a: env[a])
    if out_spec is None:  # traced by fx: the output is the model's own structure
        leaves, out_spec = pytree.tree_flatten(result)
    else:
        leaves = list(result) if isinstance(result, tuple | list) else [result]
    if out_spec.is_leaf():
        g.output(leaves[0])
    else:
        root[OUTPUT] = Restructure(out_spec)
        g.output(g.call_module(OUTPUT, tuple(leaves)))
    for n in list(g.nodes):  # nodes only the dropped checks used (their get_attrs)
        if n.op == "get_attr" and not n.users:
            g.erase_node(n)
    g.lint()
    return fx.GraphModule(root, g, "Captured")


def _is_check(n: fx.Node) -> bool:
    """Export's run-time guards and shape assertions: no value, nothing to time."""
    if n.op == "call_module" and str(n.target).endswith("_guards_fn"):
        return True
    name = getattr(n.target, "__name__", str(n.target))
    return n.op == "call_function" and not n.users and ("_assert" in name or "sym_constrain" in name)


def _batch_norm_module(model: nn.Module, n: fx.Node) -> tuple[str, nn.Module] | None:
    """``(model's name, module)`` of the batch norm module an ``aten.batch_norm`` node came from, if found."""
    stats = n.args[3] if len(n.args) > 3 else None
    if not (isinstance(stats, fx.Node) and stats.op == "get_attr" and str(stats.target).startswith(PREFIX + ".")
            and str(stats.target).endswith(".running_mean")):
        return None
    path = strip_prefix(str(stats.target).removesuffix(".running_mean"))
    module = get_path(model, path)
    if not isinstance(module, nn.modules.batchnorm._BatchNorm):
        return None
    return path, module


# ------------------------------------------------------------------------------------------------ layers
