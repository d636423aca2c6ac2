"""The PipeDream planner (paper §3.1): antichain states, the hierarchical DP, the resulting Plan.

``plan_pipeline(graph, cluster, model=..., minibatch_size=...) -> Plan``; see :mod:`.core`.
"""

from pipedream.planner.core import plan_pipeline

__all__ = ["plan_pipeline"]
