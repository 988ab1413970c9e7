"""Child processes: start, pin, log, watch and stop them, with one set of timeouts.

Every process tailguard starts goes through here: `tailguard up`'s Redis, API,
workers and Flower, a benchmark topology's API and workers, the test suite's
servers and workers. A child is described by a `ChildSpec` (plain data, so the
same child can be started again: a restart policy hooks in where a `Group`
finds an exited child) and runs as a `Child`:

* in its own process group, so a Ctrl-C meant for us (the terminal's foreground group) does
  not reach it, and stopping it can end its whole group (vLLM's engine-core process
  included); in our session, so nice values rank it against our other children where the
  kernel groups processes by session (autogroup);
* pinned before it runs a line, when its spec has a pin: the environment vLLM and
  CUDA read (`Pinning.env`), which places its engine, not the process itself; the
  process itself runs on its spec's `cpus`, the front-end cores (the core plan in
  tailguard/host/cores.py);
* with its output in a log file of its own (`log_tail()` goes into error
  messages), or echoed line by line behind a name tag (`tailguard up`);
* stopped by its stop signal (a warm shutdown), then killed, group and all, if
  it has not exited within its stop timeout.

Within `stop_signals()` (`tailguard bench`), SIGTERM and SIGINT raise KeyboardInterrupt in
the main thread, so the `finally` blocks that stop children run; `Group.start` holds such
a signal (`signals_held`) until the child it starts is in the group, so none is started
and then lost.

A `Group` starts children in order and stops them in reverse: what started
later (workers) may need what started earlier (Redis) to shut down cleanly.
A child whose spec has a `RestartPolicy` is started again by `Group.supervise`
when it exits, after an exponential backoff, in its place in that order; after
`max_restarts` restarts within `window_s` it is left down (a crash loop) and
`supervise` says why.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tailguard.host.cores import Pinning, children_on

T = TypeVar("T")

#: How long a child may take to exit after its stop signal (a worker's warm shutdown
#: finishes its tasks and stops its engine) before its process group is killed.
STOP_TIMEOUT_S = 90.0
#: How long to wait for a killed child to be reaped.
KILL_WAIT_S = 10.0
#: How often `wait_until` checks its condition and the children's liveness.
POLL_S = 0.2
#: How much of a child's log goes into an error message.
LOG_TAIL_CHARS = 3000


#: main thread only: signals_held's nesting, the signal it holds, what its blocks run on one
_held: dict[str, Any] = {"depth": 0, "signal": None, "then": []}


def _raise_stop(signum: int, frame: object) -> None:
    if _held["depth"]:
        _held["signal"] = signum
        for then in list(_held["then"]):
            then()
        return
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def stop_signals(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> Iterator[None]:
    """Within the block, `signals` raise KeyboardInterrupt in the main thread (as Ctrl-C does
    by default), held inside `signals_held`; the previous handlers come back after it. Outside
    the main thread (where Python runs no handler) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise_stop) for s in signals}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _held["signal"] = None  # held for a block that failed anyway: nothing is left to stop


@contextmanager
def signals_held(then: Callable[[], None] | None = None) -> Iterator[None]:
    """A stop signal (`stop_signals`) that arrives within the block is raised when it ends, not
    in the middle: a child started is registered first, a cleanup is not cut short. `then`,
    if given, runs as the signal arrives (kept short: it runs in the signal handler), e.g.
    to kill what the block is waiting for. If the block raises anyway, that exception goes
    on and the signal stays held for the next block's end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _held["depth"] += 1
    if then is not None:
        _held["then"].append(then)
    try:
        yield
    finally:
        _held["depth"] -= 1
        if then is not None:
            _held["then"].remove(then)
    if _held["depth"] == 0 and _held["signal"] is not None:
        signum, _held["signal"] = _held["signal"], None
        raise KeyboardInterrupt(f"signal {signum} (held)")


class ChildFailed(RuntimeError):
    """A child exited while it should be running, or did not become ready in time.

    The message carries the tail of the children's logs.
    """


@dataclass(frozen=True)
class RestartPolicy:
    """How a supervised child comes back after it exits: the n-th restart within `window_s`
    waits `backoff_s * 2**n` (at most `max_backoff_s`); the restart after `max_restarts`
    within `window_s` is not done (a crash loop: restarting again would only repeat it)."""

    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    max_restarts: int = 5
    window_s: float = 300.0

    def delay(self, recent_restarts: int) -> float:
        """Seconds to wait before the next restart, given the restarts within the window."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** recent_restarts)


@dataclass(frozen=True)
class ChildSpec:
    """What to run and how to stop it; started as often as needed by `start`."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # on top of our environment
    pin: Pinning = Pinning()  # its env applied by us; a `tailguard worker` pins itself from its argv
    #: the CPUs the process runs on (its threads and children inherit them); (): where we run.
    #: The front-end cores (tailguard/host/cores.py); an engine's own processes move to its cores.
    cpus: tuple[int, ...] = ()
    cwd: Path | None = None
    stop_signal: int = signal.SIGTERM
    stop_timeout_s: float = STOP_TIMEOUT_S
    restart: RestartPolicy | None = None  # None: an exit is final (`Group.supervise` reports it)


class Child:
    """One running (or exited) child process started from a ChildSpec."""

    def __init__(self, spec: ChildSpec, proc: subprocess.Popen, log: Path | None) -> None:
        self.spec = spec
        self.proc = proc
        self.log = log
        self._echoed: collections.deque[str] = collections.deque(maxlen=200)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once it has exited (negative: the signal that ended it), else None."""
        return self.proc.poll()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def describe(self) -> str:
        """`name` with its state: running, or how it exited."""
        code = self.returncode
        if code is None:
            return f"{self.name} (pid {self.pid}, running)"
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        return f"{self.name} (pid {self.pid}, exited with {how})"

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        """The end of what the child wrote, headed by its name and state."""
        if self.log is not None:
            try:
                text = self.log.read_text(errors="replace")
            except OSError as exc:
                text = f"(no log: {exc})"
        else:
            text = "".join(self._echoed)
        return f"--- {self.describe()}\n{text[-chars:]}"

    def stop(self) -> int | None:
        """Stop signal, then SIGKILL to the whole group after the stop timeout; the exit status.

        Idempotent. Whatever is left of the child's process group afterwards (an engine core
        orphaned by a crash) is killed too.
        """
        if self.alive():
            self.proc.send_signal(self.spec.stop_signal)
            try:
                self.proc.wait(self.spec.stop_timeout_s)
            except subprocess.TimeoutExpired:
                print(f"procs: {self.name} did not stop within {self.spec.stop_timeout_s:.0f} s; "
                      "killing it", file=sys.stderr, flush=True)
                self._kill_group()
                self.proc.wait(KILL_WAIT_S)
        self._kill_group()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the child's whole process group now (no warm shutdown)."""
        self._kill_group()
        self.proc.wait(KILL_WAIT_S)

    def _kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone already


def start(spec: ChildSpec, *, log: Path | None = None, echo: str | None = None,
          append: bool = False) -> Child:
    """Start `spec`'s program in its own process group (stopped as a group), in our session,
    pinned as its spec says. Not a session of its own: where the kernel groups processes by
    session (autogroup), a nice value counts only inside one, and an engine's nice must rank
    it below the API and Redis that share its cores (docs/cpu-hosts.md).

    Output goes to `log` (a file of its own, truncated unless `append`: a restart keeps
    what the crashed run wrote), or with `echo` to our stdout, each line behind that tag,
    or with neither to our stdout as is.
    """
    env = {**os.environ, **spec.env, **spec.pin.env()}
    out = (open(log, "ab" if append else "wb") if log is not None
           else (subprocess.PIPE if echo is not None else None))
    try:
        with children_on(spec.cpus):
            proc = subprocess.Popen(list(spec.argv), cwd=spec.cwd, env=env, stdout=out,
                                    stderr=subprocess.STDOUT if out is not None else None,
                                    stdin=subprocess.DEVNULL, process_group=0)
    finally:
        if log is not None:
            out.close()  # the child holds its own descriptor
    child = Child(spec, proc, log)
    if log is None and echo is not None:
        threading.Thread(target=_echo, args=(child, echo), name=f"echo-{spec.name}",
                         daemon=True).start()
    return child


def _echo(child: Child, tag: str) -> None:
    assert child.proc.stdout is not None
    for raw in iter(child.proc.stdout.readline, b""):
        line = raw.decode(errors="replace")
        child._echoed.append(line)
        sys.stdout.write(tag + line)
        sys.stdout.flush()


def running(pid: int) -> bool:
    """Whether process `pid` exists and has not exited (a zombie has: it only awaits its
    parent's wait). Any process, not only our children; Linux /proc, else a signal 0 probe."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True


def log_tails(children: Iterable[Child], chars: int = LOG_TAIL_CHARS) -> str:
    return "\n".join(c.log_tail(chars) for c in children)


def wait_until(ready: Callable[[], T], children: Iterable[Child], timeout_s: float,
               what: str) -> T:
    """`ready()`'s first truthy value, polled while every child is alive.

    Raises ChildFailed, with the children's log tails, as soon as one of them has
    exited or when `timeout_s` has passed.
    """
    children = list(children)
    deadline = time.monotonic() + timeout_s
    while True:
        dead = [c for c in children if not c.alive()]
        if dead:
            raise ChildFailed(f"{what}: {', '.join(c.describe() for c in dead)}\n"
                              + log_tails(children))
        value = ready()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ChildFailed(f"{what}: not reached within {timeout_s:.0f} s\n"
                              + log_tails(children))
        time.sleep(POLL_S)


class Group:
    """Children that belong together: started in order, stopped in reverse order.

    With a `log_dir`, each child logs to `<log_dir>/<name>.log`. `supervise()`, called
    periodically, restarts the exited children whose spec has a restart policy.
    """

    def __init__(self, log_dir: Path | None = None) -> None:
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.children: list[Child] = []
        self.given_up: dict[str, str] = {}  # children left down after a crash loop: why
        self._restart: dict[str, Callable[[], Child]] = {}
        self._restarts: dict[str, list[float]] = collections.defaultdict(list)  # monotonic times
        self._due: dict[str, float] = {}  # exited children waiting out their backoff

    def start(self, spec: ChildSpec, *, echo: str | None = None) -> Child:
        log = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log = self.log_dir / f"{spec.name}.log"
        with signals_held():
            return self.adopt(start(spec, log=log, echo=echo),
                              restart=lambda: start(spec, log=log, echo=echo, append=True))

    def adopt(self, child: Child, *, restart: Callable[[], Child] | None = None) -> Child:
        """Take in a child started elsewhere (`start_redis` waits for it to answer first).

        `restart` starts it again when its spec has a restart policy; by default its spec is
        started anew, appending to its log file.
        """
        if any(c.name == child.name for c in self.children):
            raise ValueError(f"a child named {child.name!r} is already in this group")
        self.children.append(child)
        self._restart[child.name] = restart or (
            lambda: start(child.spec, log=child.log, append=True))
        return child

    def __getitem__(self, name: str) -> Child:
        for child in self.children:
            if child.name == name:
                return child
        raise KeyError(name)

    def exited(self) -> list[Child]:
        return [c for c in self.children if not c.alive()]

    def failed(self) -> list[Child]:
        """Exited children that will not be restarted: no restart policy, or a crash loop."""
        return [c for c in self.exited()
                if c.spec.restart is None or c.name not in self._restart or c.name in self.given_up]

    def supervise(self, now: float | None = None) -> list[str]:
        """Restart what exited and is due, schedule what just exited; what happened, in words.

        Called periodically by the owner of the group (`tailguard up` twice a second). An
        exited child without a restart policy is left to the caller (see `failed`).
        """
        now = time.monotonic() if now is None else now
        said = []
        for i, child in enumerate(self.children):
            policy = child.spec.restart
            if (child.alive() or policy is None or child.name not in self._restart
                    or child.name in self.given_up):
                continue
            recent = self._restarts[child.name] = [
                t for t in self._restarts[child.name] if now - t < policy.window_s]
            due = self._due.get(child.name)
            if due is None:
                child.stop()  # reap it and whatever is left of its process group
                if len(recent) >= policy.max_restarts:
                    self.given_up[child.name] = (
                        f"{child.describe()}: restarted {len(recent)} times within "
                        f"{policy.window_s:.0f} s (a crash loop); left down")
                    said.append(self.given_up[child.name])
                    continue
                delay = policy.delay(len(recent))
                self._due[child.name] = now + delay
                said.append(f"{child.describe()}; restarting it in {delay:.1f} s "
                            f"(restart {len(recent) + 1} of at most {policy.max_restarts} "
                            f"within {policy.window_s:.0f} s)")
            elif now >= due:
                del self._due[child.name]
                recent.append(now)
                self.children[i] = self._restart[child.name]()
                said.append(f"restarted {self.children[i].describe()}")
        return said

    def wait_until(self, ready: Callable[[], T], timeout_s: float, what: str) -> T:
        return wait_until(ready, self.children, timeout_s, what)

    def log_tails(self, chars: int = LOG_TAIL_CHARS) -> str:
        return log_tails(self.children, chars)

    def stop(self, on_stop: Callable[[Child], None] | None = None,
             first: Iterable[str] = ()) -> dict[str, int | None]:
        """Stop the children named in `first` (in that order), then every other child, last
        started first; their exit statuses by name. Nothing is restarted afterwards."""
        self._restart.clear()
        self._due.clear()
        first = [self[name] for name in first]
        codes: dict[str, int | None] = {}
        for child in first + [c for c in reversed(self.children) if c not in first]:
            if on_stop is not None and child.alive():
                on_stop(child)
            codes[child.name] = child.stop()
        return {c.name: codes[c.name] for c in self.children}

    def kill(self) -> None:
        """SIGKILL every child's process group now, without waiting (a second Ctrl-C): a
        `stop()` in progress then finds each child gone at once."""
        self._restart.clear()
        for child in self.children:
            child._kill_group()

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def tailguard_argv(*args: str, python: str = sys.executable) -> tuple[str, ...]:
    """argv of a `tailguard ...` command run by this environment's Python."""
    return (python, "-m", "tailguard.cli", *args)


def worker_spec(name: str, pin: Pinning, *args: str, env: Mapping[str, str] | None = None,
                python: str = sys.executable, cpus: tuple[int, ...] = ()) -> ChildSpec:
    """`tailguard worker --worker NAME` with its engine pinned to `pin` (it pins itself from
    its options) and its own threads on `cpus`, as `tailguard up` and the benchmark run it;
    `args` are further worker options."""
    return ChildSpec(f"worker.{name}",
                     tailguard_argv("worker", "--worker", name, *pin.options(), *args,
                                    python=python),
                     env=dict(env or {}), cpus=cpus)


def console_script(name: str) -> str:
    """A console script of this environment (next to the running Python), else `name` on PATH."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def become(argv: list[str], env: Mapping[str, str] | None = None,
           pin: Pinning | None = None) -> None:
    """Replace this process with `argv`, pinned (`Pinning.env`), so signals reach the real
    program (Celery, gunicorn) directly: what `tailguard worker` and `tailguard api` do."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(argv[0], argv, {**os.environ, **(env or {}), **(pin.env() if pin else {})})
