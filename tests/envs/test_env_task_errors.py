"""A task whose code raises is seen (issue 35, item 4): an environment counts its task's
failures, reports the first traceback and the running count as events and its error rate
as a metric, and after ``max_consecutive_errors`` failures in a row exits non-zero, so the
restart policy applies; when the policy gives up, the run stops with the exception.

Was: a task that raised in ``sample()`` passed ``check`` and ``run`` hung, the env
``ready`` and logging thousands of tracebacks, the trainer waiting for a batch forever."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w
from env_procs import Trainer, api_argv, env_argv, free_port, last_env_metrics

from grpo_trainer.envs.base import Connection, EnvRunner
from grpo_trainer.envs.settings import EnvSettings
from grpo_trainer.envs.stats import Reporter
from grpo_trainer.envs.task import Prompt
from grpo_trainer.envs.tokenizer import FastTokenizer
from grpo_trainer.envs.toy import RepeatDigit

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "profiles" / "quickstart.toml"
TASKS = """
import random

from grpo_trainer.envs.task import Prompt, Task


class SampleRaises(Task):
    def sample(self, rng: random.Random) -> Prompt:
        raise ValueError("sample bug on purpose")

    def score(self, prompt: Prompt, completion: str) -> float:
        return 0.0
"""


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    """A directory holding the module ``broken_tasks`` (for PYTHONPATH)."""
    (tmp_path / "broken_tasks.py").write_text(TASKS)
    return tmp_path


@pytest.fixture
def control_socket(tmp_path: Path) -> Iterator[tuple[Path, list[dict]]]:
    """A Unix socket standing in for the supervisor's; collects every record received."""
    path = tmp_path / "control.sock"
    records: list[dict] = []
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()

    def serve() -> None:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn, conn.makefile("r") as lines:
            records.extend(json.loads(line) for line in lines)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path, records
    server.close()
    thread.join(timeout=10)


def test_a_task_that_always_raises_exits_non_zero_naming_its_exception(
    spawn, tmp_path, tiny_model, inference, tasks, control_socket
) -> None:
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    spawn("api", api_argv(port, tmp_path / "rollouts.db")).wait_http(f"{api}/health")
    trainer = Trainer(api, batch_size=4)
    trainer.register()
    env = spawn(
        "env",
        env_argv("grpo_trainer.envs", api, inference, tiny_model,
                 "--task", "broken_tasks:SampleRaises", "--group-size", "4",
                 "--max-concurrency", "2", "--max-consecutive-errors", "5"),
        env={"PYTHONPATH": f"{tasks}:{REPO}", "GRPO_TUI_SOCKET": str(control_socket[0]),
             "GRPO_TUI_PROCESS": "env"},
    )  # fmt: skip
    assert env.wait(timeout=60) == 1, env.text()[-3000:]
    trainer.close()
    output = env.text()
    last = output.strip().splitlines()[-1]
    assert last == (
        "error: the task failed 5 times in a row (max_consecutive_errors 5): "
        "ValueError: sample bug on purpose (in sample())"
    ), last
    assert output.count("Traceback (most recent call last)") == 1, "the first one, not each"
    metrics = last_env_metrics(output)
    assert metrics["env/task_errors"] == 5 and metrics["env/error_rate"] == 1.0
    assert metrics["env/consecutive_task_errors"] == 5
    _, records = control_socket
    events = [r for r in records if r["type"] == "event"]
    first = events[0]
    assert first["level"] == "error"
    assert first["message"].startswith("the task raised in sample(): ValueError: sample bug")
    assert "Traceback (most recent call last)" in first["message"]
    assert 'broken_tasks.py", line 9, in sample' in first["message"]
    assert any(
        e["level"] == "error" and e["message"].startswith("the task failed 5 times in a row")
        for e in events
    ), events
    health = [r for r in records if r["type"] == "health"]
    assert health == [  # the process table's health column: failing, and why
        {"type": "health", "ok": False,
         "reason": "the task fails: ValueError: sample bug on purpose (in sample())"}
    ]  # fmt: skip


class ScoresRaiseSometimes(RepeatDigit):
    """Raises on every tenth score call (4 a group): a task with a bug on some inputs."""

    calls = 0

    def score(self, prompt: Prompt, completion: str) -> float:
        type(self).calls += 1
        if type(self).calls % 10 == 0:
            raise KeyError("rare input")
        return super().score(prompt, completion)


class Recorded(Reporter):
    """What the runner reports to the supervisor, kept for the test."""

    def __init__(self) -> None:
        super().__init__(None)
        self.records: list[dict[str, float]] = []
        self.events: list[tuple[str, str]] = []
        self.healths: list[tuple[bool, str]] = []

    def metrics(self, step: int | None, data: dict[str, float]) -> None:
        self.records.append(dict(data))

    def event(self, message: str, level: str = "info") -> None:
        self.events.append((level, message))

    def health(self, ok: bool, reason: str = "") -> None:
        self.healths.append((ok, reason))


async def test_a_task_that_raises_sometimes_keeps_going_and_shows_its_error_rate(
    spawn, tmp_path, tiny_model, inference
) -> None:
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    spawn("api", api_argv(port, tmp_path / "rollouts.db")).wait_http(f"{api}/health")
    trainer = Trainer(api, batch_size=1000)
    trainer.register()
    reporter = Recorded()
    settings = EnvSettings(group_size=4, max_concurrency=1, max_groups=4, max_consecutive_errors=3)
    runner = EnvRunner(
        ScoresRaiseSometimes(), settings, Connection(api, inference),
        FastTokenizer.from_dir(tiny_model), reporter=reporter, report_every=600,
    )  # fmt: skip
    stats = await runner.run()  # no exception: never 3 failures in a row
    trainer.close()
    counts = stats.counts
    assert counts["groups_sent"] == 4 and counts["task_errors"] >= 1
    scored = counts["groups_sent"] + counts["groups_dropped_equal_scores"]
    (report,) = reporter.records  # one report: at the end (report_every is long)
    assert report["env/error_rate"] == counts["task_errors"] / (counts["task_errors"] + scored)
    assert report["env/task_errors"] == counts["task_errors"]
    first = [message for level, message in reporter.events if level == "error"]
    assert len(first) == 1 and first[0].startswith("the task raised in score(): KeyError")
    # its health: failing from each failed group until the next one it runs through
    failing = (False, "the task fails: KeyError: 'rare input' (in score())")
    recovered = (True, "the task ran through again")
    assert reporter.healths[0] == failing
    assert set(reporter.healths) == {failing, recovered}
    pairs = zip(reporter.healths, reporter.healths[1:], strict=False)
    assert all(a != b for a, b in pairs), "said when it changes"


def test_max_consecutive_errors_is_an_env_key() -> None:
    assert EnvSettings().max_consecutive_errors == 20
    assert EnvSettings(max_consecutive_errors=0).max_consecutive_errors == 0  # never exit
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        EnvSettings(max_consecutive_errors=-1)
    argv = EnvSettings(max_consecutive_errors=7).command(
        api_url="a", inference_url="i", tokenizer="t"
    )
    assert argv[argv.index("--max-consecutive-errors") + 1] == "7"


def test_a_run_whose_task_raises_stops_with_the_exception_on_the_console(
    tmp_path: Path, tasks: Path
) -> None:
    """The new user's repro as a whole run (quickstart stack, the task of their try):
    the env gives up after its restarts and the run stops, exit 1, the exception on the
    console; it used to hang with the env ready. The restarts are cut to one, quickly."""
    profile = tomllib.loads(QUICKSTART.read_text())
    profile["run"]["output_dir"] = str(tmp_path / "runs")
    profile["api"]["port"], profile["inference"]["port"] = free_port(), free_port()
    profile["env"][0]["task"] = "broken_tasks:SampleRaises"
    profile["process"] = {
        "env": {
            "env": {"PYTHONPATH": f"{tasks}:{REPO}"},
            "restart": {"policy": "on_failure", "max_restarts": 1, "backoff_base": 0.2},
        }
    }
    path = tmp_path / "p.toml"
    path.write_text(tomli_w.dumps(profile))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "grpo_tui", "run", str(path)],
            capture_output=True, text=True, timeout=300, cwd=REPO,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the run hung: {str(exc.stdout)[-3000:]}") from None
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "trainer cannot go on without env" in done.stdout
    assert "ValueError: sample bug on purpose (in sample())" in done.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()
    log = (run_dir / "logs" / "env.log").read_text()
    assert log.count("Traceback (most recent call last)") == 2, "one per life, not thousands"
