"""The PipeDream planner (paper §3.1): profile + cluster -> :class:`pipedream.plan.Plan`.

``plan_pipeline(graph, cluster, model=..., minibatch_size=...) -> Plan`` (:mod:`.core`; in default mode
the dynamic program's candidates are re-ranked with the event simulator, :mod:`.rerank`).

Pipeline of the package:

* :mod:`.states`: antichain states of the layer DAG, enumerated as the release does;
* :mod:`.recurrence`: one level of the dynamic program (the recurrences for ``T(i→j, m)`` and ``A(j, m)``),
  all rows at once or one row with back-pointers; :mod:`.prune` and :mod:`.banded` make the innermost
  level fast without changing a value;
* :mod:`.hierarchy`: level by level, innermost first, then the chosen splits expanded into stages;
* :mod:`.core`: stages of graph nodes, ranks, the per-stage numbers; :mod:`.explain`: the stage table
  and ``--explain``;
* :mod:`.plan`: the :class:`Plan` it writes and the runtime and simulator read;
* :mod:`.fixed_split`: the fixed splitter: a layer split for a given replica vector (the paper's "15-1",
  "straight"), to simulate configurations the planner did not choose.

Two modes. ``compat=True`` reproduces the predicted time per sample of the release's
``optimizer_graph_hierarchical.py`` for the same graph and flags (``-n``/``-b`` = the cluster's levels,
``--use_memory_constraint -s`` = ``memory_limit`` with the cluster's device memory,
``--straight_pipeline``, ``--activation_compression_ratio``). The default mode fixes what is wrong in it.
The differences (default mode vs. the release) and why:

1. Activation transfers are always charged (compression ratio 1 unless given). The release ignores
   them entirely unless ``--activation_compression_ratio`` is passed, although §3.1's ``A(j, m)``
   includes the ``2 C_i`` term; without it a split is free and communication-heavy models
   (GNMT, VGG's early layers) look better pipelined than they are.
2. The activation bytes of a split are those of the nodes inside the state that feed a node outside it.
   The release sums the state's *augmented* antichain, which can count nodes whose consumers are all
   inside the state already (e.g. the fork of a residual block once both branches have started).
3. At upper levels the weight-sync term of a replicated last stage is divided by the devices per group,
   as the release does for an unsplit segment and for its data-parallel baseline. The release omits the
   division only for the last stage of a split, so the same stage costs ``g`` times more sync when it is
   not alone. (Also: the release divides by the previous level's width, we by the devices per group;
   the two agree for two levels.)
4. Memory: a stage must fit its working copy too (``versions = ceil(downstream / replicas) + 1``). The
   release counts only the extra stashed versions, so an unsplit data-parallel segment or a last stage
   never fails the check however large it is. At an upper level the segment is spread over the
   devices of a group, so its bytes are divided by the devices per group before the check (the release
   compares a whole segment with one device's memory).
5. A split must follow a state that contains the segment's start. The release accepts any state later
   in topological order, so on DAGs (ResNet, GNMT) a segment can be "split" at a state that does not
   contain its start; the stage times it then uses are differences of non-nested sets, which can even be
   negative, and the predicted time can be better than any real split (a plan's ``extra["warnings"]``
   says so when it happens; on the five shipped profiles it never changes the result).
6. Ties are broken by a stated rule, in both modes: an unsplit stage beats a split of equal time, then
   the split after the earliest state (topological index) wins, then the fewest replicas in the last
   stage. The release breaks them by set iteration order, which changes from run to run, so its config
   string can differ from ours (and from run to run) while the predicted time is the same.

7. Default mode re-ranks (:mod:`.rerank`): the dynamic program's plans (with and without a straight
   pipeline, the memory limit and the optimizer step), :mod:`.fixed_split`'s split of their replica vectors and the paper's
   shapes (``16``, ``15-1``, ``14-1-1``, ``13-1-1-1``, straight) are simulated as our runtime runs them
   (1F1B-RR with the consistent warm-up, lockstep ring allreduce overlapped with the backward, links
   shared), and the fastest is returned with the simulated time as its estimate (the solver's own estimate
   stays in ``extra["solver_estimate"]``). §3.1's cost model has no warm-up, independent replicas and no
   contention, and on the paper's models that gap decides the plan (VGG-16 on cluster A: the solver's
   9-3-2-1-1 simulates at 0.43x of 15-1). ``rerank=False`` returns the dynamic program's plan.
8. The memory limit is on by default (the release's ``--use_memory_constraint`` is off by default; compat
   keeps that), and in the re-ranking a stage must fit what our runtime keeps on a device
   (:func:`.rerank.runtime_memory_bytes`: its warm-up count of weight versions and activations).
9. Costs come from the one cost model, :mod:`pipedream.costmodel`, which the simulator and the runtime use
   too: a replicated stage's weight sync is a ring allreduce, ``2 (n - 1) / n * P / B`` plus ``2 (n - 1)``
   per-step latencies (the cluster's ``latency_s``, else ``costmodel.DEFAULT_STEP_LATENCY_S``), and each
   activation transfer ``latency + a / B``. The release charges ``4 (n - 1) P / (B n)`` (every byte twice,
   as through a parameter server) and no latency; compat mode keeps those formulas, in
   :mod:`.compat` and nowhere else.
10. Tied parameters (a tensor several layers use, :mod:`pipedream.tied`; the release's profiles have none): a
   stage holding several of its users counts its bytes once, and each stage holding one counts them (each keeps
   a copy); the dynamic program does so through per-state counts of each tensor's users
   (:attr:`.states.StateGraph.tied_users`, :func:`.recurrence.segment_params`), compat mode counts it once per
   user as the release does. In both modes the plan is for 1F1B, so no plan is returned whose stages holding one
   tied tensor have different replica counts, which the runtime refuses (:func:`pipedream.tied.plan_conflict`,
   the rule of :func:`pipedream.runtime.shared.check`): the re-ranking drops such candidates, and without it the
   dynamic program's refused plan gives way to its straight pipeline or data parallelism, whichever it estimates
   faster (the rule ties stages far apart, which the recurrence over consecutive stages cannot express).
11. The optimizer step is charged (:func:`.recurrence.step_s`, :class:`pipedream.costmodel.StepRates`): each
   replica steps its stage's parameters once per minibatch it trains, beside its compute, with copy on write
   where the stage stashes weight versions, at the rates the run's profile measured (``pipedream plan
   --optimizer``; per call, per tensor and per byte) or memory-bound at a V100's bandwidth; data parallelism
   steps the whole model on every worker. §3.1 leaves it out, and so does compat mode. It matters on CPUs, where
   a step is 3-48% of a stage's time (the reduced models' Adam on the 2-core CI machine); the re-ranking
   simulates it too, and also simulates the dynamic program's answer without it (difference 7).

What compat mode cannot copy: the release numbers its states in a depth-first order that depends on
Python's string hash seed; we use file order instead. Only difference 5 makes the predicted time depend
on that order, and on the shipped profiles it does not (checked with shuffled orders). The release's
``--use_fewer_machines`` and ``-m`` options are not offered.
"""

from pipedream.planner.core import PlanOptions, plan_pipeline

__all__ = ["PlanOptions", "plan_pipeline"]
