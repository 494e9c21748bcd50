"""The stack on a real two-node Slurm cluster (``slurm_cluster``): every role a job step.

- ``grpo-tui sbatch`` of the quickstart (``lora_only``: inference and trainer on different
  nodes share no memory) with the API and inference on node 1, trainer and environment on
  node 2: the job runs ``grpo-tui run`` on node 1, each role is an ``srun`` step on its
  node, the reward rises as in the one-machine test (``test_e2e_modes``, same steps, same
  margin), ``grpo-tui attach --status`` answers while it runs, and no step outlives it.
- Inside an allocation: a restart asked on the control socket is a new step (new id);
  SIGKILL of the supervisor then leaves no step of the run on any node and no process of
  it on this host.
- A node marked down mid-run ends the run at once with Slurm's reason, the last
  checkpoint kept.
- The watchdog alone ``scancel``s the steps it was told of, by id, and no other step.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import tomli_w
from e2e_stack import REPO, free_port, mean, quickstart_copy, trainer_steps, wait_until
from slurm_cluster import SlurmCluster, start_cluster, stop_cluster

from grpo_trainer.control import SupervisorLink

STEPS = 30
WINDOW = 5
MARGIN = 0.03
"""As in test_e2e_modes (lora_only measured 0.32-0.34 at step 30 on one machine)."""

PLACES = {"api": "n1", "inference": "n1", "trainer": "n2", "env": "n2"}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    yield cluster
    stop_cluster(cluster)


def cluster_profile(tmp_path: Path, steps: int, output_dir: Path | None = None) -> Path:
    path = quickstart_copy(
        tmp_path,
        mode="lora_only",
        overrides={"trainer": {"training_steps": steps, "checkpoint_interval": 10}},
    )
    profile = tomllib.loads(path.read_text())
    profile["cluster"] = {"engine": "slurm", "nodes": 2, "control_port": free_port()}
    if output_dir is not None:
        profile["run"]["output_dir"] = str(output_dir)
    for role, node in PLACES.items():
        tables = profile[role] if role == "env" else [profile[role]]
        for table in tables:
            table["node"] = int(node[1:])
    path.write_text(tomli_w.dumps(profile))
    return path


def grpo_tui(
    *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "grpo_tui", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def of_run(run_dir: Path) -> list[psutil.Process]:
    """Live processes on this host whose command line names the run directory."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(str(run_dir) in part for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """An output directory whose control-socket path fits the Unix limit (108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="grpo-slurm-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_sbatch_two_nodes_learns_attach_answers_nothing_left(
    slurm: SlurmCluster, tmp_path: Path, short_dir: Path
) -> None:
    profile = cluster_profile(tmp_path, STEPS, short_dir)
    submitted = grpo_tui("sbatch", str(profile), "--time=15", env=slurm.env)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.split()[2].rstrip(":")
    run_dir = Path(submitted.stdout.split("run dir")[1].split()[0])
    script = run_dir.with_name(run_dir.name + ".sbatch")
    assert "#SBATCH --nodes=2" in script.read_text()

    seen: dict[str, str] = {}
    status = ""
    while slurm.job_alive(job):
        seen.update(slurm.steps(job))
        if not status and (run_dir / "allocation.json").exists() and len(seen) >= 4:
            attached = grpo_tui("attach", str(run_dir), "--status", env=slurm.env)
            assert attached.returncode == 0, attached.stderr
            hopped = grpo_tui("attach", str(run_dir), "--status", "--via-slurm", env=slurm.env)
            assert hopped.returncode == 0, hopped.stderr
            status = attached.stdout + hopped.stdout
        time.sleep(0.5)  # observing placement while the job runs, not waiting for readiness
    out = run_dir.with_name(run_dir.name + ".out").read_text()
    assert "run finished: trainer completed successfully (exit 0)" in out, out[-4000:]

    prefix = f"grpo.{run_dir.name}."
    assert {name.removeprefix(prefix): nodes for name, nodes in seen.items()} == PLACES
    assert status.count("trainer") == 2 and "ready" in status, status
    assert slurm.steps(job) == {} and of_run(run_dir) == []

    # the steps' metrics reached the supervisor over the control socket's TCP side (the
    # steps' only way to it, as on a real cluster), and no peer was refused
    assert "refused a TCP peer" not in (run_dir / "events.jsonl").read_text()
    curve = [(step, data["reward/mean"]) for step, data in trainer_steps(run_dir)]
    assert [step for step, _ in curve] == list(range(1, STEPS + 1))
    first = mean([reward for _, reward in curve[:WINDOW]])
    last = mean([reward for _, reward in curve[-WINDOW:]])
    print(f"two nodes, lora_only: reward first {WINDOW} {first:.3f}, last {WINDOW} {last:.3f}")
    assert first < 0.2
    assert last > first + MARGIN, f"no clear rise: {first:.3f} -> {last:.3f}"
    assert (run_dir / "checkpoints" / f"adapter_step_{STEPS}").is_dir()


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_sigkill_of_the_supervisor_leaves_no_step_on_any_node(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    profile = cluster_profile(tmp_path, 200)
    run_dir = tmp_path / "runs" / "killed"
    with slurm.allocation(2) as env:
        job = env["SLURM_JOB_ID"]
        with (tmp_path / "console.log").open("ab") as console:
            supervisor = subprocess.Popen(
                [sys.executable, "-m", "grpo_tui", "run", str(profile), "--run-dir", str(run_dir)],
                env=env,
                cwd=REPO,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:

            def all_steps() -> dict[str, str] | None:
                assert supervisor.poll() is None, (tmp_path / "console.log").read_text()
                steps = slurm.steps(job)
                return steps if len(steps) == 4 else None

            steps = wait_until(all_steps, 180, "the four role steps")
            assert set(steps.values()) == {"n1", "n2"}
            assert of_run(run_dir)
            # a restart (asked on the control socket, as the trainer would) is a new step
            env_step = f"grpo.{run_dir.name}.env"
            before = slurm.step_ids(job)[env_step]
            link = SupervisorLink(str(run_dir / "control.sock"), process="test")
            try:
                assert link.request("restart", process="env", timeout=120)["state"] == "ready"
            finally:
                link.close()
            after = slurm.step_ids(job)
            assert after[env_step] != before and before not in after.values()
            os.kill(supervisor.pid, signal.SIGKILL)
            supervisor.wait(10)
            wait_until(lambda: slurm.steps(job) == {}, 60, "every step of the run to end")
            wait_until(lambda: of_run(run_dir) == [], 30, "every process of the run to end")
            assert slurm.job_alive(job), "only our steps end, not the allocation"
        finally:
            if supervisor.poll() is None:
                os.killpg(supervisor.pid, signal.SIGKILL)


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_watchdog_cancels_the_steps_it_was_told_of_and_no_other(slurm: SlurmCluster) -> None:
    with slurm.allocation(2) as env:
        job = env["SLURM_JOB_ID"]
        # env -i: the task carries no run tag, so only Slurm can end it
        steps = {
            name: subprocess.Popen(
                [
                    "srun",
                    f"--job-name={name}",
                    "-N1",
                    "-n1",
                    f"--relative={i}",
                    "--overlap",
                    "env",
                    "-i",
                    "sleep",
                    "300",
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            for i, name in enumerate(("ours", "theirs"))
        }
        try:
            wait_until(lambda: len(slurm.steps(job)) == 2, 60, "both steps")
            read_end, write_end = os.pipe()
            watchdog = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "grpo_tui.supervisor.watchdog",
                    "--fd",
                    str(read_end),
                    "--run-id",
                    "no-such-run",
                ],
                env=env,
                pass_fds=(read_end,),
            )
            os.close(read_end)
            os.write(write_end, b"step ours\n")
            os.close(write_end)  # as if the supervisor died
            assert watchdog.wait(60) == 0
            assert slurm.steps(job) == {"theirs": slurm.steps(job)["theirs"]}
            assert steps["ours"].wait(30) != 0
            assert steps["theirs"].poll() is None
        finally:
            for srun in steps.values():
                if srun.poll() is None:
                    os.killpg(srun.pid, signal.SIGKILL)


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_losing_a_node_ends_the_run_with_the_reason_and_a_checkpoint(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    profile = cluster_profile(tmp_path, 200)
    data = tomllib.loads(profile.read_text())
    data["trainer"]["checkpoint_interval"] = 2
    profile.write_text(tomli_w.dumps(data))
    run_dir = tmp_path / "runs" / "lost"
    console = tmp_path / "console.log"
    with slurm.allocation(2) as env:
        job = env["SLURM_JOB_ID"]
        with console.open("ab") as out:
            supervisor = subprocess.Popen(
                [sys.executable, "-m", "grpo_tui", "run", str(profile), "--run-dir", str(run_dir)],
                env=env,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            checkpoint = run_dir / "checkpoints" / "adapter_step_2"
            wait_until(checkpoint.is_dir, 240, "the step-2 checkpoint")
            down = slurm.run("scontrol", "update", "nodename=n2", "state=down", "reason=test-lost")
            assert down.returncode == 0, down.stderr
            assert supervisor.wait(180) == 1
            text = console.read_text()
            # the first of the run's processes on n2 to be seen failing names the node's loss
            # (the trainer, or the API the trainer needs: "trainer cannot go on without api")
            failed = r"run failed: (trainer failed|trainer cannot go on without)"
            assert re.search(failed, text), text[-3000:]
            state = r"(NODE_FAIL|COMPLETING) \(NodeDown\)"
            lost = rf"(node n2 of job {job} is down|Slurm job {job} is {state})"
            assert re.search(lost + ".*: not restarted", text), text[-3000:]
            wait_until(lambda: slurm.steps(job) == {}, 60, "every step of the run to end")
            assert of_run(run_dir) == []
            assert checkpoint.is_dir(), "the last checkpoint is there to resume from"
        finally:
            if supervisor.poll() is None:
                os.killpg(supervisor.pid, signal.SIGKILL)
            slurm.run("scontrol", "update", "nodename=n2", "state=resume")
