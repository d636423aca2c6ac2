"""Layer graphs: the profile that the planner and the simulator consume.

A :class:`LayerGraph` is a DAG of :class:`Node` objects (one per profiled layer) with real edges, read
from and written to the original PipeDream release's ``graph.txt`` format:

    <id> -- <module> -- forward_compute_time=F, backward_compute_time=B, activation_size=A, parameter_size=P[ -- stage_id=K]
    \t<src_id> -- <dst_id>

F and B are milliseconds per profiled minibatch, A is bytes of the node's output for the whole
minibatch (a list ``[a1; a2]`` for several outputs, which counts as their sum), P is parameter bytes.
In memory, times are seconds (``fwd_s``, ``bwd_s``) and sizes bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipedream.errors import PipeDreamError
from pipedream.io import read_json_object, read_text
from pipedream.tied import Tied, duplicate_bytes

_NODE_RE = re.compile(
    r"^(?P<id>\S+) -- (?P<desc>.*) -- forward_compute_time=(?P<f>[^,]+), "
    r"backward_compute_time=(?P<b>[^,]+), activation_size=(?P<a>\[[^\]]*\]|[^,]+), "
    r"parameter_size=(?P<p>[^ ,]+)(?: -- stage_id=(?P<stage>\d+))?\s*$"
)
_EDGE_RE = re.compile(r"^\t(?P<src>\S+) -- (?P<dst>\S+)\s*$")


@dataclass
class Node:
    """One profiled layer.

    Attributes:
        node_id: unique name, e.g. ``"node4"``.
        desc: the module's repr, e.g. ``"Conv2d(3, 64, kernel_size=(3, 3))"``; ``"Input..."`` for inputs.
        fwd_s: forward compute time for one profiled minibatch, seconds.
        bwd_s: backward compute time for one profiled minibatch, seconds.
        activation_bytes: bytes of each output tensor for the whole minibatch (usually one entry).
        param_bytes: bytes of the layer's parameters.
        stage_id: stage this node belongs to in a partitioned graph, else ``None``.
    """

    node_id: str
    desc: str
    fwd_s: float
    bwd_s: float
    activation_bytes: tuple[float, ...]
    param_bytes: float
    stage_id: int | None = None

    @property
    def output_bytes(self) -> float:
        """Total bytes of all outputs for one profiled minibatch."""
        return float(sum(self.activation_bytes))

    @property
    def is_input(self) -> bool:
        """True for the data-input nodes, whose compute time planners ignore."""
        return self.desc.startswith("Input")


@dataclass
class LayerGraph:
    """A DAG of profiled layers; ``saved`` to ``tensors`` come from our profiler's ``graph.json`` beside graph.txt
    (empty for the release's profiles).

    Attributes:
        nodes: node id -> :class:`Node`, in file order.
        edges: ``(src_id, dst_id)`` pairs, in file order.
        minibatch_size: samples in the profiled minibatch (not stored in graph.txt; 0 if unknown).
        saved: per node, what autograd saves for its backward: bytes of saved storages other than its parameters,
            inputs and outputs (per minibatch), whether it saves an input, whether it saves an output.
        spread: per node, the interquartile range of its timed forward and backward calls, seconds.
        tied: parameter tensors that several nodes use (:class:`pipedream.tied.Tied`). Each user's ``param_bytes``
            includes the tensor: :meth:`param_bytes_of` counts it once.
        hidden: per node, the bytes of its parameters that are hidden matrices (the ``nn.Linear`` weights but the
            output layer's, which Muon updates: :func:`pipedream.runtime.optim.hidden_matrices`).
        isolated: per node, its forward and backward seconds timed alone, where ``fwd_s`` and ``bwd_s`` are the
            times inside whole steps (:mod:`pipedream.in_situ`).
        tensors: per node, how many parameter tensors that require a gradient it holds (a tied tensor in each of
            its users' counts): what an optimizer step walks one by one (:func:`pipedream.costmodel.optimizer_step_s`).
        split: per node, its backward's two halves timed apart, ``(I, W)`` seconds per minibatch: the gradient of
            its inputs and that of its weights (zero-bubble schedules run them apart; :meth:`backward_split`).
        modules: per node that calls a module, the module's fully qualified name in the model (``"0"``, ``"layer1.0"``;
            none for function nodes): our profiler's, which it writes to ``meta.json`` (``"modules"``, :func:`read_meta`)
            and :meth:`read` does not read back.
    """

    nodes: dict[str, Node] = field(default_factory=dict)
    edges: list[tuple[str, str]] = field(default_factory=list)
    minibatch_size: int = 0
    saved: dict[str, tuple[float, bool, bool]] = field(default_factory=dict)
    spread: dict[str, tuple[float, float]] = field(default_factory=dict)
    tied: list[Tied] = field(default_factory=list)
    hidden: dict[str, float] = field(default_factory=dict)
    isolated: dict[str, tuple[float, float]] = field(default_factory=dict)
    tensors: dict[str, int] = field(default_factory=dict)
    split: dict[str, tuple[float, float]] = field(default_factory=dict)
    modules: dict[str, str] = field(default_factory=dict)

    def backward_split(self, node_id: str) -> tuple[float, float]:
        """``(I, W)`` seconds per minibatch of a node's backward: the halves our profiler timed apart (:attr:`split`),
        scaled by the node's ``bwd_s`` over its backward timed alone where the profile keeps the times inside whole
        steps (:attr:`isolated`); without them (the release's profiles) :func:`split_fallback`. Raises KeyError for
        an unknown id."""
        node = self.nodes[node_id]
        if node_id not in self.split:
            return split_fallback(node.bwd_s, node.param_bytes > 0)
        alone = self.isolated.get(node_id, (0.0, node.bwd_s))[1]
        scale = node.bwd_s / alone if alone > 0 else 1.0
        i, w = self.split[node_id]
        return i * scale, w * scale

    def add_node(self, node: Node) -> None:
        """Add ``node``; raises :class:`PipeDreamError` if its id is already present."""
        if node.node_id in self.nodes:
            raise PipeDreamError(f"duplicate node id {node.node_id!r} in layer graph")
        self.nodes[node.node_id] = node

    def add_edge(self, src: str, dst: str) -> None:
        """Add the edge ``src -> dst``; both nodes must exist."""
        for end in (src, dst):
            if end not in self.nodes:
                raise PipeDreamError(f"edge {src} -- {dst} names unknown node {end!r}")
        self.edges.append((src, dst))

    def predecessors(self, node_id: str) -> list[str]:
        """Ids of nodes with an edge into ``node_id``, in edge order."""
        return [s for s, d in self.edges if d == node_id]

    def successors(self, node_id: str) -> list[str]:
        """Ids of nodes with an edge out of ``node_id``, in edge order."""
        return [d for s, d in self.edges if s == node_id]

    def topological_order(self) -> list[str]:
        """Node ids in a topological order (Kahn's algorithm, ties by file order).

        Raises:
            PipeDreamError: if the graph has a cycle (names one node on it).
        """
        position = {n: i for i, n in enumerate(self.nodes)}
        indegree = {n: 0 for n in self.nodes}
        out: dict[str, list[str]] = {n: [] for n in self.nodes}
        for s, d in self.edges:
            indegree[d] += 1
            out[s].append(d)
        ready = sorted((n for n, k in indegree.items() if k == 0), key=position.__getitem__)
        order: list[str] = []
        while ready:
            n = ready.pop(0)
            order.append(n)
            for d in out[n]:
                indegree[d] -= 1
                if indegree[d] == 0:
                    ready.append(d)
                    ready.sort(key=position.__getitem__)
        if len(order) != len(self.nodes):
            stuck = next(n for n in self.nodes if indegree[n] > 0)
            raise PipeDreamError(f"layer graph has a cycle through node {stuck!r}; a profile must be a DAG")
        return order

    def is_chain(self) -> bool:
        """True if every node has at most one predecessor and one successor."""
        ins = [d for _, d in self.edges]
        outs = [s for s, _ in self.edges]
        return len(set(ins)) == len(ins) and len(set(outs)) == len(outs)

    def param_bytes_of(self, nodes: Iterable[str]) -> float:
        """Parameter bytes that one replica of a stage made of ``nodes`` (ids) holds: their ``param_bytes``, a
        tensor several of them use (:attr:`tied`) counted once. Raises KeyError for an unknown id."""
        ids = list(nodes)
        return sum(self.nodes[n].param_bytes for n in ids) - duplicate_bytes(self.tied, ids)

    def param_tensors_of(self, nodes: Iterable[str]) -> int:
        """Parameter tensors (:attr:`tensors`) that one replica of a stage made of ``nodes`` (ids) steps over, a
        tensor several of them use (:attr:`tied`) counted once; a node without a record counts none."""
        ids = list(nodes)
        inside = set(ids)
        again = sum(max(0, sum(1 for n in t.nodes if n in inside) - 1) for t in self.tied)
        return max(0, sum(self.tensors.get(n, 0) for n in ids) - again)

    def hidden_bytes_of(self, nodes: Iterable[str]) -> float | None:
        """Bytes of hidden matrices (:attr:`hidden`) that one replica of a stage made of ``nodes`` holds, at most
        its :meth:`param_bytes_of` (a hidden matrix two of its nodes use is in both records); None when a node
        has no record (a profile taken before they were recorded)."""
        ids = list(nodes)
        if not all(n in self.hidden for n in ids):
            return None
        return min(sum(self.hidden[n] for n in ids), self.param_bytes_of(ids))

    def totals(self) -> dict[str, float]:
        """Sums over all nodes: ``fwd_s``, ``bwd_s``, ``activation_bytes``, ``param_bytes`` (each tied tensor
        once, :meth:`param_bytes_of`), ``nodes``."""
        nodes = self.nodes.values()
        return {"nodes": float(len(self.nodes)), "fwd_s": sum(n.fwd_s for n in nodes), "bwd_s": sum(n.bwd_s for n in nodes),
                "activation_bytes": sum(n.output_bytes for n in nodes), "param_bytes": self.param_bytes_of(self.nodes)}

    def scaled(self, batch: int) -> LayerGraph:
        """A copy with times and activation bytes scaled linearly to ``batch`` samples (§3.1's profile is per
        minibatch; the release optimizer also assumes linear scaling). Parameter bytes do not change.

        Raises:
            PipeDreamError: the profiled minibatch size is unknown (0) or ``batch`` is not positive.
        """
        if self.minibatch_size < 1 or batch < 1:
            raise PipeDreamError(f"cannot scale a profile of {self.minibatch_size} samples to {batch}; "
                                 "give the profiled minibatch size (meta.json or --profiled-batch)")
        f = batch / self.minibatch_size
        out = LayerGraph(minibatch_size=batch)
        for n in self.nodes.values():
            out.add_node(Node(n.node_id, n.desc, n.fwd_s * f, n.bwd_s * f, tuple(a * f for a in n.activation_bytes),
                              n.param_bytes, n.stage_id))
        out.edges = list(self.edges)
        out.saved = {k: (own * f, saves_in, saves_out) for k, (own, saves_in, saves_out) in self.saved.items()}
        out.tied = list(self.tied)
        out.hidden = dict(self.hidden)
        out.tensors = dict(self.tensors)
        out.split = {k: (i * f, w * f) for k in self.split for i, w in [self.backward_split(k)]}
        return out

    # ----------------------------------------------------------------------------------- I/O

    @classmethod
    def read(cls, path: str | Path, minibatch_size: int = 0) -> LayerGraph:
        """Read a graph.txt file (and, from the ``graph.json`` our profiler writes beside it when there is one,
        what each layer saves for its backward, :attr:`saved`, the tied parameters, :attr:`tied`, the bytes of
        hidden matrices, :attr:`hidden`, and the parameter tensors, :attr:`tensors`).

        Args:
            path: the file.
            minibatch_size: samples in the profiled minibatch, if known.
        Raises:
            PipeDreamError: on a missing file, a malformed line (names the line number), a duplicate
                node, an edge to an unknown node, a cycle, a ``graph.json`` that is not a JSON object, or a
                tied-parameter record in it that is malformed or names a node graph.txt does not have.
        """
        path = Path(path)
        text = read_text(path, "profile", "the graph.txt file inside it", "a graph.txt profile",
                         "; run `pipedream profile` first or check the path")
        graph = cls.parse(text, source=str(path), minibatch_size=minibatch_size)
        beside = path.with_name("graph.json")  # our profiler's: what each node saves for its backward
        if beside.is_file():
            doc = read_json_object(beside, "profile", "a graph.json file", "run `pipedream profile` again")
            for n in doc.get("nodes", []):
                if "saved_bytes" in n and n.get("id") in graph.nodes:
                    graph.saved[n["id"]] = (float(n["saved_bytes"]), bool(n["saves_input"]), bool(n["saves_output"]))
                if "hidden_bytes" in n and n.get("id") in graph.nodes:
                    graph.hidden[n["id"]] = float(n["hidden_bytes"])
                if "param_tensors" in n and n.get("id") in graph.nodes:
                    graph.tensors[n["id"]] = int(n["param_tensors"])
                if "input_grad_s" in n and "weight_grad_s" in n and n.get("id") in graph.nodes:
                    graph.split[n["id"]] = (float(n["input_grad_s"]), float(n["weight_grad_s"]))
                if "isolated_bwd_s" in n and n.get("id") in graph.nodes:
                    graph.isolated[n["id"]] = (float(n.get("isolated_fwd_s", 0.0)), float(n["isolated_bwd_s"]))
            graph.tied = [Tied.from_json(t, graph.nodes) for t in doc.get("tied", [])]
        return graph

    @classmethod
    def parse(cls, text: str, source: str = "<string>", minibatch_size: int = 0) -> LayerGraph:
        """Parse graph.txt text; see :meth:`read` for errors."""
        graph = cls(minibatch_size=minibatch_size)
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            if line.startswith("\t"):
                m = _EDGE_RE.match(line)
                if not m:
                    raise PipeDreamError(f"{source}:{lineno}: malformed edge line {line.strip()!r}; expected '<src> -- <dst>'")
                try:
                    graph.add_edge(m["src"], m["dst"])
                except PipeDreamError as e:
                    raise PipeDreamError(f"{source}:{lineno}: {e}") from None
                continue
            m = _NODE_RE.match(line)
            if not m:
                raise PipeDreamError(f"{source}:{lineno}: malformed node line; expected '<id> -- <module> -- "
                                     "forward_compute_time=F, backward_compute_time=B, activation_size=A, parameter_size=P'")
            try:
                fwd_ms, bwd_ms, param = float(m["f"]), float(m["b"]), float(m["p"])
                a = m["a"].strip()
                acts = tuple(float(x) for x in a[1:-1].split(";")) if a.startswith("[") else (float(a),)
            except ValueError:
                raise PipeDreamError(f"{source}:{lineno}: a number on this node line does not parse") from None
            if min(fwd_ms, bwd_ms, param, *acts) < 0:
                raise PipeDreamError(f"{source}:{lineno}: negative time or size for node {m['id']!r}")
            stage = int(m["stage"]) if m["stage"] is not None else None
            try:
                graph.add_node(Node(m["id"], m["desc"], fwd_ms / 1e3, bwd_ms / 1e3, acts, param, stage))
            except PipeDreamError as e:
                raise PipeDreamError(f"{source}:{lineno}: {e}") from None
        if not graph.nodes:
            raise PipeDreamError(f"{source}: no nodes; is this a graph.txt profile?")
        graph.topological_order()  # raises on a cycle
        return graph

    def to_text(self) -> str:
        """The graph in graph.txt format (times in ms with 6 decimals, sizes with 1)."""
        lines = []
        for n in self.nodes.values():
            acts = "; ".join(f"{a:.1f}" for a in n.activation_bytes)
            acts = acts if len(n.activation_bytes) == 1 else f"[{acts}]"
            line = (f"{n.node_id} -- {n.desc} -- forward_compute_time={n.fwd_s * 1e3:.6f}, "
                    f"backward_compute_time={n.bwd_s * 1e3:.6f}, activation_size={acts}, parameter_size={n.param_bytes:.1f}")
            if n.stage_id is not None:
                line += f" -- stage_id={n.stage_id}"
            lines.append(line)
        lines.extend(f"\t{s} -- {d}" for s, d in self.edges)
        return "\n".join(lines) + "\n"

    def write(self, path: str | Path) -> None:
        """Write graph.txt atomically (a temporary file renamed into place)."""
        from pipedream.io import atomic_write_text

        atomic_write_text(Path(path), self.to_text())


def split_fallback(bwd_s: float, has_weights: bool) -> tuple[float, float]:
    """``(I, W)`` of a backward of ``bwd_s`` seconds that was not timed in halves (the release's profiles, ours
    before they recorded them): half each for a layer with weights, all ``I`` for one without (no weight gradient).
    The zero-bubble paper's own assumption, F = I = W with B = 2F (Qi et al., ICLR'24, section 2), gives the same
    halves."""
    return (bwd_s / 2, bwd_s / 2) if has_weights else (bwd_s, 0.0)


def read_meta(profile_path: str | Path) -> dict[str, Any]:
    """The ``meta.json`` beside a graph.txt (profiled minibatch size, device, granularity), or ``{}``.

    ``pipedream profile`` writes it; the release's V100 profiles in ``experiments/data/profiles`` ship one.

    Raises:
        PipeDreamError: the file is not a JSON object.
    """
    meta = Path(profile_path).parent / "meta.json"
    if not meta.exists():
        return {}
    return read_json_object(meta, "profile metadata", "a meta.json file",
                            "fix it or delete it and pass --profiled-batch")


def profiled_batch(profile_path: str | Path, given: int | None = None) -> int:
    """Samples in the profiled minibatch of a graph.txt: ``given`` if set, else ``minibatch_size`` in the
    meta.json beside it.

    Raises:
        PipeDreamError: ``given`` is not positive, or neither it nor a meta.json says the size.
    """
    if given is not None:
        if given < 1:
            raise PipeDreamError(f"--profiled-batch must be a positive number of samples, not {given}")
        return int(given)
    meta = read_meta(profile_path)
    value = meta.get("minibatch_size")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if meta:
        raise PipeDreamError(f"{Path(profile_path).parent / 'meta.json'} has no positive integer 'minibatch_size'; "
                             "pass --profiled-batch N")
    raise PipeDreamError(f"profiled minibatch size of {profile_path} unknown: pass --profiled-batch N "
                         "(no meta.json beside it)")
