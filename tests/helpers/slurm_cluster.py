"""The local SLURM test clusters (tests/slurm/cluster.sh) as session fixtures, shared by every test
directory that needs them: registered in tests/conftest.py.

The session fixture ``slurm_cluster`` (2 nodes; tests/slurm, tests/conformance) starts the cluster when it
is not up, puts ``SLURM_CONF`` into ``os.environ`` for its lifetime, and stops the cluster at the end
when a test session started it and no other test session still uses it (several sessions may share the
one cluster, each holding a lease file). A cluster someone started by hand is left running; so is any
cluster when ``TRAINSCALE_TEST_CLUSTER_KEEP=1``. ``scale_cluster`` (tests/scale) is the same for a
16-node cluster (``TRAINSCALE_TEST_CLUSTER_NODES`` another size) in a directory and on ports of its own,
so it never replaces the shared 2-node one; it leaves ``os.environ`` alone (its tests pass
``cluster.env``), so one session may hold both.

If the cluster cannot be started (not root, no apt, install failure) the fixture fails with the
reason when ``CI=true`` and skips otherwise.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1] / "slurm"
CLUSTER_SH = HERE / "cluster.sh"
DEFAULT_DIR = "/tmp/trainscale-slurm"
"""The 2-node cluster's directory; an N-node cluster's is ``DEFAULT_DIR-<N>n`` (cluster.sh)."""
SCALE_NODES = 16
"""The scale tests' cluster (TRAINSCALE_TEST_CLUSTER_NODES overrides)."""
UP_TIMEOUT_S = 900  # includes apt-get install on a fresh machine
IN_USE_CHECK_S = 120
"""How long a session waits for a cluster another session holds to pass `cluster.sh check`."""
SESSION_ENV: set[str] = set()
"""Environment variables the session-scoped cluster fixture sets for every later test."""
TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)


@dataclass(frozen=True)
class SlurmCluster:
    """A running test cluster and how to talk to it."""

    dir: Path
    """The cluster directory (slurm.conf, log/, state/, spool/)."""
    env: dict[str, str]
    """Variables a SLURM client needs, e.g. {"SLURM_CONF": ".../slurm.conf"}."""
    nodes: tuple[str, ...] = ("n1", "n2")
    """Node names, in order; the first is the master address of a job on all of them."""
    partition: str = "debug"
    """The default partition, holding all nodes."""
    cpus_per_node: int = 4
    """CPUs each node declares (more than the machine has: config_overrides)."""
    log_dir: Path = field(init=False)
    """Daemon logs: slurmctld.log, slurmd-n1.log, slurmd-n2.log, jobcomp.txt."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "log_dir", self.dir / "log")

    def run(self, *args: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a SLURM client command (sbatch, squeue, ...) against this cluster."""
        return subprocess.run(
            list(args),
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )

    def submit(self, script: Path, *sbatch_args: str) -> str:
        """sbatch --parsable SCRIPT from the script's directory; returns the job id."""
        proc = self.run("sbatch", "--parsable", f"--chdir={script.parent}", *sbatch_args, str(script))
        return proc.stdout.strip().split(";")[0]

    def job_fields(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -o` as a dict (finished jobs stay MinJobAge=600 s)."""
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(re.findall(r"(\S+?)=(\S*)", out))

    def job_state(self, job_id: str) -> str:
        return self.job_fields(job_id)["JobState"]

    def wait_state(
        self, job_id: str, states: frozenset[str] | set[str], timeout: float = 120, queued_for: float = 900
    ) -> str:
        """Poll until the job is in one of STATES; fail with its fields once it has been out of the queue for
        TIMEOUT s. Time PENDING counts apart (up to QUEUED_FOR s): a cluster busy with other tests' jobs queues
        this one, which is no fault of the job, and the failure says how long it waited for each."""
        last, running, queued = time.monotonic(), 0.0, 0.0
        while True:
            state = self.job_state(job_id)
            if state in states:
                return state
            now = time.monotonic()
            if state == "PENDING":
                queued += now - last
            else:
                running += now - last
            last = now
            if running > timeout or queued > queued_for:
                pytest.fail(
                    f"job {job_id} still {state} after {running:.0f}s out of the queue (limit {timeout}s) and "
                    f"{queued:.0f}s PENDING in it (limit {queued_for}s), waiting for {sorted(states)}: "
                    f"{self.job_fields(job_id)}; logs in {self.log_dir}"
                )
            time.sleep(0.2)

    def lose_node(self, name: str) -> None:
        """What a node's death does here, where every node is this machine: its slurmd and the job processes on it
        gone (its step daemons first: a dead node reports nothing, not even its batch script's end), and the node
        marked down (what slurmctld does once a node stops answering, after SlurmdTimeout). (Freezing the step
        daemons instead made this SLURM's slurmctld segfault.) :meth:`revive_node` kills what was frozen."""
        os.kill(int((self.dir / "run" / f"slurmd-{name}.pid").read_text()), signal.SIGKILL)
        mark = f"SLURMD_NODENAME={name}".encode()
        on_node, stepds = [], set()
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    if mark in (proc / "environ").read_bytes().split(b"\0"):
                        on_node.append(int(proc.name))
                        parent = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
                        if Path(f"/proc/{parent}/comm").read_text().startswith("slurmstepd"):
                            stepds.add(int(parent))
                except OSError:  # gone meanwhile
                    pass
        # a dead node closes no connection: its srun clients (a batch host's) are frozen, not killed, or the
        # steps they started on other nodes would see them go; the rest dies, step daemons first
        frozen = [pid for pid in on_node if _comm(pid) == "srun"]
        for pid in frozen:
            _signal(pid, signal.SIGSTOP)
        for pid in [*stepds, *on_node]:
            if pid not in frozen:
                _signal(pid, signal.SIGKILL)
        (self.dir / "run" / f"frozen-{name}").write_text(" ".join(map(str, frozen)))
        self.run("scontrol", "update", f"nodename={name}", "state=down", "reason=trainscale-test-node-lost")

    def revive_node(self, name: str) -> None:
        """The node back: what froze with it killed, its slurmd started again and the node resumed
        (ReturnToService may have done that)."""
        frozen = self.dir / "run" / f"frozen-{name}"
        for pid in frozen.read_text().split() if frozen.exists() else ():
            _signal(int(pid), signal.SIGKILL)
        frozen.unlink(missing_ok=True)
        self.run("slurmd", "-N", name, check=False)
        self.run("scontrol", "update", f"nodename={name}", "state=resume", check=False)

    def lose_node_of(self, job_id: str, name: str, timeout: float = 400) -> str:
        """Lose node ``name`` under a running job, wait for the job's end (its final state), then revive the node."""
        self.lose_node(name)
        try:
            return self.wait_done(job_id, timeout=timeout)
        finally:
            self.revive_node(name)

    def wait_done(self, job_id: str, timeout: float = 120) -> str:
        """Poll until the job has ended; returns its final state.

        The timeout is generous because other test sessions may share the cluster
        and hold its CPUs for a while."""
        return self.wait_state(job_id, TERMINAL_STATES, timeout)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:  # gone meanwhile
        pass


def _cluster_dir(nodes: int = 2) -> Path:
    if nodes != 2:  # TRAINSCALE_TEST_CLUSTER_DIR names the shared 2-node cluster's only
        return Path(f"{DEFAULT_DIR}-{nodes}n")
    return Path(os.environ.get("TRAINSCALE_TEST_CLUSTER_DIR", DEFAULT_DIR))


def _cluster_sh(command: str, timeout: float, nodes: int = 2) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "TRAINSCALE_TEST_CLUSTER_NODES": str(nodes),
        "TRAINSCALE_TEST_CLUSTER_DIR": str(_cluster_dir(nodes)),
    }
    return subprocess.run(["bash", str(CLUSTER_SH), command], capture_output=True, text=True, timeout=timeout, env=env)


@contextlib.contextmanager
def _leases_locked(cluster_dir: Path) -> Iterator[Path]:
    leases = cluster_dir / "leases"
    leases.mkdir(parents=True, exist_ok=True)
    with open(cluster_dir / "leases.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield leases


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _live_leases(leases: Path) -> list[Path]:
    live = []
    for lease in leases.iterdir():
        if lease.name.isdigit() and _pid_alive(int(lease.name)):
            live.append(lease)
        else:
            lease.unlink(missing_ok=True)  # a session that died without teardown
    return live


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"SLURM test cluster unavailable (CI=true, so this is an error): {reason}")
    pytest.skip(f"SLURM test cluster unavailable: {reason}")


@contextlib.contextmanager
def cluster_session(nodes: int) -> Iterator[SlurmCluster]:
    """The N-node cluster for this test session: started unless up, stopped after the last lease."""
    cluster_dir = _cluster_dir(nodes)
    if os.name != "posix" or os.geteuid() != 0:
        _unavailable(f"{CLUSTER_SH} needs root (slurmd runs jobs as their user)")
    started_marker = cluster_dir / "started-by-tests"
    lease = None
    with _leases_locked(cluster_dir) as leases:
        if _live_leases(leases):
            # Another session's jobs may be running: `up` would restart the daemons under them. A check
            # can fail for a moment under load (sinfo timing out), so it is asked again, not overruled.
            deadline = time.monotonic() + IN_USE_CHECK_S
            while (check := _cluster_sh("check", timeout=30, nodes=nodes)).returncode != 0:
                if time.monotonic() > deadline:
                    _unavailable(
                        f"the {nodes}-node cluster another test session uses has not been healthy for "
                        f"{IN_USE_CHECK_S}s (`{CLUSTER_SH} check`: {check.stderr.strip()[-2000:]}); "
                        f"logs in {cluster_dir / 'log'}"
                    )
                time.sleep(1)
        elif _cluster_sh("check", timeout=30, nodes=nodes).returncode != 0:
            t0 = time.monotonic()
            proc = _cluster_sh("up", timeout=UP_TIMEOUT_S, nodes=nodes)
            if proc.returncode != 0:
                _unavailable(f"`{CLUSTER_SH} up` ({nodes} nodes) exited {proc.returncode}:\n{proc.stderr[-3000:]}")
            started_marker.touch()
            print(f"SLURM test cluster ({nodes} nodes) started in {time.monotonic() - t0:.1f}s; {proc.stdout.strip()}")
        lease = leases / str(os.getpid())
        lease.touch()
    try:
        yield SlurmCluster(
            dir=cluster_dir,
            env={"SLURM_CONF": str(cluster_dir / "slurm.conf")},
            nodes=tuple(f"n{i + 1}" for i in range(nodes)),
        )
    finally:
        with _leases_locked(cluster_dir) as leases:
            lease.unlink(missing_ok=True)
            keep = os.environ.get("TRAINSCALE_TEST_CLUSTER_KEEP") == "1"
            if not _live_leases(leases) and started_marker.exists() and not keep:
                proc = _cluster_sh("down", timeout=120 + 10 * nodes, nodes=nodes)
                started_marker.unlink(missing_ok=True)
                if proc.returncode != 0:
                    pytest.fail(f"`{CLUSTER_SH} down` exited {proc.returncode}:\n{proc.stderr[-3000:]}")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    with cluster_session(2) as cluster:
        saved = {name: os.environ.get(name) for name in cluster.env}
        os.environ.update(cluster.env)
        SESSION_ENV.update(cluster.env)  # the per-module environment check (tests/conftest.py) leaves these alone
        try:
            yield cluster
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@pytest.fixture(scope="session")
def scale_cluster() -> Iterator[SlurmCluster]:
    """The scale tests' cluster (16 nodes); ``os.environ`` untouched: pass ``cluster.env`` to its commands."""
    nodes = int(os.environ.get("TRAINSCALE_TEST_CLUSTER_NODES") or SCALE_NODES)
    with cluster_session(nodes) as cluster:
        yield cluster
