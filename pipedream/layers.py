"""Layers of a captured model: group its ATen or fx ops into one node per layer call (the profiler's and the
planner's unit, :func:`group_layers`), and build a stage's graph by inlining its layers (:func:`inline`) with
inputs an in-place op would overwrite cloned (:func:`guard_inplace`). Capture itself is :mod:`pipedream.capture`.
"""

from __future__ import annotations

import operator
from typing import Any

from torch import fx, nn

from pipedream.capture import OUTPUT, PREFIX, get_path, strip_prefix

CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
LAYER_FRACTION = 1 / 16  # a module holding more of the model's parameters than this is opened into its children
_OWN = "_pd_"  # names of the modules capture adds (output structure, training-mode ops)


def layer_paths(model: nn.Module, fraction: float = LAYER_FRACTION) -> set[str]:
    """Qualified names of the modules that are layers (see the module docstring)."""
    total = sum(p.numel() for p in model.parameters())
    out: set[str] = set()

    def visit(path: str, m: nn.Module) -> None:
        kids = list(m.named_children())
        held = sum(p.numel() for p in m.parameters())
        if kids and (not path or isinstance(m, CONTAINERS) or held > total * fraction):
            for name, child in kids:
                visit(f"{path}.{name}" if path else name, child)
        else:
            out.add(path)

    visit("", model)
    return out


def _stack(n: fx.Node) -> list[tuple[str, str]]:
    """``(call key, module path)`` of the module calls ``n`` is inside, outermost first, the wrapper left out."""
    out = []
    for key, value in (n.meta.get("nn_module_stack") or {}).items():
        path = value[0] if isinstance(value, tuple) else str(value)
        path = strip_prefix(path) if path.startswith(PREFIX) else path
        if path:
            out.append((str(key), path))
    return out


def _layer_key(n: fx.Node, layers: set[str]) -> tuple[str, str, str]:
    """``("layer", call key, path)`` of the layer call ``n`` belongs to, or ``("glue", "", parent path)``."""
    stack = _stack(n)
    if n.op == "call_module" and not str(n.target).startswith(_OWN) and not any(p == n.target for _, p in stack):
        stack.append((str(n.target), str(n.target)))
    for key, path in stack:
        if path in layers:
            return ("layer", key, path)
    return ("glue", "", stack[-1][1] if stack else "")


def group_layers(ops: fx.GraphModule, model: nn.Module) -> fx.GraphModule:
    """The op graph with the ops of each layer call (and each run of glue ops) fused into one
    ``call_module`` node (an ``fx.GraphModule`` marked ``_pd_layer``; see the module docstring)."""
    layers = layer_paths(model)
    runs: list[tuple[tuple[str, str, str], list[fx.Node]]] = []
    for n in ops.graph.nodes:
        if n.op in ("placeholder", "get_attr", "output"):
            continue
        if n.op == "call_module" and n.target == OUTPUT:
            continue
        key = _layer_key(n, layers)
        if runs and runs[-1][0] == key:
            runs[-1][1].append(n)
        else:
            runs.append((key, [n]))
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    root: dict[str, Any] = {}
    names: set[str] = set()

    def value(a: fx.Node) -> fx.Node:
        if a not in env and a.op == "get_attr":  # a parameter used outside every layer: read it here
            env[a] = g.get_attr(a.target)
            root[str(a.target)] = get_path(ops, str(a.target))
        return env[a]

    for n in ops.graph.nodes:
        if n.op == "placeholder":
            env[n] = g.node_copy(n)
    for (kind, _, path), members in runs:
        inside = set(members)
        inputs: list[fx.Node] = []
        for n in members:
            for a in n.all_input_nodes:
                if a not in inside and a.op != "get_attr" and a not in inputs:
                    inputs.append(a)
        outs = [n for n in members if any(u not in inside for u in n.users)]
        name = _unique((path or "model").replace(".", "_") + ("_glue" if kind == "glue" else ""), names)
        fused = _fuse(ops, members, inputs, outs, name)
        fused._pd_desc = (f"{type(get_path(model, path)).__name__} {path}" if kind == "layer"
                          else f"ops {', '.join(_op_name(n) for n in members)[:100]}")
        fused._pd_path = path if kind == "layer" and path else None  # the layer's qualified name (module_name)
        root[name] = fused
        call = g.call_module(name, tuple(value(a) for a in inputs))
        if len(outs) == 1:
            env[outs[0]] = call
        else:
            for k, o in enumerate(outs):
                env[o] = g.call_function(operator.getitem, (call, k))
    output = next(n for n in ops.graph.nodes if n.op == "output")
    last = output.args[0]
    if isinstance(last, fx.Node) and last.op == "call_module" and last.target == OUTPUT:
        root[OUTPUT] = ops.get_submodule(OUTPUT)
        last = g.call_module(OUTPUT, fx.map_arg(last.args, value))
    else:
        last = fx.map_arg(last, value)
    g.output(last)
    g.lint()
    return fx.GraphModule(root, g, "Layers")


def _unique(name: str, taken: set[str]) -> str:
    k, out = 1, name
    while out in taken:
        out, k = f"{name}_{k}", k + 1
    taken.add(out)
    return out


def _op_name(n: fx.Node) -> str:
    if n.op == "call_function":
        return str(getattr(n.target, "__name__", n.target)).split(".")[0]
    return str(n.target)


def _fuse(ops: fx.GraphModule, members: list[fx.Node], inputs: list[fx.Node], outs: list[fx.Node],
          name: str) -> fx.GraphModule:
    sub = fx.Graph()
    env: dict[fx.Node, fx.Node] = {a: sub.placeholder(a.name) for a in inputs}
    root: dict[str, Any] = {}
    for n in members:
        for a in n.all_input_nodes:
            if a.op == "get_attr" and a not in env:
                env[a] = sub.node_copy(a)
                root[str(a.target)] = get_path(ops, str(a.target))
        if n.op == "call_module":
            root[str(n.target)] = ops.get_submodule(str(n.target))
        env[n] = sub.node_copy(n, lambda a: env[a])
    sub.output(env[outs[0]] if len(outs) == 1 else tuple(env[o] for o in outs))
    guard_inplace(sub, root)
    fused = fx.GraphModule(root, sub, name)
    fused._pd_layer = True
    return fused


def is_layer(module: Any) -> bool:
    """Whether ``module`` is a fused layer of :func:`group_layers` (which :func:`inline` opens)."""
    return isinstance(module, fx.GraphModule) and getattr(module, "_pd_layer", False)


def module_name(gm: fx.GraphModule, node: fx.Node) -> str | None:
    """Fully qualified name in the model of the module ``node`` of a traced or captured graph calls (e.g.
    ``layer1.0``, ``0``), or None: a function or method node, a fused run of glue ops, or a module capture added."""
    if node.op != "call_module" or str(node.target).startswith(_OWN):
        return None
    target = gm.get_submodule(str(node.target))
    return getattr(target, "_pd_path", None) if is_layer(target) else str(node.target)


def inline(g: fx.Graph, layer: fx.GraphModule, args: tuple[Any, ...], root: dict[str, Any]) -> Any:
    """Copy ``layer``'s ops into ``g`` on ``args`` (nodes of ``g``), adding the objects they read to ``root``;
    returns the node (or tuple of nodes) of its output."""
    env: dict[fx.Node, Any] = {}
    phs = iter(args)
    for n in layer.graph.nodes:
        if n.op == "placeholder":
            env[n] = next(phs)
        elif n.op == "output":
            return fx.map_arg(n.args[0], lambda a: env[a])
        else:
            if n.op in ("get_attr", "call_module"):
                root[str(n.target)] = get_path(layer, str(n.target))
            env[n] = g.node_copy(n, lambda a: env[a])
    raise AssertionError("a graph without an output")


# ------------------------------------------------------------------------------------------------ in-place

_VIEWS = {"view", "reshape", "_unsafe_view", "slice", "select", "expand", "transpose", "permute", "unsqueeze",
          "squeeze", "t", "alias", "as_strided", "narrow", "flatten", "unflatten", "split", "chunk", "getitem",
          "view_as", "unbind", "detach", "contiguous"}


def _base_name(n: fx.Node) -> str:
    """``relu_`` for ``aten.relu_.default``, ``torch.relu_``, ``x.relu_()``; ``iadd`` for ``operator.iadd``."""
    t = n.target
    if n.op == "call_method":
        return str(t)
    name = getattr(t, "__name__", str(t))
    if hasattr(t, "overloadpacket"):
        name = t.overloadpacket.__name__  # type: ignore[union-attr]
    return str(name).split(".")[0]


def is_inplace(n: fx.Node, modules: dict[str, Any]) -> bool:
    """Whether node ``n`` overwrites its first argument (``relu_``, ``x += y``, ``nn.ReLU(inplace=True)``, ...)."""
    if n.op == "call_module":
        return bool(getattr(modules.get(str(n.target)), "inplace", False))
    if n.op not in ("call_function", "call_method"):
        return False
    if n.kwargs.get("inplace") is True:
        return True
    name = _base_name(n)
    return (name.endswith("_") and not name.startswith("_")) or name in ("iadd", "isub", "imul", "itruediv")


def guard_inplace(g: fx.Graph, modules: dict[str, Any]) -> int:
    """Clone every input of ``g`` that an in-place op would overwrite (directly or through a view): a tensor
    received from the previous stage is a leaf of autograd, which refuses in-place changes, and the input of a
    timed layer must stay the same across calls. Returns the inputs cloned."""
    marked: list[fx.Node] = []
    for n in g.nodes:
        if not (n.args and isinstance(n.args[0], fx.Node) and is_inplace(n, modules)):
            continue
        a = n.args[0]
        while a.op != "placeholder" and a.args and isinstance(a.args[0], fx.Node) and _base_name(a) in _VIEWS:
            a = a.args[0]
        if a.op == "placeholder" and a not in marked:
            marked.append(a)
    last = [n for n in g.nodes if n.op == "placeholder"][-1] if marked else None
    for ph in marked:
        users = list(ph.users)
        with g.inserting_after(last):
            copy = g.call_method("clone", (ph,))
        for u in users:
            u.replace_input_with(ph, copy)
    if marked:
        g.lint()
    return len(marked)
