"""A real Slurm cluster on this machine, for tests: Debian's slurm-wlm started by
``slurm_local.sh`` (a controller and N compute nodes ``n1`` ... in a temporary directory).

Every node is this host (one network namespace), so two roles on different nodes must
still use different ports. ``.ci/run`` installs slurm-wlm with apt-get where it is missing;
without it the tests that need a cluster fail, saying so, unless
``GRPO_TUI_ALLOW_MISSING_TOOLS`` names ``slurm`` (``tests/required_tools.py``).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
from required_tools import require

SCRIPT = Path(__file__).with_name("slurm_local.sh")


def _ports_free(base: int, count: int) -> bool:
    for port in range(base, base + count):
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                return False
    return True


@dataclass
class SlurmCluster:
    root: Path
    env: dict[str, str]

    def run(self, *command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(command), env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def steps(self, job: str) -> dict[str, str]:
        """``step name -> node list`` of the job's live steps (the batch step excluded)."""
        out = self.run("squeue", "-h", "--steps", "--jobs", job, "-o", "%j %N").stdout
        found = {}
        for line in out.splitlines():
            name, _, nodes = line.partition(" ")
            if name != "batch":
                found[name] = nodes.strip()
        return found

    def step_ids(self, job: str) -> dict[str, str]:
        """``step name -> step id`` of the job's live steps."""
        out = self.run("squeue", "-h", "--steps", "--jobs", job, "-o", "%j %i").stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def job_alive(self, job: str) -> bool:
        return bool(self.run("squeue", "-h", "--jobs", job, "-o", "%i").stdout.strip())

    @contextmanager
    def allocation(self, nodes: int = 2) -> Iterator[dict[str, str]]:
        """``salloc --no-shell``: the environment of a process running inside that job."""
        done = self.run("salloc", f"-N{nodes}", "--no-shell", "--immediate=60", "-J", "test")
        found = re.search(r"Granted job allocation (\d+)", done.stderr)
        assert found, done.stderr
        job = found.group(1)
        nodelist = self.run("squeue", "-h", "--jobs", job, "-o", "%N").stdout.strip()
        try:
            yield {**self.env, "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": nodelist}
        finally:
            self.run("scancel", job)


def start_cluster(root: Path, nodes: int = 2) -> SlurmCluster:
    require("slurm")
    base = next(b for b in random.sample(range(20000, 40000, 20), 50) if _ports_free(b, 11 + nodes))
    env = {
        **os.environ,
        "SLURM_CONF": str(root / "slurm.conf"),
        "SLURM_LOCAL_PORT": str(base),
    }
    for variable in [v for v in env if v.startswith("SLURM_JOB") or v == "SLURM_JOBID"]:
        del env[variable]
    done = subprocess.run(
        ["bash", str(SCRIPT), "start", str(root), str(nodes)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        subprocess.run(["bash", str(SCRIPT), "stop", str(root)], timeout=30)
        raise AssertionError(f"the Slurm cluster did not start:\n{done.stdout}\n{done.stderr}")
    return SlurmCluster(root=root, env=env)


def stop_cluster(cluster: SlurmCluster) -> None:
    """Cancel what is left of our jobs, then stop the daemons by their pid files."""
    jobs = cluster.run("squeue", "-h", "-o", "%i").stdout.split()
    if jobs:
        cluster.run("scancel", *jobs)
        deadline = time.monotonic() + 60
        while cluster.run("squeue", "-h", "-o", "%i").stdout.strip():
            assert time.monotonic() < deadline, "jobs still listed 60 s after scancel"
            time.sleep(0.2)
    subprocess.run(["bash", str(SCRIPT), "stop", str(cluster.root)], timeout=30)
    # A step on a node marked down stays with its slurmstepd, which waits for a controller
    # that has written the step off: end our cluster's own (their SLURM_CONF is ours).
    # slurmstepd writes its title over the start of its environment block, which psutil
    # then reads as empty: look for our SLURM_CONF in the raw block.
    conf = f"SLURM_CONF={cluster.env['SLURM_CONF']}".encode()
    ours = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
            if proc.pid != os.getpid() and conf in environ:
                ours.append(proc)
    for proc in ours:  # slurmstepd ignores SIGTERM; its controller is gone already
        with contextlib.suppress(psutil.Error):
            proc.kill()
    _, alive = psutil.wait_procs(ours, timeout=10)
    assert not alive, f"could not end {alive}"
