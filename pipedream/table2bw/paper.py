"""Paper-scale costs of the GPT models of PipeDream-2BW, from FLOP counts (no V100 profile of them exists here).

The paper's facts (from a transcription of its text; the speedups and perplexities are below): 8 x V100 16 GB
p3.16xlarge servers, NVLink inside, 25 Gbps between; GPT models of 1.3, 2.2 and 3.8-3.9 billion parameters,
sequence 512. The number of servers is ours: 8 (64 GPUs, cluster ``B_8x8``), as we read the paper's experiments.

Per-layer costs, for ``b`` samples of ``s`` tokens, width ``h``, ``a`` heads, vocabulary ``V``:

* a transformer block's forward: ``b (24 s h^2 + 4 s^2 h)`` FLOPs (the matrix multiplies: QKV, attention scores
  and values, output projection, the 4h MLP; Narayanan et al., SC 2021, §5.1), its backward twice that;
* the head (vocabulary projection): ``2 b s h V`` forward, twice that backward; the embedding lookup: 0;
* seconds = FLOPs / (:data:`V100_PEAK_FLOPS` x :data:`ACHIEVED_FRACTION`). ASSUMED: 30% of the V100's
  125 TFLOP/s fp16 peak, what Megatron-LM reports for a 1.2B GPT on one V100 (Shoeybi et al. 2019: 39 TFLOP/s);
  layer norms, softmax and dropout are inside that fraction, not counted apart;
* activations in fp16: a block's output ``2 b s h`` bytes (what crosses a stage boundary) and what its
  backward keeps, ``b s h (34 + 5 a s / h)`` bytes (Korthikanti et al. 2022, "Reducing Activation Recomputation
  in Large Transformer Models", §4.1: fp16 tensors and 1-byte dropout masks); the head keeps its input
  (``2 b s h``) and the fp32 probabilities of the loss (``4 b s V``) beside its fp16 logits;
* parameters counted at 4 bytes (fp32): with 2BW's two weight versions, a gradient and Adam's two moments
  that is 20 bytes a parameter (mixed precision would hold 18: two fp16 versions, an fp16 gradient, an fp32
  master copy and two fp32 moments).
"""

from __future__ import annotations

from pipedream.graph import LayerGraph, Node
from pipedream.models import layer_node_id
from pipedream.models.transformer import TransformerConfig

V100_PEAK_FLOPS = 125e12  # fp16 tensor-core peak of the V100 SXM2 (NVIDIA datasheet), FLOP/s
ACHIEVED_FRACTION = 0.30  # ASSUMED share of the peak that a GPT layer achieves (module docstring)
ACTIVATION_BYTES = 2  # fp16 activations
PARAMETER_BYTES = 4  # fp32 weights, gradients and optimizer state
TOKEN_BYTES = 8  # int64 token ids (the pipeline's input)
PAPER_CLUSTER = "B_8x8"
PAPER_BATCHES = (512, 2048)  # "small" (our choice of small) and the paper's 2048
PAPER_DEPTH = {"GPT-2.2B": 8, "GPT-3.8B": 16}  # the depth the paper's planner chose
PAPER_SPEEDUP = {  # 2BW's throughput over the schedule's, as the paper states it
    "gpipe": "up to 3.2x",
    "pipedream_flush": "up to 1.6x (small batches), 1.15x at batch 2048",
}
PAPER_PERPLEXITY = {"vanilla": 19.28, "2bw": 19.56}  # GPT, final validation perplexity


def block_forward_flops(cfg: TransformerConfig, samples: float) -> float:
    """Forward FLOPs of one transformer block for ``samples`` sequences: ``b (24 s h^2 + 4 s^2 h)``."""
    s, h = cfg.seq, cfg.hidden
    return samples * (24 * s * h**2 + 4 * s**2 * h)


def head_forward_flops(cfg: TransformerConfig, samples: float) -> float:
    """Forward FLOPs of the vocabulary projection: ``2 b s h V``."""
    return samples * 2 * cfg.seq * cfg.hidden * cfg.vocab


def block_saved_bytes(cfg: TransformerConfig, samples: float) -> float:
    """Bytes one block's backward keeps for ``samples`` sequences: ``b s h (34 + 5 a s / h)`` (fp16, Korthikanti
    et al. 2022)."""
    s, h = cfg.seq, cfg.hidden
    return samples * s * h * (34 + 5 * cfg.heads * s / h)


def transformer_graph(cfg: TransformerConfig, samples: int = 1,
                      flops_per_s: float = V100_PEAK_FLOPS * ACHIEVED_FRACTION) -> LayerGraph:
    """A chain profile of ``cfg`` (input, embedding, ``cfg.layers`` blocks, head; node ids as the registered
    model's, :func:`pipedream.models.layer_node_id`) for ``samples`` sequences per profiled minibatch, from the
    FLOP counts and byte counts of the module docstring; ``saved`` carries what each layer keeps for its
    backward, so :func:`pipedream.memory.plan_memory` counts it; ``hidden`` the bytes of each block's four weight
    matrices (``12 h^2`` parameters: QKV, output projection, MLP; the head's projection is the output layer), which
    Muon updates (:func:`pipedream.runtime.optim.hidden_matrices`)."""
    s, h, v = cfg.seq, cfg.hidden, cfg.vocab
    hidden_bytes = ACTIVATION_BYTES * samples * s * h
    g = LayerGraph(minibatch_size=samples)
    g.add_node(Node("node0", "Input0", 0.0, 0.0, (TOKEN_BYTES * samples * s,), 0.0))
    g.hidden["node0"] = 0.0
    layers: list[tuple[str, float, float, float, float]] = [  # desc, forward FLOPs, output bytes, params, saved
        (f"Embedding(vocab={v}, seq={s}, hidden={h})", 0.0, hidden_bytes, (v + s) * h, samples * s * h)]
    block = (f"Block(hidden={h}, heads={cfg.heads}, causal={cfg.causal})", block_forward_flops(cfg, samples),
             hidden_bytes, cfg.block_parameters(), block_saved_bytes(cfg, samples))
    layers += [block] * cfg.layers
    layers.append((f"Head(hidden={h}, vocab={v})", head_forward_flops(cfg, samples),
                   ACTIVATION_BYTES * samples * s * v, h * v + 2 * h, hidden_bytes + 4 * samples * s * v))
    prev = "node0"
    for i, (desc, flops, out_bytes, params, saved) in enumerate(layers):
        nid = layer_node_id(i)
        fwd = flops / flops_per_s
        g.add_node(Node(nid, desc, fwd, 2 * fwd, (out_bytes,), PARAMETER_BYTES * params))
        g.add_edge(prev, nid)
        g.saved[nid] = (saved, False, False)
        g.hidden[nid] = PARAMETER_BYTES * 12 * h * h if desc.startswith("Block") else 0.0
        prev = nid
    return g
