"""``[run] notify``: a real command, run on a real supervisor's end, failures, stalls and
alerts, with the JSON payload on its stdin; bounded, its failures reported, never blocking."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from grpo_tui.notify import MAX_RUNNING, Notifier
from grpo_tui.supervisor.events import MetricsRecord, Stalled
from grpo_tui.supervisor.spec import ProcessSpec
from grpo_tui.supervisor.supervisor import Supervisor

APPEND_STDIN = "import sys; open(sys.argv[1], 'a').write(sys.stdin.read() + '\\n')"
"""The notify command of these tests: each payload as one line of a file."""


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def received(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def supervisor(tmp_path: Path, code: str, *, restart: str = "no") -> Supervisor:
    worker = ProcessSpec(
        name="trainer", role="trainer", command=python(code), restart={"policy": restart}
    )
    return Supervisor([worker], tmp_path / "run", exit_with="trainer")


async def test_the_end_of_a_run_is_sent_to_the_command(tmp_path: Path) -> None:
    out = tmp_path / "sent.jsonl"
    sup = supervisor(tmp_path, "print('done')")
    notifier = Notifier(python(APPEND_STDIN, str(out)), sup, "quick")
    outcome = await notifier.run(sup.run())
    assert outcome.exit_code == 0
    (end,) = received(out)
    assert end["event"] == "end" and end["exit_code"] == 0
    assert end["run"] == "quick" and end["run_dir"] == str(tmp_path / "run")
    assert end["message"].startswith("quick: run finished (exit 0): ")
    assert notifier.problems == []


async def test_a_process_failing_for_good_a_stall_and_an_alert_are_sent(tmp_path: Path) -> None:
    out = tmp_path / "sent.jsonl"
    sup = supervisor(tmp_path, "import time, sys; time.sleep(1.5); sys.exit(3)")
    notifier = Notifier(python(APPEND_STDIN, str(out)), sup, "failing")

    async def meanwhile() -> None:
        await asyncio.sleep(0.3)
        sup.publish(
            MetricsRecord(process="trainer", step=4, data={"clipped_fraction": 0.5, "loss": 1.0})
        )
        sup.publish(Stalled(process="trainer", seconds=120, step=4, causes=("no batch",)))

    side = asyncio.create_task(meanwhile())
    outcome = await notifier.run(sup.run())
    await side
    assert outcome.exit_code != 0
    sent = {payload["event"]: payload for payload in received(out)}
    assert set(sent) == {"alert", "stall", "failure", "end"}
    assert sent["alert"]["alert"] == "clipped_fraction" and sent["alert"]["step"] == 4
    assert sent["stall"]["process"] == "trainer" and sent["stall"]["causes"] == ["no batch"]
    assert sent["failure"]["process"] == "trainer" and "3" in sent["failure"]["reason"]
    assert sent["end"]["exit_code"] == outcome.exit_code
    assert sent["end"]["message"].startswith("failing: run failed (exit ")


async def test_a_slow_or_failing_command_is_reported_and_never_holds_the_run(
    tmp_path: Path,
) -> None:
    """A command that hangs is killed at the timeout, one that fails or is missing is
    reported: as a warning notice while the run goes on (in events.jsonl), after its end in
    ``problems`` (the exit summary prints them)."""
    sup = supervisor(tmp_path, "import time; time.sleep(1.0)")
    hangs = Notifier(python("import time; time.sleep(60)"), sup, "slow", timeout=0.5)
    started = time.monotonic()
    hangs.send("alert", "an alert while the run goes on", alert="test")
    outcome = await hangs.run(sup.run())
    took = time.monotonic() - started
    assert outcome.exit_code == 0
    assert took < 10, f"the run waited {took:.1f} s for its notify commands"
    assert hangs.problems == [
        "notify command for alert killed after 0.5 s",
        "notify command for end killed after 0.5 s",
    ]
    notices = [
        json.loads(line)["message"]
        for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()
        if '"Notice"' in line
    ]
    assert "notify command for alert killed after 0.5 s" in notices  # during the run

    second = supervisor(tmp_path / "b", "print('x')")
    failing = Notifier(python("import sys; print('webhook said 403'); sys.exit(4)"), second, "x")
    await failing.run(second.run())
    assert failing.problems == ["notify command for end exited 4: webhook said 403"]

    third = supervisor(tmp_path / "c", "print('x')")
    missing = Notifier([str(tmp_path / "no-such-command")], third, "x")
    await missing.run(third.run())
    (problem,) = missing.problems
    assert problem.startswith("notify command for end could not start (")


async def test_commands_beyond_the_bound_are_dropped_and_said(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, "import time; time.sleep(3)")
    notifier = Notifier(python("import time; time.sleep(60)"), sup, "busy", timeout=1.0)

    async def flood() -> None:
        await asyncio.sleep(0.1)
        for i in range(MAX_RUNNING + 1):
            notifier.send("alert", f"alert {i}", alert=str(i))

    side = asyncio.create_task(flood())
    await notifier.run(sup.run())
    await side
    assert notifier.problems[0] == f"notify: {MAX_RUNNING} commands still running; alert dropped"
    killed = [problem for problem in notifier.problems if "killed after" in problem]
    assert len(killed) == MAX_RUNNING + 1  # the alerts, then the end
