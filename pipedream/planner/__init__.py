"""The PipeDream planner (paper §3.1): profile + cluster -> :class:`pipedream.plan.Plan`.

``plan_pipeline(graph, cluster, model=..., minibatch_size=...) -> Plan`` (:mod:`.core`). Its parts: the antichain
states of the layer DAG (:mod:`.states`); one level of the dynamic program (:mod:`.recurrence`, made fast without
changing a value by :mod:`.prune` and :mod:`.banded`); the levels, innermost first (:mod:`.hierarchy`); the stage
table and ``--explain`` (:mod:`.explain`); the re-ranking by simulation (:mod:`.rerank`); the split for a given
replica vector (:mod:`.fixed_split`: the paper's "15-1", "straight").

Two modes: ``compat=True`` reproduces the predicted time per sample of the release's
``optimizer_graph_hierarchical.py`` for the same graph and flags; the default mode fixes what is wrong in it (the
eleven differences, each with its reason, and what compat mode cannot copy: docs/planner.md).
"""

from pipedream.planner.core import PlanOptions, plan_pipeline

__all__ = ["PlanOptions", "plan_pipeline"]
