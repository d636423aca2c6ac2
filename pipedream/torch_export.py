"""A plan as torch.distributed.pipelining's inputs (``pipedream plan --runtime torch``, ``--export torch``).

:func:`torch_section` is ``plan.extra["torch"]`` for a plan of one of torch's seven schedules
(:data:`pipedream.torch_schedules.TORCH_CLASSES`):

* ``schedule_class``, ``n_microbatches``, ``microbatch_size`` and ``stages_per_rank``: the class of
  ``torch.distributed.pipelining.schedules`` and what it is built with (``n_microbatches`` a minibatch of
  ``n_microbatches x microbatch_size`` samples on each pipeline);
* ``stage_to_rank``: per stage (chunk, in model order) its rank within its pipeline (torch's group rank), as torch's
  lists place it (:func:`pipedream.torch_schedules.positions`: loop, or V for ZBV and DualPipeV);
* ``pipelines``: per pipeline (data-parallel replica of the whole pipeline) the global rank of each position;
* ``first_modules``: per stage the fully qualified name of the first module it calls (the profile's
  ``meta.json`` ``"modules"``, :attr:`pipedream.graph.LayerGraph.modules`), None for a stage that begins with no
  module call; ``split_spec``: ``{name: "BEGINNING"}`` for stages ``1 ..``, the ``split_spec`` of
  ``torch.distributed.pipelining.pipeline`` (``SplitPoint.BEGINNING``), which then gives the plan's stages; None
  where no ``split_spec`` gives them, with the reason in ``split_spec_note`` (a profile without module names, a
  stage that begins with no module or with a module called several times, whose every call would be split). Function
  nodes without parameters that begin a stage (a residual ``add``) run at the end of the previous stage under
  torch's split, since it cuts before a module only: ``split_spec_note`` names them.

:func:`schedule_rows` is the schedule's action lists as torch's ``_PipelineScheduleMulti._dump_csv`` writes them
and its ``_load_csv`` reads them (:func:`write_schedule_csv`).
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph
from pipedream.plan import Plan
from pipedream.schedules import COMPUTE, pipedream_flush
from pipedream.torch_layout import layout
from pipedream.torch_schedules import TORCH_CLASSES, iteration_defect, torch_ops, torch_schedule, torch_text

SPLIT_POINT = "BEGINNING"  # torch.distributed.pipelining.SplitPoint's name: a stage begins at the module


def first_modules(plan: Plan, graph: LayerGraph, modules: Mapping[str, str]) -> tuple[list[str | None], str | None]:
    """Per stage of ``plan`` the name of the first module it calls (node order of ``graph``; ``modules``: node id to
    fully qualified name), and a note saying why no ``split_spec`` gives these stages (starting with ``"no "``)
    or which function nodes move to the previous stage under torch's split, or None (module docstring)."""
    if not modules:
        return [None] * len(plan.stages), ("no split_spec: the profile names no modules (no \"modules\" in its "
                                           "meta.json); profile the model again with `pipedream profile`")
    order = {n: k for k, n in enumerate(graph.nodes)}
    calls = Counter(modules.values())
    names: list[str | None] = []
    refusals, moved = [], []
    for s, stage in enumerate(plan.stages):
        ops = sorted((n for n in stage.nodes if not graph.nodes[n].is_input), key=order.__getitem__)
        lead = next((k for k, n in enumerate(ops) if n in modules), None)
        names.append(modules[ops[lead]] if lead is not None else None)
        if s == 0:
            continue
        if lead is None:
            refusals.append(f"stage {s} calls no module")
            continue
        fqn = modules[ops[lead]]
        held = [n for n in ops[:lead] if graph.nodes[n].param_bytes > 0]
        if calls[fqn] > 1:
            refusals.append(f"stage {s} begins at {fqn}, a module called {calls[fqn]} times")
        elif held:
            refusals.append(f"stage {s} begins with {', '.join(held)}, function nodes holding parameters")
        elif lead:
            moved.append(f"{', '.join(ops[:lead])} (before {fqn}) at the end of stage {s - 1}")
    if refusals:
        return names, f"no split_spec: {'; '.join(refusals)}; torch's split_spec cuts before every call of a module only"
    return names, (f"function nodes without parameters run {'; '.join(moved)} under this split_spec" if moved else None)


def torch_section(plan: Plan, graph: LayerGraph, modules: Mapping[str, str]) -> dict[str, Any]:
    """``plan.extra["torch"]`` (module docstring) of a plan of ``pipedream plan --schedule`` for one of torch's
    seven schedules, whose stages' node ids are those of ``graph`` and ``modules`` (the profile's meta.json).

    Raises:
        PipeDreamError: the plan's schedule is not one of torch's, or its stages are not where torch's lists put them
            (:func:`pipedream.torch_layout.layout`).
    """
    name = plan.extra.get("schedule")
    if name not in TORCH_CLASSES:
        raise PipeDreamError(f"schedule {name!r} is not one of torch.distributed.pipelining's; plan with --schedule "
                             f"auto or one of {', '.join(TORCH_CLASSES)}")
    lay = layout(plan, name)
    names, note = first_modules(plan, graph, modules)
    refused = note is not None and note.startswith("no ")
    return {"schedule_class": lay.torch_class, "n_microbatches": int(plan.extra["microbatches"]),
            "microbatch_size": int(plan.extra["microbatch_size"]), "stages_per_rank": lay.chunks,
            "stage_to_rank": lay.position, "pipelines": lay.pipelines, "first_modules": names,
            "split_spec": None if refused else {n: SPLIT_POINT for n in names[1:]},
            **({"split_spec_note": note} if note else {})}


def schedule_rows(name: str, n_ranks: int, n_microbatches: int, chunks: int) -> list[list[str]]:
    """Per pipeline position, the compute actions of schedule ``name`` in torch's text form (``"2F0"``, DualPipeV's
    ``"(0F3;3B1)OVERLAP_F_B"``), ``""`` for an idle slot: the class's ``pipeline_order``
    (:func:`pipedream.torch_schedules.torch_schedule`) less its ``REDUCE_GRAD``, which a compute-only list leaves
    out. torch's ``Schedule1F1B`` list, which numbers the last rank's forwards ``1 .. m``
    (docs/schedules.md), is replaced by PipeDream-Flush's own (:func:`pipedream.schedules.pipedream_flush`), the
    same schedule.

    Raises:
        PipeDreamError: counts torch refuses.
    """
    order = torch_schedule(name, n_ranks, n_microbatches, chunks).pipeline_order
    if name == "pipedream_flush" and iteration_defect(torch_ops(name, n_ranks, n_microbatches, chunks), n_ranks,
                                                       n_microbatches):
        ours = pipedream_flush([[r] for r in range(n_ranks)], 1, n_microbatches).order
        return [[torch_text(a) for a in ours[r] if a.kind in COMPUTE] for r in range(n_ranks)]
    return [["" if a is None else str(a) for a in order[r] if a is None or a.is_compute_op] for r in range(n_ranks)]


def write_schedule_csv(section: Mapping[str, Any], path: str | Path) -> None:
    """Write the action lists of ``section`` (:func:`torch_section`) to ``path`` as ``_dump_csv`` does: one row per
    pipeline position, which ``schedule._load_csv(path)`` reads into the schedule's ``pipeline_order``.

    Raises:
        PipeDreamError: counts torch refuses.
    """
    ours = {cls: name for name, cls in TORCH_CLASSES.items()}[section["schedule_class"]]
    ranks = max(section["stage_to_rank"]) + 1
    rows = schedule_rows(ours, ranks, section["n_microbatches"], section["stages_per_rank"])
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
