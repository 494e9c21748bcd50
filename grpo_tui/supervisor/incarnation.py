"""One incarnation of a process: spawn (or adopt its standby), start gate, probes, wait.

:func:`run` runs one, from the preflight to the end of its child, and says how it ended
for the restart policy (``restart.py``), or None where the life ends here (a stop asked:
STOPPING or KILLING; failed for good: FAILED). Its state changes go through the record's checked
``transition``, and after each of its waits it looks at the state: a stop asked meanwhile
is what it acts on next (it stops the probes, then the child).

The probes: the readiness probe while STARTING (READY once it passes), then liveness and
progress side by side. They stop as a stop begins, before the child is stopped, and a
result that comes as it begins is dropped: a process stopped cleanly never shows a
failing probe.
"""

from __future__ import annotations

import asyncio

from grpo_tui.supervisor import probes
from grpo_tui.supervisor.events import ProbeResult, State
from grpo_tui.supervisor.process import Child, SpawnError, describe_exit
from grpo_tui.supervisor.record import PROBED, ProcessRecord
from grpo_tui.supervisor.restart import Ended
from grpo_tui.supervisor.steps import job_trouble


async def run(life: ProcessRecord) -> Ended | None:
    """One incarnation of ``life`` (module docstring)."""
    return await Incarnation(life).run()


class Incarnation:
    """One run of a process's child, on its record."""

    def __init__(self, life: ProcessRecord) -> None:
        self.life = life
        self.matcher: probes.LogMatcher | None = None

    async def run(self) -> Ended | None:
        life, spec = self.life, self.life.spec
        if (held := life.hooks.preflight(spec)) is not None:
            life.transition(State.FAILED, reason=f"{held}: not retried")  # it will not leave
            return None
        if spec.readiness is not None and spec.readiness.kind == "log_line":
            self.matcher = probes.LogMatcher(spec.readiness.pattern)
        life.sink.on_line = self.matcher
        life.sink.file.open()
        adopted = await life.standby.adopt(spec, life.sink)
        if adopted is not None:
            child, exited, command = adopted
        else:
            try:
                child = await life.hooks.spawn(spec, life.sink, None)
            except SpawnError as exc:
                if life.stopping:
                    return None
                if exc.permanent:
                    life.transition(State.FAILED, reason=f"{exc.reason}: not retried")
                    return None
                return Ended(None, exc.reason, 0.0)
            exited, command = asyncio.ensure_future(child.wait()), None
        life.child = child
        life.started_at = life.hooks.clock.now()
        life.checks.clear()
        if life.stopping:
            await self._end(child, exited)
            return None
        gated = spec.prestart
        first = State.STARTING if gated or spec.readiness is not None else State.RUNNING
        life.transition(first, pid=child.pid, reason="standby" if adopted else "spawned")
        if gated and not await self._gate(child, exited, command):
            # still STARTING: it exited at its gate; else it was stopped or failed for good
            return await self._exited(child, exited) if life.state is State.STARTING else None
        if adopted:  # a restart: the next may come soon, so its standby imports meanwhile
            life.keep_standby()
        return await self._supervise(child, exited)

    async def _gate(
        self, child: Child, exited: asyncio.Future[int], command: list[str] | None
    ) -> bool:
        """Open the start gate once the dependencies are met; False where it must not open:
        it exited (still STARTING), a stop or kill was asked (stopped here) or a
        dependency failed for good (FAILED: stopped here)."""
        life = self.life
        deps = asyncio.ensure_future(life.failed_dependency())
        try:
            await life.first(exited, deps)
        finally:
            deps.cancel()
        if life.stopping:
            await self._end(child, exited)
            return False
        if exited.done():
            return False
        if failed := deps.result():
            await self._end(child, exited)
            if not life.stopping:
                life.transition(State.FAILED, reason=failed)
            return False
        await child.open_gate(command)
        if life.spec.readiness is None and not life.stopping:
            life.transition(State.RUNNING, reason="start gate opened")
        return True

    async def _supervise(self, child: Child, exited: asyncio.Future[int]) -> Ended | None:
        """Run the probes until the child exits, a probe fails or a stop is asked."""
        life = self.life
        if life.state is State.STARTING:
            watch = asyncio.ensure_future(self._wait_ready())
        else:
            life.keep_standby()  # (a first start's waits until here: no competing imports)
            watch = asyncio.ensure_future(self._watch_health())
        life.reprobe.clear()
        reprobe = asyncio.ensure_future(life.reprobe.wait())
        try:
            while True:
                await life.first(exited, watch, reprobe)
                if life.stopping or exited.done():
                    break
                if reprobe.done():  # a replaced spec's health probes, from now on
                    life.reprobe.clear()
                    reprobe = asyncio.ensure_future(life.reprobe.wait())
                    if life.state in PROBED:
                        watch.cancel()
                        watch = asyncio.ensure_future(self._watch_health())
                    continue
                if life.state is State.STARTING:
                    watch.result()
                    life.checks.record("readiness", True, "passed")
                    life.transition(State.READY, reason="readiness probe passed")
                    life.keep_standby()
                    watch = asyncio.ensure_future(self._watch_health())
                    continue
                reason = watch.result()
                life.transition(State.UNHEALTHY, reason=reason)
                code = await self._end(child, exited)
                if life.stopping:
                    return None
                return Ended(code, reason, self._lasted(), unhealthy=True)
        finally:
            watch.cancel()
            reprobe.cancel()
        if life.stopping:
            await self._end(child, exited)
            return None
        return await self._exited(child, exited)

    async def _exited(self, child: Child, exited: asyncio.Future[int]) -> Ended | None:
        """The child exited on its own: how, for the restart policy (None: a stop was
        asked meanwhile)."""
        life = self.life
        code = await self._end(child, exited)
        lost = None
        if life.spec.slurm_step is not None:
            # A step ended unasked (even with 0: Slurm's SIGTERM to a lost node's job lets
            # the process stop cleanly): if the job lost a node, nothing can come back.
            lost = await asyncio.to_thread(job_trouble)
            if life.stopping:
                return None
        return Ended(code, describe_exit(code), self._lasted(), lost=lost)

    async def _end(self, child: Child, exited: asyncio.Future[int]) -> int:
        """Stop the child unless it has exited (shutdown signal, timeout, SIGKILL,
        confirm; SIGKILL at once where a kill was asked); its exit code, recorded, and its
        output flushed."""
        life = self.life
        if child.returncode is None and life.state is State.KILLING:
            life.report_survivors(await child.kill())
        elif child.returncode is None:
            shutdown = life.spec.shutdown
            life.report_survivors(await child.stop(shutdown.signum, shutdown.timeout))
        code = await exited
        life.sink.on_line = None
        life.exit_code = code
        life.hooks.flush_logs()
        return code

    def _lasted(self) -> float:
        now = self.life.hooks.clock.now()
        started = self.life.started_at
        return now - (started if started is not None else now)

    async def _wait_ready(self) -> None:
        """Until the readiness probe passed."""
        life = self.life
        assert life.spec.readiness is not None

        def report(ok: bool, message: str) -> None:
            if life.state is State.STARTING:
                life.hooks.publish(
                    ProbeResult(process=life.name, probe="readiness", ok=ok, message=message)
                )

        readiness, hooks = life.spec.readiness, life.hooks
        await probes.wait_ready(readiness, hooks.prober, report, self.matcher, hooks.clock)

    async def _watch_health(self) -> str:
        """Liveness and progress probes side by side, until one fails: what it saw."""
        spec, prober, clock = self.life.spec, self.life.hooks.prober, self.life.hooks.clock

        async def failed(kind: str, watch: asyncio.Future[str]) -> str:
            return f"{kind} probe failed: {await watch}"

        watches = []
        if spec.liveness is not None:
            liveness = probes.watch_liveness(spec.liveness, prober, self._health("liveness"), clock)
            watches.append(asyncio.ensure_future(failed("liveness", liveness)))
        if (progress := spec.progress) is not None:
            token = spec.env.get(progress.bearer_env) if progress.bearer_env else None
            work = probes.watch_progress(progress, prober, self._health("progress"), clock, token)
            watches.append(asyncio.ensure_future(failed("progress", work)))
        if not watches:
            await asyncio.Event().wait()
        try:
            done, _ = await asyncio.wait(watches, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for watch in watches:
                watch.cancel()
        return done.pop().result()

    def _health(self, probe: str) -> probes.Report:
        """Where a health probe's results go: its health and an event, while it runs
        (a result that comes as a stop begins says nothing of its health)."""
        life = self.life

        def report(ok: bool, message: str) -> None:
            if life.state in PROBED:
                life.checked(probe, ok, message)

        return report
