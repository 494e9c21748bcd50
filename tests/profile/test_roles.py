"""Role expansion: the quickstart's process plan, and respec for restarts and mode switches."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from grpo_trainer.train.config import TrainerConfig
from grpo_tui.cli import app
from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import Plan, build_plan
from grpo_tui.supervisor.spec import Condition, HttpProbe, LogLineProbe

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "profiles/quickstart.toml"


def plan_for(path: Path, run_dir: Path, mode: str | None = None) -> Plan:
    return build_plan(load_profile(path, mode=mode), run_dir)


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_quickstart_expands_in_role_order(tmp_path: Path) -> None:
    plan = plan_for(QUICKSTART, tmp_path)
    specs = {s.name: s for s in plan.specs}
    assert [s.name for s in plan.specs] == ["model", "api", "inference", "trainer", "env"]
    assert plan.exit_with == "trainer"
    model = str(tmp_path / "model")
    assert specs["model"].command[-4:] == ["build", model, "--seed", "0"]
    assert specs["model"].restart.policy == "no"
    for name in ("inference", "trainer", "env"):
        assert specs[name].depends_on["model"].condition == Condition.COMPLETED
    assert specs["trainer"].depends_on["api"].condition == Condition.HEALTHY
    # The trainer loads its model while the (CPU) server starts; it waits for /health itself.
    assert specs["trainer"].depends_on["inference"].condition == Condition.STARTED
    assert specs["env"].depends_on["trainer"].condition == Condition.HEALTHY
    assert "model" not in specs["api"].depends_on
    # The built-in server, trainer and env import while the model builds (start gate).
    assert [s.name for s in plan.specs if s.prestart] == ["inference", "trainer", "env"]


def test_the_trainer_needs_the_api_inference_and_one_environment(tmp_path: Path) -> None:
    """What the run cannot go on without (the supervisor's ``needs``): every environment
    failing for good stops the run, not one of two."""
    profile = tmp_path / "two_envs.toml"
    profile.write_text(QUICKSTART.read_text() + '\n[[env]]\ntask = "toy"\ngroup_size = 8\n')
    specs = {s.name: s for s in plan_for(profile, tmp_path / "run").specs}
    needs = [(need.any_of, need.at_least) for need in specs["trainer"].needs]
    assert needs == [(["api"], 1), (["inference"], 1), (["env-0", "env-1"], 1)]
    assert all(not specs[name].needs for name in ("api", "inference", "env-0", "env-1"))


def test_quickstart_probes_restarts_and_wiring(tmp_path: Path) -> None:
    specs = {s.name: s for s in plan_for(QUICKSTART, tmp_path).specs}
    api, inference, trainer, env = (specs[n] for n in ("api", "inference", "trainer", "env"))
    assert isinstance(api.readiness, HttpProbe)
    assert api.readiness.url == "http://127.0.0.1:8000/health"
    assert flag(api.command, "--db") == str(tmp_path / "rollouts.db")
    assert isinstance(inference.readiness, HttpProbe)
    assert inference.port == 9001
    assert inference.metrics_url == "http://127.0.0.1:9001/metrics"
    # Servers never end on their own: any exit, even 0 (vLLM's API server exits 0 when its
    # engine core dies), is restarted.
    assert inference.restart.policy == "always"
    assert api.restart.policy == "always"
    assert isinstance(trainer.readiness, LogLineProbe)
    assert trainer.readiness.pattern == "grpo-trainer ready"
    assert trainer.restart.policy == "on_failure"
    assert trainer.shutdown.timeout >= 120
    assert flag(trainer.command, "--resume") == "auto"
    assert flag(trainer.command, "--save-path") == str(tmp_path / "checkpoints")
    assert flag(trainer.command, "--model-name") == str(tmp_path / "model")
    assert flag(trainer.command, "--group-size") == "8"
    assert isinstance(env.readiness, LogLineProbe)
    assert env.readiness.pattern == "grpo-env registered"
    assert flag(env.command, "--tokenizer") == str(tmp_path / "model")
    assert flag(env.command, "--model-name") == "policy"
    assert flag(env.command, "--api-url") == "http://127.0.0.1:8000"


def test_mode_override_reaches_inference_and_trainer(tmp_path: Path) -> None:
    specs = {s.name: s for s in plan_for(QUICKSTART, tmp_path, mode="lora_only").specs}
    assert "--enable-lora" in specs["inference"].command
    assert flag(specs["trainer"].command, "--weight-bridge-mode") == "lora_only"


def test_builtin_shared_mode_gets_a_shared_weights_dir(tmp_path: Path) -> None:
    specs = {s.name: s for s in plan_for(QUICKSTART, tmp_path, mode="shared_vllm").specs}
    assert flag(specs["inference"].command, "--shared-weights") == str(tmp_path / "shared_weights")


def test_hub_model_needs_no_build_step(tmp_path: Path) -> None:
    plan = plan_for(REPO / "profiles/gsm8k-qwen2.5-3b-lora.toml", tmp_path)
    specs = {s.name: s for s in plan.specs}
    assert "model" not in specs
    assert specs["inference"].command[:3] == ["vllm", "serve", "Qwen/Qwen2.5-3B-Instruct"]
    assert specs["inference"].env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    assert not specs["inference"].prestart  # vLLM does not read a start gate


def test_api_token_reaches_trainer_and_env(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        textwrap.dedent(
            """
            [run]
            model = "some/model"
            [api]
            host = "0.0.0.0"
            token = "s3cret"
            [inference]
            [trainer]
            batch_size = 8
            [[env]]
            """
        )
    )
    specs = {s.name: s for s in plan_for(path, tmp_path / "run").specs}
    assert specs["trainer"].env["GRPO_API_TOKEN"] == "s3cret"
    assert "s3cret" not in specs["trainer"].command
    assert specs["env"].env == {"GRPO_API_TOKEN": "s3cret"}
    assert specs["api"].env == {"GRPO_API_TOKEN": "s3cret"}
    assert "s3cret" not in specs["api"].command + specs["env"].command
    shown = CliRunner().invoke(app, ["check", str(path)])
    assert shown.exit_code == 0, shown.output
    assert "s3cret" not in shown.output
    assert "--api-token" not in shown.output


def write_checkpoint(root: Path, name: str, **state: object) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps(state))
    return path


def test_restart_with_model_then_mode_switch_uses_checkpoints(tmp_path: Path) -> None:
    plan = plan_for(QUICKSTART, tmp_path)
    step_20 = write_checkpoint(tmp_path / "checkpoints", "step_20", kind="full")
    spec = plan.respec("inference", {"model": str(step_20)})
    assert spec.command[3] == str(step_20)

    adapter = write_checkpoint(tmp_path / "checkpoints", "adapter_step_30", base=str(step_20))
    inference = plan.respec("inference", {"mode": "lora_restart"})
    trainer = plan.respec("trainer", {"mode": "lora_restart"})
    assert inference.command[3] == str(step_20)
    assert flag(inference.command, "--lora-modules") == f"policy={adapter}"
    assert flag(trainer.command, "--weight-bridge-mode") == "lora_restart"
    assert flag(trainer.command, "--resume") == "auto"

    back = plan.respec("inference", {"mode": "none"})
    assert back.command[3] == str(step_20)
    assert "--lora-modules" not in back.command


def test_restart_without_args_serves_the_newest_checkpoint(tmp_path: Path) -> None:
    plan = plan_for(QUICKSTART, tmp_path)
    assert plan.respec("inference", {}).command[3] == str(tmp_path / "model")
    step_5 = write_checkpoint(tmp_path / "checkpoints", "step_5", kind="full")
    assert plan.respec("inference", {}).command[3] == str(step_5)


def test_respec_trainer_setting_is_kept_and_bad_ones_change_nothing(tmp_path: Path) -> None:
    plan = plan_for(QUICKSTART, tmp_path)
    assert flag(plan.respec("trainer", {"lr": 0.01}).command, "--lr") == "0.01"
    with pytest.raises(ValueError, match="unknown trainer argument"):
        plan.respec("trainer", {"lrr": 1})
    with pytest.raises(ValidationError):
        plan.respec("trainer", {"lr": -1})
    with pytest.raises(ValueError, match="unknown trainer argument"):
        plan.respec("trainer", {"save_path": "/elsewhere"})
    assert flag(plan.respec("trainer", {}).command, "--lr") == "0.01"


def test_respec_generic_process(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[run]\nexit_with = "a"\n[process.a]\ncommand = ["python", "-c", "print(1)"]\n')
    plan = plan_for(path, tmp_path / "run")
    assert plan.respec("a", {}).command == ["python", "-c", "print(1)"]
    assert plan.respec("a", {"env": {"X": "1"}}).env == {"X": "1"}
    with pytest.raises(ValueError, match="no process named"):
        plan.respec("ghost", {})


def test_adapter_restart_serves_the_adapter_on_its_own_base(tmp_path: Path) -> None:
    plan = plan_for(QUICKSTART, tmp_path, mode="lora_restart")
    ckpt = tmp_path / "checkpoints"
    base = write_checkpoint(ckpt, "step_20", kind="merged")
    recorded = write_checkpoint(ckpt, "adapter_step_25", base=str(base))
    spec = plan.respec("inference", {"lora_path": str(recorded)})
    assert spec.command[3] == str(base)
    assert flag(spec.command, "--lora-modules") == f"policy={recorded}"

    served = tmp_path / "served" / "adapter_step_26"  # a PEFT dir without our state file
    served.mkdir(parents=True)
    (served / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "b"}))
    assert plan.respec("inference", {"lora_path": str(served)}).command[3] == "b"


def test_bad_respec_changes_nothing(tmp_path: Path) -> None:
    plan = plan_for(QUICKSTART, tmp_path)
    before = plan.respec("inference", {}).command
    mode = plan.roles.mode
    with pytest.raises(ValueError, match="unknown mode"):
        plan.respec("inference", {"mode": "turbo"})
    with pytest.raises(ValueError, match="only served in LoRA modes"):
        plan.respec("inference", {"lora_path": str(tmp_path / "x")})
    with pytest.raises(ValidationError):
        plan.respec("inference", {"port": "many"})
    assert plan.respec("inference", {}).command == before
    assert plan.roles.mode == mode


def test_generic_respec_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[run]\nexit_with = "a"\n[process.a]\ncommand = ["true"]\n')
    plan = plan_for(path, tmp_path / "run")
    plan.respec("a", {"command": ["false"]})
    assert plan.respec("a", {}).command == ["false"]


def test_process_table_adjusts_a_role_process(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        textwrap.dedent(
            """
            [api]
            [inference]
            [trainer]
            batch_size = 8
            [[env]]
            group_size = 8

            [process.reward]
            command = ["python", "-c", "print(1)"]

            [process.trainer]
            env = { PYTORCH_CUDA_ALLOC_CONF = "expandable_segments:True" }
            restart = { policy = "on_failure", max_restarts = 9 }
            shutdown = { timeout = 300 }

            [process.inference]
            depends_on = ["reward"]
            """
        )
    )
    plan = plan_for(path, tmp_path / "run")
    specs = {s.name: s for s in plan.specs}
    trainer = specs["trainer"]
    assert trainer.env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert trainer.restart.max_restarts == 9
    assert trainer.shutdown.timeout == 300
    assert flag(trainer.command, "--resume") == "auto"
    assert set(specs["inference"].depends_on) == {"model", "reward"}
    assert [s.name for s in plan.specs].index("reward") < [s.name for s in plan.specs].index(
        "inference"
    )
    assert plan.respec("trainer", {"mode": "lora_only"}).restart.max_restarts == 9


def test_restart_modes_sync_every_few_steps_unless_the_profile_says(tmp_path: Path) -> None:
    """``none`` reloads in place (every step) unless ``none_reload`` asks for restarts."""
    restarting = tmp_path / "restarting.toml"
    restarting.write_text(
        QUICKSTART.read_text().replace(
            'dtype = "float32"', 'dtype = "float32"\nnone_reload = "restart"'
        )
    )
    cases = [(QUICKSTART, "none", 1), (restarting, "none", 4), (QUICKSTART, "lora_restart", 4),
             (QUICKSTART, "shared_vllm", 1)]  # fmt: skip
    for profile, mode, expected in cases:
        plan = plan_for(profile, tmp_path / f"{mode}-{expected}", mode=mode)
        trainer = {s.name: s for s in plan.specs}["trainer"]
        config = TrainerConfig.from_argv(trainer.command[3:])
        assert config.weight_bridge_mode == mode
        assert config.sync_every == expected


def test_colocate_syncs_every_step_and_never_trains_stale_whatever_the_profile(
    tmp_path: Path,
) -> None:
    profile = tmp_path / "p.toml"
    text = QUICKSTART.read_text().replace(
        'device = "cpu"\n\n[[env]]', 'device = "cpu"\nsync_every = 3\nmax_sync_lag = 4\n\n[[env]]'
    )
    profile.write_text(text)
    plan = plan_for(profile, tmp_path / "run", mode="colocate")
    specs = {s.name: s for s in plan.specs}
    config = TrainerConfig.from_argv(specs["trainer"].command[3:])
    assert (config.weight_bridge_mode, config.sync_every, config.max_sync_lag) == ("colocate", 1, 0)
    assert "--enable-sleep-mode" in specs["inference"].command
    assert "--shared-weights" in specs["inference"].command
    # the same profile's own cadence holds in the other modes
    other = TrainerConfig.from_argv(plan.respec("trainer", {"mode": "lora_only"}).command[3:])
    assert (other.sync_every, other.max_sync_lag) == (3, 4)


def test_colocate_needs_the_trainer_and_inference_on_one_and_the_same_gpu(
    tmp_path: Path,
) -> None:
    text = (
        (REPO / "profiles/gsm8k-qwen2.5-3b-shared.toml")
        .read_text()
        .replace('mode = "shared_vllm"', 'mode = "colocate"')
        .replace('weight_transfer = "cuda_ipc"', "")
    )
    for name, trainer, served, key in [
        ("other", "[1]", "[0]", "inference.gpus"),
        ("two", "[0, 1]", "[0, 1]", "inference.data_parallel_size"),
        ("split", "[0, 1]", "[0, 1]\ntensor_parallel_size = 2", "tensor_parallel_size = 1"),
    ]:
        path = tmp_path / f"{name}.toml"
        path.write_text(
            text.replace("gpus = [0]                       #", f"gpus = {served}  #").replace(
                "[trainer]\ngpus = [0]", f"[trainer]\ngpus = {trainer}"
            )
        )
        result = CliRunner().invoke(app, ["check", str(path), "--profile-only"])
        assert result.exit_code == 2, result.output
        output = " ".join(result.output.split())
        assert key in output and "colocate" in output, output
    (tmp_path / "one.toml").write_text(text)
    assert (
        CliRunner().invoke(app, ["check", str(tmp_path / "one.toml"), "--profile-only"]).exit_code
        == 0
    )
    # N GPUs: N ranks and N vLLM replicas (tensor parallel 1), one per GPU
    replicas = text.replace("gpus = [0]                       #", "gpus = [0, 1]  #")
    replicas = replicas.replace("[trainer]\ngpus = [0]", "[trainer]\ngpus = [0, 1]")
    (tmp_path / "n.toml").write_text(
        replicas.replace("[inference]", "[inference]\ndata_parallel_size = 2")
    )
    result = CliRunner().invoke(app, ["check", str(tmp_path / "n.toml"), "--profile-only"])
    assert result.exit_code == 0, result.output
