"""How an engine is started under the core plan (a worker's, and `tailguard plan --profile`'s):
reniced only where it shares the front-end cores, and only its own processes
(`cores.lowered_on_frontend`, which `EngineHost` starts its engine in)."""

import os
import subprocess
import sys

from tailguard.host.cores import Pinning, frontend_env, lowered_on_frontend


def _start(host, cores, frontend) -> int:
    """Start `host` as `EngineHost` starts its engine; the nice value it was given."""
    with lowered_on_frontend(Pinning(cores=cores), frontend_env(frontend)):
        host.start()
    return host.nice() - os.getpriority(os.PRIO_PROCESS, 0)


class SpawningHost:
    """Stands in for an EngineHost: start() starts a process, as vLLM's engine core."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                                     stdout=subprocess.DEVNULL)

    def nice(self) -> int:
        assert self.proc is not None
        return os.getpriority(os.PRIO_PROCESS, self.proc.pid)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def test_the_engine_on_the_front_end_cores_alone_is_reniced(monkeypatch):
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    monkeypatch.setenv("TAILGUARD_ENGINE_NICE", str(mine + 5))
    measured, neighbour = SpawningHost(), SpawningHost()
    try:
        assert _start(measured, (0,), (1,)) == 0  # its own core: left as it is
        assert _start(neighbour, (1,), (1,)) == mine + 5
        assert (measured.nice(), neighbour.nice()) == (mine, mine + 5)
    finally:
        measured.kill()
        neighbour.kill()


def test_no_front_end_cores_or_engine_nice_0_renice_nothing(monkeypatch):
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    host = SpawningHost()
    try:
        monkeypatch.setenv("TAILGUARD_ENGINE_NICE", "0")
        assert _start(host, (1,), (1,)) == 0
        monkeypatch.setenv("TAILGUARD_ENGINE_NICE", str(mine + 5))
        other = SpawningHost()
        try:
            assert _start(other, (1,), ()) == 0
            assert other.nice() == mine
        finally:
            other.kill()
        assert host.nice() == mine
    finally:
        host.kill()
