"""The PipeDream planner (paper §3.1): profile + cluster -> :class:`pipedream.plan.Plan`.

``plan_pipeline(graph, cluster, model=..., minibatch_size=...) -> Plan`` (:mod:`.core`). Its parts: the antichain
states of the layer DAG (:mod:`.states`); one level of the dynamic program (:mod:`.recurrence`, made fast without
changing a value by :mod:`.prune` and :mod:`.banded`); the levels, innermost first (:mod:`.hierarchy`); the stage
table and ``--explain`` (:mod:`.explain`); the re-ranking by simulation (:mod:`.rerank`); the split for a given
replica vector (:mod:`.fixed_split`: the paper's "15-1", "straight").

Two modes. ``compat=True`` reproduces the predicted time per sample of the release's
``optimizer_graph_hierarchical.py`` for the same graph and flags (``-n``/``-b`` = the cluster's levels,
``--use_memory_constraint -s`` = ``memory_limit`` with the cluster's device memory,
``--straight_pipeline``, ``--activation_compression_ratio``). The default mode fixes what is wrong in it:

1. Activation transfers are always charged (compression ratio 1 unless given); the release ignores them unless
   ``--activation_compression_ratio`` is passed, although §3.1's ``A(j, m)`` includes the ``2 C_i`` term, so
   communication-heavy models (GNMT, VGG's early layers) look better pipelined than they are.
2. The activation bytes of a split are those of the nodes inside the state that feed a node outside it. The
   release sums the state's *augmented* antichain, which can count nodes whose consumers are all inside it.
3. At upper levels the weight-sync term of a replicated last stage is divided by the devices per group, as the
   release does for an unsplit segment and its data-parallel baseline but not for the last stage of a split (the
   release divides by the previous level's width; the two agree for two levels).
4. Memory: a stage must fit its working copy too (``versions = ceil(downstream / replicas) + 1``); the release
   counts only the extra stashed versions, so an unsplit segment or a last stage never fails the check. At an
   upper level a segment's bytes are divided by the devices per group before the check.
5. A split must follow a state that contains the segment's start. The release accepts any later state, so on
   DAGs (ResNet, GNMT) the stage times it uses can be differences of non-nested sets, even negative (a plan's
   ``extra["warnings"]`` says so; on the five shipped profiles it never changes the result).
6. Ties are broken by a stated rule, in both modes: an unsplit stage beats a split of equal time, then the split
   after the earliest state, then the fewest replicas in the last stage (the release's set order changes from
   run to run, so its config string can differ from ours at the same predicted time).
7. Default mode re-ranks (:mod:`.rerank`): the dynamic program's plans (with and without a straight pipeline, the
   memory limit and the optimizer step), :mod:`.fixed_split`'s split of their replica vectors and the paper's
   shapes (``16``, ``15-1``, ``14-1-1``, ``13-1-1-1``, straight) are simulated as our runtime runs them (1F1B-RR
   with the consistent warm-up, lockstep ring allreduce overlapped with the backward, links shared), and the
   fastest is returned with the simulated time as its estimate (the solver's in ``extra["solver_estimate"]``).
   §3.1's cost model has no warm-up, independent replicas and no contention, and on the paper's models that gap
   decides the plan. ``rerank=False`` returns the dynamic program's plan.
8. The memory limit is on by default (compat keeps the release's off), and in the re-ranking a stage must fit
   what our runtime keeps on a device (:func:`.rerank.runtime_memory_bytes`).
9. Costs come from the one cost model, :mod:`pipedream.costmodel`, which the simulator and the runtime use too: a
   replicated stage's weight sync is a ring allreduce, ``2 (n - 1) / n * P / B`` plus ``2 (n - 1)`` per-step
   latencies, and each activation transfer ``latency + a / B``. The release charges ``4 (n - 1) P / (B n)`` and
   no latency; compat mode keeps those formulas, in :mod:`.compat` and nowhere else.
10. Tied parameters (:mod:`pipedream.tied`; the release's profiles have none): a stage holding several of a
   tensor's users counts its bytes once, and each stage holding one counts them (through per-state counts of
   each tensor's users, :attr:`.states.StateGraph.tied_users`); compat mode counts it once per user. No plan is
   returned whose stages holding one tied tensor have different replica counts, which the runtime refuses under
   1F1B (:func:`pipedream.tied.plan_conflict`): the re-ranking drops such candidates, and without it the dynamic
   program's refused plan gives way to its straight pipeline or data parallelism, whichever it estimates faster.
11. The optimizer step is charged (:func:`.recurrence.step_s`, :class:`pipedream.costmodel.StepRates`): each
   replica steps its stage's parameters once per minibatch it trains, with copy on write where the stage stashes
   weight versions, at the rates the run's profile measured (``pipedream plan --optimizer``) or memory-bound at a
   V100's bandwidth; data parallelism steps the whole model on every worker. §3.1 leaves it out, and so does
   compat mode; on CPUs a step is a few percent to half of a stage's time.

What compat mode cannot copy: the release numbers its states in a depth-first order that depends on Python's
string hash seed; we use file order instead. Only difference 5 makes the predicted time depend on that order, and
on the shipped profiles it does not. The release's ``--use_fewer_machines`` and ``-m`` options are not offered.
"""

from pipedream.planner.core import PlanOptions, plan_pipeline

__all__ = ["PlanOptions", "plan_pipeline"]
