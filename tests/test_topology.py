"""Tests for pipedream.topology: the clusters file, what-if strings, and bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipedream.errors import PipeDreamError
from pipedream.topology import Cluster, get_cluster, load_clusters, parse_whatif

REPO = Path(__file__).resolve().parent.parent
CLUSTERS = REPO / "experiments" / "clusters.yaml"


def test_paper_clusters_have_the_papers_shapes_and_bandwidths() -> None:
    clusters = load_clusters(CLUSTERS)
    a, b, c = clusters["A_4x4"], clusters["B_2x8"], clusters["C_4x1"]
    assert a.levels == [(4, 15.75e9), (4, 1.25e9)] and a.workers == 16 and a.shape == "4x4"
    assert a.device_memory_bytes == 16e9
    assert b.levels == [(8, 25e9), (2, 3.125e9)] and b.workers == 16 and b.shape == "2x8"
    assert c.levels == [(4, 5e9)] and c.device_memory_bytes == 12e9
    assert clusters["A_1x4"].workers == 4 and clusters["A_3x4"].workers == 12
    assert clusters["A_flat16"].levels == [(16, 1.25e9)]
    assert clusters["B_flat16"].levels == [(16, 3.125e9)]
    cpu4 = clusters["cpu4"]
    assert cpu4.levels == [(4, 1e9)] and cpu4.device_memory_bytes == 8 * 2**30


def test_get_cluster_unknown_name_lists_known_ones() -> None:
    with pytest.raises(PipeDreamError, match=r"unknown cluster 'Z'.*A_4x4.*cpu4"):
        get_cluster("Z", CLUSTERS)


def test_whatif_string_innermost_first() -> None:
    c = get_cluster("8x2:25e9,3.125e9", CLUSTERS)
    assert c.levels == [(8, 25e9), (2, 3.125e9)] and c.workers == 16
    c = parse_whatif("4:1e9@8e9")
    assert c.levels == [(4, 1e9)] and c.device_memory_bytes == 8e9


@pytest.mark.parametrize(
    "spec, match",
    [
        ("8x8:12.5e9", "2 level"),
        ("8x8:-1e9,1e9", "bandwidth_Bps=-1000000000.0"),
        ("4:abc", "not a number"),
        ("4x:1e9", "malformed"),
    ],
)
def test_whatif_errors_name_the_value(spec: str, match: str) -> None:
    with pytest.raises(PipeDreamError, match=match):
        parse_whatif(spec)


def test_negative_bandwidth_in_file_is_named(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("clusters:\n  bad:\n    levels:\n      - {workers: 4, bandwidth_Bps: -5e+9}\n")
    with pytest.raises(PipeDreamError, match=r"cluster 'bad' level 0: bandwidth_Bps=-5000000000.0"):
        load_clusters(f)


def test_yaml_exponent_without_sign_is_read_as_a_number(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("clusters:\n  x:\n    levels:\n      - {workers: 2, bandwidth_Bps: 15.75e9}\n    device_memory_bytes: 8e9\n")
    assert load_clusters(f)["x"].levels == [(2, 15.75e9)]


@pytest.mark.parametrize(
    "levels, memory, match",
    [([], 1e9, "no levels"), ([(0, 1e9)], 1e9, "workers=0"), ([(2, 1e9)], -1.0, "device_memory_bytes=-1.0")],
)
def test_bad_cluster_values(levels: list[tuple[int, float]], memory: float, match: str) -> None:
    with pytest.raises(PipeDreamError, match=match):
        Cluster("bad", levels, memory)


def test_missing_file_and_bad_keys(tmp_path: Path) -> None:
    with pytest.raises(PipeDreamError, match="not found"):
        load_clusters(tmp_path / "none.yaml")
    f = tmp_path / "c.yaml"
    f.write_text("clusters:\n  x:\n    levels:\n      - {workers: 2}\n")
    with pytest.raises(PipeDreamError, match="level 0: expected exactly the keys"):
        load_clusters(f)


def test_latency_is_an_optional_key_with_the_cost_models_default(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("clusters:\n  slow:\n    levels:\n      - {workers: 2, bandwidth_Bps: 1e9}\n    latency_s: 5e-5\n"
                 "  plain:\n    levels:\n      - {workers: 2, bandwidth_Bps: 1e9}\n")
    clusters = load_clusters(f)
    assert clusters["slow"].latency_s == 5e-5
    assert clusters["plain"].latency_s == 20e-6  # costmodel.DEFAULT_STEP_LATENCY_S: one TCP round trip in a DC
    assert parse_whatif("4:1e9").latency_s == 20e-6
    assert "latency 50 us" in clusters["slow"].describe()
    with pytest.raises(PipeDreamError, match=r"latency_s=-1.0 must be a non-negative"):
        Cluster("bad", [(2, 1e9)], latency_s=-1.0)
    f.write_text("clusters:\n  x:\n    levels:\n      - {workers: 2, bandwidth_Bps: 1e9}\n    latency: 1e-5\n")
    with pytest.raises(PipeDreamError, match=r"unknown key\(s\) \['latency'\]; allowed: .*latency_s"):
        load_clusters(f)
