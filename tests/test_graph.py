"""graph.txt reader/writer: round trip on the shipped profiles and clear errors on bad input."""

from __future__ import annotations

import pytest

from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph
from tests.conftest import PROFILE_NAMES, PROFILES

# Reference counts from ../shared/profiles/README.md (nodes) and the files' edge lines.
EXPECTED = {"alexnet": (23, 23), "vgg16": (41, 41), "resnet50": (177, 193), "gnmt": (48, 58), "gnmt_large": (96, 122)}


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_round_trip_preserves_counts_and_sums(name: str, tmp_path) -> None:
    g = LayerGraph.read(PROFILES / name / "graph.txt")
    assert (len(g.nodes), len(g.edges)) == EXPECTED[name]
    out = tmp_path / "graph.txt"
    g.write(out)
    g2 = LayerGraph.read(out)
    assert list(g2.nodes) == list(g.nodes)
    assert g2.edges == g.edges
    for key, value in g.totals().items():
        assert g2.totals()[key] == pytest.approx(value, rel=1e-12, abs=1e-12)
    assert len(g.topological_order()) == len(g.nodes)


def test_units_and_multi_output_sizes() -> None:
    g = LayerGraph.read(PROFILES / "gnmt" / "graph.txt")
    lstm = g.nodes["node7"]  # LSTM(2048, 1024): forward 3.190 ms, outputs [6291456; 131072; 131072]
    assert lstm.fwd_s == pytest.approx(3.190e-3)
    assert lstm.bwd_s == pytest.approx(5.348e-3)
    assert lstm.activation_bytes == (6291456.0, 131072.0, 131072.0)
    assert lstm.output_bytes == 6291456.0 + 2 * 131072.0
    assert lstm.param_bytes == 50364416.0


def test_vgg16_sums_match_the_file() -> None:
    g = LayerGraph.read(PROFILES / "vgg16" / "graph.txt")
    t = g.totals()
    # sums computed independently with awk over the file's forward/backward fields
    assert t["fwd_s"] == pytest.approx(0.251874)
    assert t["bwd_s"] == pytest.approx(0.438633)
    assert t["param_bytes"] == 553430176.0


def test_stage_ids_round_trip() -> None:
    text = (
        "node1 -- Input -- forward_compute_time=1.0, backward_compute_time=0.0, activation_size=8.0, "
        "parameter_size=0.0 -- stage_id=0\n"
        "node2 -- Linear -- forward_compute_time=2.0, backward_compute_time=3.0, activation_size=[1.0; 2.0], "
        "parameter_size=16.0 -- stage_id=1\n\tnode1 -- node2\n"
    )
    g = LayerGraph.parse(text)
    assert [n.stage_id for n in g.nodes.values()] == [0, 1]
    assert LayerGraph.parse(g.to_text()).nodes["node2"].activation_bytes == (1.0, 2.0)


@pytest.mark.parametrize(
    "text, message",
    [
        ("node1 -- Input -- forward_compute_time=x, backward_compute_time=0, activation_size=1, parameter_size=0\n",
         "<string>:1: a number"),
        ("node1 -- Input -- forward_compute_time=1, backward_compute_time=0, activation_size=1, parameter_size=0\n"
         "node2 -- ReLU -- forward_compute_time=1\n", "<string>:2: malformed node line"),
        ("node1 -- Input -- forward_compute_time=1, backward_compute_time=0, activation_size=1, parameter_size=0\n"
         "\tnode1 -- node9\n", "<string>:2: edge node1 -- node9 names unknown node 'node9'"),
        ("node1 -- A -- forward_compute_time=1, backward_compute_time=0, activation_size=1, parameter_size=0\n"
         "node2 -- B -- forward_compute_time=1, backward_compute_time=0, activation_size=1, parameter_size=0\n"
         "\tnode1 -- node2\n\tnode2 -- node1\n", "cycle"),
        ("node1 -- A -- forward_compute_time=-1, backward_compute_time=0, activation_size=1, parameter_size=0\n",
         "negative"),
        ("", "no nodes"),
    ],
)
def test_malformed_profiles_name_the_line(text: str, message: str) -> None:
    with pytest.raises(PipeDreamError, match=message.replace("(", r"\(").replace(")", r"\)")):
        LayerGraph.parse(text)
