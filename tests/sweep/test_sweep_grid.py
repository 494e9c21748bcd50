"""Sweep cells from --set options, their checks, and the ports and GPUs given to cells."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from grpo_tui.plan.profile import ProfileError, load_profile
from grpo_tui.sweep.grid import apply_overrides, check_cells, expand, parse_set
from grpo_tui.sweep.resources import (
    Resources,
    gpus_needed,
    leased_profile,
    parallel_limit,
    port_keys,
)

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "profiles" / "quickstart.toml"


def test_values_are_toml_or_bare_words_and_commas_inside_lists_do_not_split() -> None:
    axis = parse_set('trainer.lr=1e-4, 3e-4,0,true,none,[1,2],"a,b"')
    assert axis.values == (1e-4, 3e-4, 0, True, "none", [1, 2], "a,b")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_set("trainer.lr")
    with pytest.raises(ValueError, match="empty value"):
        parse_set("trainer.lr=1,,2")
    with pytest.raises(ValueError, match="not a key name"):
        parse_set("trainer..lr=1")


def test_grid_is_the_product_and_zip_pairs_values() -> None:
    lr, beta = parse_set("trainer.lr=1e-4,1e-3,3e-3"), parse_set("trainer.beta=0,0.04")
    grid = expand([lr, beta], zipped=False)
    assert [c.id for c in grid] == [
        "0-lr1e-4-beta0",
        "1-lr1e-4-beta0.04",
        "2-lr1e-3-beta0",
        "3-lr1e-3-beta0.04",
        "4-lr3e-3-beta0",
        "5-lr3e-3-beta0.04",
    ]
    assert grid[3].overrides == {"trainer.lr": 1e-3, "trainer.beta": 0.04}
    zipped = expand([lr, parse_set("trainer.beta=0,0.04,0.1")], zipped=True)
    assert [c.overrides["trainer.beta"] for c in zipped] == [0, 0.04, 0.1]
    with pytest.raises(ValueError, match="--zip needs as many values"):
        expand([lr, beta], zipped=True)
    with pytest.raises(ValueError, match="names a key twice"):
        expand([lr, lr], zipped=False)


def test_overrides_make_tables_and_env_dot_key_sets_every_env() -> None:
    data = {"trainer": {"lr": 1.0}, "env": [{"task": "toy"}, {"task": "gsm8k"}]}
    out = apply_overrides(data, {"trainer.lr": 2.0, "env.group_size": 4, "api.port": 8100})
    assert out == {
        "trainer": {"lr": 2.0},
        "env": [{"task": "toy", "group_size": 4}, {"task": "gsm8k", "group_size": 4}],
        "api": {"port": 8100},
    }
    assert data["trainer"]["lr"] == 1.0  # the base profile's tables are not touched
    assert apply_overrides(data, {"env[1].group_size": 2})["env"][0] == {"task": "toy"}
    with pytest.raises(ValueError, match=r"no \[5\]"):
        apply_overrides(data, {"env[5].group_size": 2})


def test_a_bad_key_or_value_is_reported_against_its_set_option() -> None:
    profile = load_profile(QUICKSTART)
    cells = expand(
        [parse_set("trainer.lrr=1e-4,1e-3"), parse_set("trainer.beta=0,-1")], zipped=False
    )
    with pytest.raises(ProfileError) as caught:
        check_cells(profile, cells)
    lines = sorted(str(p) for p in caught.value.problems)
    assert lines[0].startswith("--set trainer.beta=-1: trainer.beta: ")
    assert lines[1] == "--set trainer.lrr=0.0001: trainer.lrr: unknown key (did you mean 'lr'?)"
    assert len(lines) == 2  # one line per problem, not one per cell
    check_cells(profile, expand([parse_set("trainer.lr=1e-4,1e-3")], zipped=False))


def test_ports_skip_those_held_by_running_cells_and_by_other_processes() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        data = {"api": {"port": taken}, "inference": {}, "process": {"x": {"port": taken + 1}}}
        pool = Resources()
        first, second = pool.lease(data, 0), pool.lease(data, 0)
    assert first.ports["api.port"] != taken
    assert first.ports["inference.port"] >= 9001
    ports = [*first.ports.values(), *second.ports.values()]
    assert len(set(ports)) == len(ports)  # no two cells, no two keys on one port
    pool.release(first)
    assert not pool.held_ports & set(first.ports.values())
    assert leased_profile(data, second)["process"]["x"]["port"] == second.ports["process.x.port"]


def test_gpus_are_counted_from_the_profile_and_mapped_onto_the_lease() -> None:
    data = {
        "inference": {"backend": "vllm", "gpus": [5]},
        "trainer": {"gpus": [2, 3]},
    }
    assert gpus_needed(data) == 3
    assert gpus_needed({"trainer": {"device": "cpu"}, "inference": {"device": "cpu"}}) == 0
    assert gpus_needed({"trainer": {"device": "cuda:1"}, "inference": {"device": "cuda"}}) == 2
    pool = Resources(gpus=["4", "5", "6", "7"])
    lease = pool.lease({}, 3)
    assert lease.gpus == ["4", "5", "6"]
    assert pool.can_lease(1) and not pool.can_lease(2)
    leased = leased_profile(data, lease)
    assert leased["trainer"]["gpus"] == [4, 5] and leased["inference"]["gpus"] == [6]
    cuda = {"trainer": {"device": "cuda:3"}, "inference": {"device": "cuda:1"}}
    devices = leased_profile(cuda, lease)
    assert devices["trainer"]["device"] == "cuda:1" and devices["inference"]["device"] == "cuda:0"
    assert parallel_limit(4, 2, ["4", "5", "6", "7"]) == 2
    assert parallel_limit(4, 0, []) == 4


def test_cli_names_the_bad_key_and_starts_nothing(tmp_path: Path) -> None:
    import subprocess

    out = subprocess.run(
        [
            *(sys.executable, "-m", "grpo_tui", "sweep", str(QUICKSTART), "--headless"),
            *("--set", "trainer.lr=1e-4,3e-4", "--set", "trainer.betta=0,0.04"),
            *("--dir", str(tmp_path / "sweep")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 2
    assert "--set trainer.betta=0: trainer.betta: unknown key (did you mean 'beta'?)" in out.stderr
    assert not (tmp_path / "sweep").exists()


def test_slurm_cells_lease_their_cluster_ports_too() -> None:
    data = {"cluster": {"engine": "slurm", "control_port": 29501}, "api": {"port": 8100}}
    assert port_keys(data) == {
        "api.port": 8100,
        "cluster.control_port": 29501,
        "cluster.rdzv_port": 29400,
    }
    assert "cluster.control_port" not in port_keys({"cluster": {"control_port": 29501}})
    pool = Resources()
    first, second = pool.lease(data, 0), pool.lease(data, 0)
    assert not set(first.ports.values()) & set(second.ports.values())


def test_sbatch_options_on_a_local_profile_are_refused(tmp_path: Path) -> None:
    import subprocess

    out = subprocess.run(
        [
            *(sys.executable, "-m", "grpo_tui", "sweep", str(QUICKSTART), "--headless"),
            *("--set", "trainer.lr=1e-4,3e-4", "--dir", str(tmp_path / "sweep")),
            *("--", "--time=10"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 2
    assert 'sbatch options (--time=10) need engine = "slurm"' in out.stderr
    assert "cluster.engine" in out.stderr
    assert not (tmp_path / "sweep").exists()
