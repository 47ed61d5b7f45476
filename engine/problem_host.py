"""The process that runs a user's problem.py: a child of the judge that imports the folder's problem.py and runs
its functions (make_inputs, reference, baseline, tolerance_for, roofline, template_allows) on request.

A problem folder given by path may hold anything, and its mistakes must not become the judge's: a problem.py
that loops forever at import or in a function, calls ``os._exit``, or crashes the interpreter (a bad ctypes
call) would otherwise hang or end the worker, or the ``kf`` command, that loaded it. In a child of its own, a
call that does not return within its deadline gets the child killed (a thread could not be stopped, and an
endless loop in one kept a core busy for the worker's life), and a child that ends mid-call is reported as
the problem's error, naming the function and how the process ended. The next call starts a fresh child.

Built-in problems (``kernels/``) are part of the project and run in the judge's process; a copy of one in
another folder is a user's folder like any other.

Arguments and results travel pickled over a socket pair (``multiprocessing.connection``): shapes, names,
settings, the random generator and whole input arrays. The generator's state comes back after the call, so
``make_inputs(shape, distribution, rng)`` advances the caller's generator as an in-process call would. The
child's standard output is the judge's standard error: what problem.py prints must not end up in a command's
output (``kf problem check --json`` prints one JSON document there).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

_ROOT = Path(__file__).resolve().parent.parent
"""The project's root: the child imports ``engine`` from it."""

JUDGE_WATCH_S = 1.0
"""How often a child looks whether the judge that started it is still its parent."""

CLOSE_GRACE_S = 2.0
"""How long the judge waits for a child to exit: after killing it, or when it ended on its own."""


class HostEnded(Exception):
    """The child ended, or was killed because a call ran past its deadline (``hung``): ``how`` says which, in
    words."""

    def __init__(self, how: str, *, hung: bool = False, killed: bool = False) -> None:
        super().__init__(how)
        self.how = how
        self.hung = hung
        self.killed = killed
        """Ended by a SIGKILL the judge did not send: the kernel's out-of-memory killer, or an operator."""


@dataclass(frozen=True)
class Raised:
    """What a problem.py function raised in the child, as the judge reports it."""

    shown: str
    """``repr`` of the exception."""
    memory: bool
    """It was a MemoryError: the shape needs more memory than the machine has."""
    at: int | None = None
    """In a mapped call (ProblemHost.map), the index of the arguments it raised on."""


class ProblemHost:
    """One child process with one problem folder's problem.py imported; calls are served one at a time."""

    def __init__(self, folder: Path, module_name: str) -> None:
        self.folder = folder
        self.module_name = module_name
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._connection: Connection | None = None

    def start(self, seconds: float) -> Raised | None:
        """Start the child and wait until it has imported problem.py: None when it did, what the import raised
        otherwise (the caller imports it too and reports that error as it always has). HostEnded when the
        import did not finish within ``seconds`` or ended the child."""
        with self._lock:
            return self._start(seconds)

    def call(self, function: str, args: tuple[Any, ...], seconds: float) -> Any:
        """``function(*args)`` of problem.py in the child: its result, or Raised (returned, not raised: the
        caller words the error). HostEnded when it did not return within ``seconds`` (the child is killed) or
        the child ended during the call; the next call starts a new child."""
        reply = self._request(("call", function, args), seconds)
        if isinstance(reply, Raised):
            return reply
        _, value, states = reply
        # The generator the caller passed advances as if the call had run here.
        for index, state in states.items():
            args[index].bit_generator.state = state
        return value

    def map(self, function: str, calls: list[tuple[Any, ...]], seconds: float) -> list[Any] | Raised:
        """``function`` applied to each argument tuple of ``calls`` in one round trip (template_allows over a
        whole template space: thousands of calls, each a few microseconds of work). The results, or Raised
        with ``at`` the first call that raised; HostEnded as ``call``, with ``seconds`` for all of them."""
        reply = self._request(("map", function, calls), seconds)
        return reply if isinstance(reply, Raised) else list(reply[1])

    def close(self) -> None:
        """Stop the child: its socket is closed, which ends a child waiting for a request; one still busy a
        moment later is killed."""
        with self._lock:
            self._stop()

    def _request(self, message: tuple[Any, ...], seconds: float) -> Any:
        """Send ``message`` (starting the child first if there is none) and wait up to ``seconds`` for the
        reply: the reply, or Raised when the child answered that the call (or the import) raised."""
        with self._lock:
            try:
                reply = self._exchange(message, seconds)
            except HostEnded as ended:
                if not ended.killed:
                    raise
                # Killed from outside (the machine ran short of memory, say): not necessarily problem.py's
                # doing, so a fresh child gets the call once more; a second kill is the problem's error.
                reply = self._exchange(message, seconds)
            if isinstance(reply, Raised):
                return reply
            if reply[0] == "raised":
                return Raised(reply[1], reply[2], reply[3] if len(reply) > 3 else None)
            return reply

    def _exchange(self, message: tuple[Any, ...], seconds: float) -> Any:
        if self._connection is None:
            raised = self._start(seconds)
            if raised is not None:
                self._stop()
                return raised
        assert self._connection is not None
        try:
            self._connection.send(message)
        except OSError:
            raise self._ended() from None
        return self._receive(seconds)

    def _start(self, seconds: float) -> Raised | None:
        self._stop()
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
        # The judge's arrays are small: one BLAS thread, as in the judge's own process (engine/problems.py).
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[name] = "1"
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", "import engine.problem_host as h; h.serve()", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=_stderr_fd(),
                env=env,
                cwd=str(self.folder),
                # Its own session: a terminal's Ctrl-C reaches the judge, which stops it, and a child that
                # spawns processes of its own is killed with them.
                start_new_session=True,
            )
        finally:
            theirs.close()
        self._connection = Connection(ours.detach())
        self._connection.send(("import", str(self.folder / "problem.py"), self.module_name))
        reply = self._receive(seconds)
        return None if reply[0] == "ready" else Raised(reply[1], reply[2])

    def _receive(self, seconds: float) -> Any:
        assert self._connection is not None
        try:
            if not self._connection.poll(seconds):
                self._stop()
                raise HostEnded(f"did not return within {seconds:g} s (KF_PROBLEM_CALL_S)", hung=True)
            return self._connection.recv()
        except (EOFError, OSError):
            raise self._ended() from None

    def _ended(self) -> HostEnded:
        """The child ended on its own: how, from its exit status."""
        process = self._process
        code: int | None = None
        if process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = process.wait(CLOSE_GRACE_S)
        self._stop()
        return HostEnded(_exit_words(code), killed=code == -signal.SIGKILL)

    def _stop(self) -> None:
        connection, process = self._connection, self._process
        self._connection = self._process = None
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.close()
        if process is not None and process.poll() is None:
            # Closing the socket ends a child waiting for a request; one busy in problem.py code is killed,
            # with anything it started in its session.
            try:
                process.wait(0.05)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(CLOSE_GRACE_S)


def _stderr_fd() -> int:
    """The judge's standard error as a file descriptor for the child's standard output (2 when sys.stderr has
    none, as under a test runner's capture)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return 2


def _exit_words(code: int | None) -> str:
    if code is None:
        return "ended the process that ran it, which did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"ended the process that ran it: killed by {name}"
    return f"ended the process that ran it with exit status {code} (os._exit or a crash)"


MAX_HOSTS = 8
"""Most host processes kept at once: a worker that served many folders stops the least recently started one
(it starts again, importing problem.py anew, on its next call)."""

_HOSTS: dict[tuple[str, str], ProblemHost] = {}
_HOSTS_LOCK = threading.Lock()
_EVERY_HOST: weakref.WeakSet[ProblemHost] = weakref.WeakSet()
"""Every host still referenced, in the registry or not (a stopped one restarts on its next call): what
close_all stops."""


def host_for(folder: Path, module_name: str, fingerprint: str) -> tuple[ProblemHost, bool]:
    """The host of ``folder``'s problem.py as it is now (its ``fingerprint``), and whether it is new (not
    started yet). A host of an older version of the folder is stopped: its child imported other code."""
    with _HOSTS_LOCK:
        for key in [k for k in _HOSTS if k[0] == str(folder) and k[1] != fingerprint]:
            _HOSTS.pop(key).close()
        key = (str(folder), fingerprint)
        host = _HOSTS.get(key)
        if host is not None:
            return host, False
        while len(_HOSTS) >= MAX_HOSTS:
            _HOSTS.pop(next(iter(_HOSTS))).close()
        host = _HOSTS[key] = ProblemHost(folder, module_name)
        _EVERY_HOST.add(host)
        return host, True


def forget(host: ProblemHost) -> None:
    """Stop ``host`` and drop it: the next load of its folder starts a new one."""
    with _HOSTS_LOCK:
        for key in [k for k, h in _HOSTS.items() if h is host]:
            del _HOSTS[key]
    host.close()


@atexit.register
def close_all() -> None:
    """Stop every host (at exit: no child outlives the judge)."""
    with _HOSTS_LOCK:
        hosts = list(_EVERY_HOST)
        _HOSTS.clear()
    for host in hosts:
        host.close()


def serve() -> None:
    """The child's loop: import problem.py when told, then run calls until the socket closes."""
    import importlib.util

    connection = Connection(int(sys.argv[1]))
    threading.Thread(target=_end_with_the_judge, args=(os.getppid(),), name="kf-judge-watch", daemon=True).start()
    module: Any = None
    while True:
        try:
            request = connection.recv()
        except (EOFError, OSError):
            return
        if request[0] == "import":
            _, path, module_name = request
            spec = importlib.util.spec_from_file_location(module_name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException as error:  # reported, not acted on: the judge words it
                _reply(connection, ("raised", repr(error), isinstance(error, MemoryError)))
                continue
            _reply(connection, ("ready",))
            continue
        if request[0] == "map":
            _reply(connection, _mapped(module, request[1], request[2]))
            continue
        _, function, args = request
        try:
            value = getattr(module, function)(*args)
        except BaseException as error:  # reported, not acted on: the judge words it
            _reply(connection, ("raised", repr(error), isinstance(error, MemoryError)))
            continue
        states = {i: a.bit_generator.state for i, a in enumerate(args) if isinstance(a, np.random.Generator)}
        _reply(connection, ("ok", value, states))


def _end_with_the_judge(judge: int) -> None:
    """Exit once the judge is gone (this process was handed to another parent): a judge killed without running
    its exit handlers must not leave a problem.py looping here for ever. A closed socket ends an idle child;
    this ends a busy one."""
    while os.getppid() == judge:
        time.sleep(JUDGE_WATCH_S)
    os._exit(1)


def _mapped(module: Any, function: str, calls: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    call = getattr(module, function)
    results = []
    for index, args in enumerate(calls):
        try:
            results.append(call(*args))
        except BaseException as error:  # reported, not acted on: the judge words it
            return ("raised", repr(error), isinstance(error, MemoryError), index)
    return ("ok", results)


def _reply(connection: Connection, message: tuple[Any, ...]) -> None:
    try:
        connection.send(message)
    except (EOFError, OSError):
        raise SystemExit(0) from None
    except Exception as error:  # a result pickle cannot carry (a lambda, an open file)
        connection.send(("raised", f"a result that cannot be passed back ({error!r})", False))
