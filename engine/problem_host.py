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

The judge never imports a user's problem.py itself: the child sends the module's declarations (NAME, PARAMS,
the shapes, which functions it defines, ...) once it has imported it, and the judge builds the Problem from
those (``HostedModule``). An import that starts a thread, installs a signal handler, changes the working
directory or patches numpy does so in the child, never in the process that compares a kernel's outputs.

Arguments and results travel pickled over a socket pair, each message its length then its pickle: shapes,
names, settings, the random generator and whole input arrays. The judge sends and reads them with the call's
deadline over the whole message (a child that sends half a reply, or stops reading its requests, cannot hang
the judge), refuses a reply longer than ``KF_PROBLEM_REPLY_MB`` before reading it, and numbers its requests: a
reply that answers another one is the problem's error. The generator's state comes back after the call, so
``make_inputs(shape, distribution, rng)`` advances the caller's generator as an in-process call would. What
comes back is unpickled with an allow-list (``judge_loads``): containers, numbers, strings and numpy arrays,
never an arbitrary class, since unpickling one can run any code its ``__reduce__`` names in the judge. The
child's standard output is the judge's standard error: what problem.py prints must not end up in a command's
output (``kf problem check --json`` prints one JSON document there).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import logging
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.config import problem_reply_bytes

_ROOT = Path(__file__).resolve().parent.parent
"""The project's root: the child imports ``engine`` from it."""

JUDGE_WATCH_S = 1.0
"""How often a child looks whether the judge that started it is still its parent."""

CLOSE_GRACE_S = 2.0
"""How long the judge waits for a child to exit: after killing it, or when it ended on its own."""


_LENGTH = struct.Struct("!Q")
"""A message on the socket is its pickle's length in these 8 bytes, then the pickle."""

_CHUNK = 1 << 20
"""Bytes read at a time: a reply's memory grows with what the child sent, never with the length it claimed."""


class HostEnded(Exception):
    """The child ended, or was stopped because a call ran past its deadline (``hung``) or its reply broke the
    exchange: ``how`` says which, in words."""

    def __init__(self, how: str, *, hung: bool = False, killed: bool = False, fix: str | None = None) -> None:
        super().__init__(how)
        self.how = how
        self.hung = hung
        self.killed = killed
        """Ended by a SIGKILL the judge did not send: the kernel's out-of-memory killer, or an operator."""
        self.fix = fix
        """What to change, when it is not the usual (an endless loop, a wait or an exit in problem.py)."""


@dataclass(frozen=True)
class Raised:
    """What a problem.py function raised in the child, or returned that the judge refused, as the judge
    reports it."""

    shown: str
    """``repr`` of the exception; with ``refused``, the class the result held."""
    memory: bool
    """It was a MemoryError: the shape needs more memory than the machine has."""
    at: int | None = None
    """In a mapped call (ProblemHost.map), the index of the arguments it raised on."""
    refused: bool = False
    """The call returned, but its result holds an object of a class the judge does not unpickle."""
    changed: bool = False
    """The call returned, but changed the input arrays named in ``shown`` in place."""

    def words(self, function: str) -> str:
        """What happened, with the fix, after the call's description: "raised ...; fix ...", or "returned ..."."""
        if self.changed:
            return (
                f"changed its input {self.shown} in place; {function}() must leave its inputs as it got them "
                "(compute into new arrays, or copy first): the judge gives the same inputs to kernels and references"
            )
        if self.refused:
            return (
                f"returned an object of class {self.shown}, which the judge does not accept (unpickling it could run "
                "code in the judge's process); return numpy arrays, numbers, strings, lists, tuples or dicts"
            )
        return f"raised {self.shown}; fix {function}() in problem.py"


_SAFE_GLOBALS = frozenset(
    {
        # Not bytearray: bytearray(10**12) would allocate in the judge. (A range is lazy: TEMPLATE_PARAMS may
        # hold one.)
        *(("builtins", n) for n in ("complex", "set", "frozenset", "range")),
        ("collections", "OrderedDict"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        # numpy 2 pickles arrays and scalars through numpy._core, numpy 1 through numpy.core.
        *((f"numpy.{core}.multiarray", n) for core in ("_core", "core") for n in ("_reconstruct", "scalar")),
        *((f"numpy.{core}.numeric", "_frombuffer") for core in ("_core", "core")),
    }
)
"""The only globals a pickle from the child may name: the containers pickle has no opcode for, and what numpy
arrays, dtypes and scalars are rebuilt with."""


class Refused(pickle.UnpicklingError):
    """A pickle from the child named a global outside the allow-list; ``name`` is ``module.qualname``."""

    def __init__(self, name: str) -> None:
        super().__init__(f"refused to unpickle {name}")
        self.name = name


class _JudgeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _SAFE_GLOBALS:
            raise Refused(f"{module}.{name}")
        return super().find_class(module, name)


def judge_loads(data: bytes) -> Any:
    """Unpickle what the child sent with the allow-list: Refused when it names any other class or function."""
    return _JudgeUnpickler(io.BytesIO(data)).load()


class HostedFunction:
    """A function problem.py defines: it runs in the host process, through Problem, never here."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"problem.py's {self.name}() runs in its host process; call it through Problem")

    def __repr__(self) -> str:
        return f"<function {self.name} of problem.py, in its host process>"


@dataclass(frozen=True)
class Unreadable:
    """A declaration of problem.py the judge cannot receive: one pickle cannot carry, or whose class is not
    on the allow-list. The load's checks name it with its type."""

    type_name: str

    def __repr__(self) -> str:
        return f"<a {self.type_name} the judge cannot receive>"


class HostedModule:
    """A user's problem.py as its host process imported it: its declarations as values, its functions as
    HostedFunction. Attributes read as a module's do (``getattr(module, "FAMILY", ...)``, ``__doc__``)."""

    def __init__(self, folder: Path, values: dict[str, Any]) -> None:
        self.__dict__.update(values)
        doc = values.get("__doc__")
        self.__doc__ = doc if isinstance(doc, str) else None  # absent: not the class's own docstring
        self.__file__ = str(folder / "problem.py")

    def __getattr__(self, name: str) -> Any:  # only for names problem.py does not define
        raise AttributeError(f"problem.py defines no {name}")


class ProblemHost:
    """One child process with one problem folder's problem.py imported; calls are served one at a time."""

    def __init__(self, folder: Path, module_name: str) -> None:
        self.folder = folder
        self.module_name = module_name
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._requests = 0
        """Requests sent so far: each carries its number, and its reply must carry the same."""
        self.declarations: dict[str, Any] | None = None
        """problem.py's top-level names as its first import left them (set by ``start``): values the judge
        could receive, HostedFunction for functions, Unreadable for the rest."""

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
        try:
            _, value, states = reply
            # The generator the caller passed advances as if the call had run here.
            for index, state in states.items():
                args[index].bit_generator.state = state
        except Exception as error:  # problem.py can rewrite the child's side of the exchange too
            return Raised(f"an unreadable reply ({error!r})", False)
        return value

    def map(self, function: str, calls: list[tuple[Any, ...]], seconds: float) -> list[Any] | Raised:
        """``function`` applied to each argument tuple of ``calls`` in one round trip (template_allows over a
        whole template space: thousands of calls, each a few microseconds of work). The results, or Raised
        with ``at`` the first call that raised; HostEnded as ``call``, with ``seconds`` for all of them."""
        reply = self._request(("map", function, calls), seconds)
        if isinstance(reply, Raised):
            return reply
        results = reply[1]
        if not isinstance(results, list) or len(results) != len(calls):
            return Raised("an unreadable reply (not one answer per call)", False)
        return results

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
            return _parsed(reply)

    def _exchange(self, message: tuple[Any, ...], seconds: float) -> Any:
        if self._socket is None:
            raised = self._start(seconds)
            if raised is not None:
                self._stop()
                return raised
        return self._ask(message, time.monotonic() + seconds, seconds)

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
        self._socket = ours
        message = ("import", str(self.folder / "problem.py"), self.module_name)
        reply = _parsed(self._ask(message, time.monotonic() + seconds, seconds))
        if isinstance(reply, Raised):
            return reply
        if self.declarations is None:
            # The first import's declarations stand for the host's life: a restart re-imports the same file
            # (the folder's fingerprint is part of the host's key), and the Problem was built from them.
            try:
                self.declarations = _received_declarations(reply[1])
            except Exception as error:  # problem.py can rewrite the child's side of the exchange too
                return Raised(f"an unreadable list of declarations ({error!r})", False)
        return None

    def _ask(self, message: tuple[Any, ...], deadline: float, seconds: float) -> Any:
        """Send ``message`` numbered and read the reply, both by ``deadline``: the reply's body, unpickled with
        the allow-list (Raised when it was refused or unreadable). HostEnded when the child ended, did not
        answer in time (it is stopped), or sent a reply too long for the judge."""
        assert self._socket is not None
        self._requests += 1
        number = self._requests
        limit = problem_reply_bytes()
        try:
            _send(self._socket, (number, message), deadline)
            _wait_telling(self._socket, deadline, seconds, _what(message, self.folder / "problem.py"))
            data = _received(self._socket, deadline, limit)
        except TimeoutError:
            self._stop()
            raise HostEnded(f"did not return within {seconds:g} s (KF_PROBLEM_CALL_S)", hung=True) from None
        except _TooLong as too_long:
            self._stop()
            raise HostEnded(
                f"sent a reply of {_size(too_long.size)}, more than the judge accepts ({_size(limit)})",
                fix="return smaller arrays (a smaller shape), keep module-level data small, or raise "
                "KF_PROBLEM_REPLY_MB",
            ) from None
        except (EOFError, OSError):
            raise self._ended() from None
        try:
            sent = judge_loads(data)
        except Refused as refused:
            return Raised(refused.name, False, refused=True)
        except Exception as error:  # a pickle the child's own pickling cannot have made: say so, do not crash
            return Raised(f"an unreadable reply ({error!r})", False)
        if not (isinstance(sent, tuple) and len(sent) == 2 and sent[0] == number):
            # problem.py wrote to the socket itself: whatever comes next may answer another request.
            self._stop()
            return Raised("an unreadable reply (not the answer to the request it was sent)", False)
        return sent[1]

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
        connection, process = self._socket, self._process
        self._socket, self._process = None, None
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


def _parsed(reply: Any) -> Any:
    """A reply as sent by serve(): a tuple whose first item says what it is. A "raised" one becomes Raised, and
    so does anything else than a well-formed reply (problem.py runs in the child and can rewrite serve's side
    of the exchange; the judge must not fail on what it sends)."""
    if isinstance(reply, Raised):
        return reply
    if not isinstance(reply, tuple) or not reply:
        return Raised(f"an unreadable reply ({type(reply).__name__})", False)
    kind = reply[0]
    if kind == "raised" and len(reply) in (3, 4) and isinstance(reply[1], str):
        return Raised(reply[1], bool(reply[2]), reply[3] if len(reply) == 4 and isinstance(reply[3], int) else None)
    if (kind == "ok" and len(reply) in (2, 3)) or (kind == "ready" and len(reply) == 2):
        return reply
    if (
        kind == "changed"
        and len(reply) == 2
        and isinstance(reply[1], list)
        and all(isinstance(n, str) for n in reply[1])
    ):
        return Raised(", ".join(repr(n[:80]) for n in reply[1][:8]), False, changed=True)
    return Raised(f"an unreadable reply ({str(kind)[:40]!r})", False)


def _stderr_fd() -> int:
    """The judge's standard error as a file descriptor for the child's standard output (2 when sys.stderr has
    none, as under a test runner's capture)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return 2


def _size(count: int) -> str:
    """A number of bytes in words: MB from one MB up."""
    return f"{count / 1e6:,.0f} MB" if count >= 1e6 else f"{count:,} bytes"


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

    from engine.harness.seccomp import SeccompUnavailable, fence_off_other_processes

    connection = socket.socket(fileno=int(sys.argv[1]))
    # Before problem.py runs, and before the watch thread starts (the filter covers the threads there are).
    with contextlib.suppress(SeccompUnavailable):  # without seccomp, as before: the user's own code
        fence_off_other_processes()
    threading.Thread(target=_end_with_the_judge, args=(os.getppid(),), name="kf-judge-watch", daemon=True).start()
    module: Any = None
    while True:
        try:
            number, request = pickle.loads(_received(connection, None, None))
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
                _reply(connection, number, ("raised", repr(error), isinstance(error, MemoryError)))
                continue
            _reply(connection, number, ("ready", _declarations(module)))
            continue
        if request[0] == "map":
            _reply(connection, number, _mapped(module, request[1], request[2]))
            continue
        _, function, args = request
        # The functions given the inputs must leave them as they got them: here they hold copies, so only this
        # side can see a change (a baseline that scales x in place corrupts every later call's inputs).
        given = args[0] if function in INPUT_FUNCTIONS and args and isinstance(args[0], dict) else {}
        before = {name: array.copy() for name, array in given.items() if isinstance(array, np.ndarray)}
        try:
            value = getattr(module, function)(*args)
        except BaseException as error:  # reported, not acted on: the judge words it
            _reply(connection, number, ("raised", repr(error), isinstance(error, MemoryError)))
            continue
        changed = [name for name, array in before.items() if not same_bits(array, given.get(name))]
        if changed:
            _reply(connection, number, ("changed", changed))
            continue
        states = {i: a.bit_generator.state for i, a in enumerate(args) if isinstance(a, np.random.Generator)}
        _reply(connection, number, ("ok", value, states))


def _declarations(module: Any) -> dict[str, tuple[Any, ...]]:
    """The module's top-level names for the judge, each on its own: ("callable",) for a function or class,
    ("data", pickle) for a value, ("unpicklable", type name) for one pickle cannot carry. Imported modules and
    private names (but ``__doc__``) are left out."""
    import types

    out: dict[str, tuple[Any, ...]] = {}
    for name, value in vars(module).items():
        if (name.startswith("_") and name != "__doc__") or isinstance(value, types.ModuleType):
            continue
        if callable(value):
            out[name] = ("callable",)
            continue
        try:
            out[name] = ("data", pickle.dumps(value))
        except Exception:
            out[name] = ("unpicklable", type(value).__qualname__)
    return out


def _received_declarations(sent: Any) -> dict[str, Any]:
    """The judge's side of _declarations: each value unpickled with the allow-list on its own, so one the judge
    refuses is Unreadable (and named by the load's checks) rather than failing them all."""
    values: dict[str, Any] = {}
    for name, entry in dict(sent).items():
        if not isinstance(name, str) or not name.isidentifier() or (name.startswith("_") and name != "__doc__"):
            continue  # as _declarations leaves them out, whatever a rewritten child sends
        if entry[0] == "callable":
            values[name] = HostedFunction(name)
        elif entry[0] == "data":
            try:
                values[name] = judge_loads(entry[1])
            except Refused as refused:
                values[name] = Unreadable(refused.name)
            except Exception:
                values[name] = Unreadable("value")
        else:
            values[name] = Unreadable(str(entry[1]))
    return values


def _end_with_the_judge(judge: int) -> None:
    """Exit once the judge is gone (this process was handed to another parent): a judge killed without running
    its exit handlers must not leave a problem.py looping here for ever. A closed socket ends an idle child;
    this ends a busy one."""
    while os.getppid() == judge:
        time.sleep(JUDGE_WATCH_S)
    os._exit(1)


INPUT_FUNCTIONS = ("reference", "baseline")
"""problem.py's functions that take the inputs first, and must not change them."""


def same_bits(before: np.ndarray, after: Any) -> bool:
    """Whether ``after`` is still an array of ``before``'s dtype and shape holding the same bits (NaN included)."""
    if not isinstance(after, np.ndarray) or after.dtype != before.dtype or after.shape != before.shape:
        return False
    return bool(
        np.array_equal(before.reshape(-1).view(np.uint8), np.ascontiguousarray(after).reshape(-1).view(np.uint8))
    )


def _mapped(module: Any, function: str, calls: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    call = getattr(module, function)
    results = []
    for index, args in enumerate(calls):
        try:
            results.append(call(*args))
        except BaseException as error:  # reported, not acted on: the judge words it
            return ("raised", repr(error), isinstance(error, MemoryError), index)
    return ("ok", results)


def _reply(connection: socket.socket, number: int, message: tuple[Any, ...]) -> None:
    try:
        _send(connection, (number, message), None)
    except (EOFError, OSError):
        raise SystemExit(0) from None
    except Exception as error:  # a result pickle cannot carry (a lambda, an open file)
        _send(connection, (number, ("raised", f"a result that cannot be passed back ({error!r})", False)), None)


class _TooLong(Exception):
    """A message longer than the reader accepts: ``size`` bytes."""

    def __init__(self, size: int) -> None:
        super().__init__(f"a message of {size} bytes")
        self.size = size


def _send(connection: socket.socket, message: Any, deadline: float | None) -> None:
    """``message`` pickled, after its length, by ``deadline`` (TimeoutError past it; None waits for ever).
    Pickled whole first: one pickle cannot carry is an exception before a byte is sent."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    _set_deadline(connection, deadline)
    connection.sendall(_LENGTH.pack(len(data)))
    view = memoryview(data)
    while view:
        # sendall's timeout is per call; the deadline is for the whole message.
        _set_deadline(connection, deadline)
        sent = connection.send(view[:_CHUNK])
        view = view[sent:]


# A call of problem.py that runs this long is said on the log (stderr for a `kf` command), and again every
# SLOW_CALL_REPEAT_S: its deadline (KF_PROBLEM_CALL_S, five minutes by default) is long, and a hung import or
# make_inputs used to keep `kf evaluate` silent until it passed.
SLOW_CALL_NOTICE_S = 10.0
SLOW_CALL_REPEAT_S = 30.0
_log = logging.getLogger("kf.problem")


def _what(message: tuple[Any, ...], path: Path) -> str:
    """The request ``message`` to the host of ``path`` in words: "PATH make_inputs()", "the import of PATH"."""
    if message[0] == "call":
        return f"{path} {message[1]}()"
    if message[0] == "map":
        return f"{path} {message[1]}() over {len(message[2])} settings"
    return f"the {message[0]} of {path}"


def _wait_telling(connection: socket.socket, deadline: float, seconds: float, what: str) -> None:
    """Wait until a reply can be read from ``connection`` or ``deadline`` passes, saying on the log, after
    SLOW_CALL_NOTICE_S and every SLOW_CALL_REPEAT_S after, how long ``what`` has run and when it is given up."""
    started = time.monotonic()
    notice = started + SLOW_CALL_NOTICE_S
    while True:
        now = time.monotonic()
        if now >= deadline or select.select([connection], [], [], max(0.0, min(deadline, notice) - now))[0]:
            return
        if time.monotonic() >= notice:
            _log.warning(
                "still waiting for %s: it has run %.0f s and is given up after %g s (KF_PROBLEM_CALL_S); look for "
                "an endless loop or a wait in problem.py, or make the shape smaller",
                what,
                time.monotonic() - started,
                seconds,
            )
            notice += SLOW_CALL_REPEAT_S


def _received(connection: socket.socket, deadline: float | None, limit: int | None) -> bytes:
    """The next message's bytes, all read by ``deadline`` (TimeoutError past it); _TooLong, before its body
    is read, when it is longer than ``limit``; EOFError when the other side closed the socket."""
    (size,) = _LENGTH.unpack(_exactly(connection, _LENGTH.size, deadline))
    if limit is not None and size > limit:
        raise _TooLong(size)
    return _exactly(connection, size, deadline)


def _exactly(connection: socket.socket, size: int, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    left = size
    while left:
        _set_deadline(connection, deadline)
        chunk = connection.recv(min(left, _CHUNK))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _set_deadline(connection: socket.socket, deadline: float | None) -> None:
    if deadline is None:
        connection.settimeout(None)
        return
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    connection.settimeout(left)
