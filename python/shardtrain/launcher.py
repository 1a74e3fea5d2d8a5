"""shardtrain-run: starts a local shardtrain job and runs a training command.

    shardtrain-run [--shards N] [--workers N] [--mode sync|async]
                   [--build-dir DIR] [--logs DIR] [--stop-timeout S]
                   [ps-server flags ...] -- COMMAND [ARGS ...]

Starts N ps-server shards from BUILD_DIR/bin on 127.0.0.1 (each binds a free
port and reports it through a port file; the launcher waits, bounded, until
every shard serves), then runs --workers copies of COMMAND with

    SHARDTRAIN_SERVERS      the shards' addresses, comma-separated
    SHARDTRAIN_WORKER       0 .. workers-1
    SHARDTRAIN_NUM_WORKERS  --workers
    SHARDTRAIN_MODE         --mode
    SHARDTRAIN_METRICS_PORT 0 (each worker serves metrics on a free port)
    SHARDTRAIN_MAX_PARTITION_ELEMENTS  when --max_partition_elements is
                            among the ps-server flags: its value
    PYTHONPATH              BUILD_DIR/python first, so `import shardtrain` works
    PYTHONUNBUFFERED        1, so output arrives line by line
    OMP_NUM_THREADS         cpus / workers (at least 1) unless already set

(see shardtrain/env.py for the optional variables, which pass through from
the launcher's own environment). Every line a worker prints is forwarded with
a "[worker I] " prefix (stdout to stdout, stderr to stderr); the shards'
lines go to stderr with "[shard S] ". With --logs DIR each process's output
is also written, unprefixed, to DIR/worker-I.log and DIR/shard-S.log.

Arguments before "--" that are not the launcher's own are ps-server flags,
passed to every shard (e.g. --lr 0.05 --optimizer momentum --max_staleness 4).
When none of them sets --optimizer or --lr the shards get --optimizer=adam
--lr=0.001 (the defaults of run-local.sh); otherwise ps-server's own defaults
fill in what is not given.

The launcher exits with the code of the first worker that fails (128 + N
for one killed by signal N) after stopping the others, 0 when every worker
succeeds, 1 when a shard dies or does not start (with its last lines), 2 on
a usage error and 128 + N when stopped by signal N (SIGINT, SIGTERM). On
every exit it stops what it started, by PID, workers first: SIGTERM, then
SIGKILL after --stop-timeout seconds. Each child runs in its own process
group, which gets the signals (so a worker's own subprocesses stop too, and
a Ctrl-C reaches only the launcher, which stops the children in order), and
gets SIGKILL if the launcher itself is killed (Linux parent-death signal).

Uses the standard library only: it runs before anything is importable.
"""

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, List, Optional, Sequence

USAGE = __doc__.split("\n\n")[1]
# ps-server flags the launcher sets itself; passing them is a usage error.
_OWN_SERVER_FLAGS = ("shard_index", "num_shards", "num_workers", "mode",
                     "port_file", "listen")
_DEFAULT_SERVER_FLAGS = ("--optimizer=adam", "--lr=0.001")
_SHARD_START_TIMEOUT_S = 30.0
_POLL_S = 0.05


class UsageError(Exception):
    pass


class Options:
    """The parsed command line."""

    def __init__(self):
        self.shards = 1
        self.workers = 1
        self.mode = "async"
        self.build_dir = ""
        self.logs = ""
        self.stop_timeout = 10.0
        self.server_flags: List[str] = []
        self.command: List[str] = []


def _flag_name(arg: str) -> str:
    return arg.lstrip("-").split("=", 1)[0].replace("-", "_")


def parse_args(argv: Sequence[str]) -> Options:
    """Splits argv into the launcher's options, ps-server flags and the
    command. Raises UsageError."""
    options = Options()
    if "--" not in argv:
        raise UsageError("no command: put it after '--'")
    split = list(argv).index("--")
    own, options.command = list(argv[:split]), list(argv[split + 1:])
    if not options.command:
        raise UsageError("no command after '--'")
    i = 0
    while i < len(own):
        arg = own[i]
        name, has_value, value = arg.partition("=")
        if name in ("--shards", "--workers", "--mode", "--build-dir", "--logs",
                    "--stop-timeout"):
            if not has_value:
                if i + 1 >= len(own):
                    raise UsageError(f"{name} needs a value")
                value = own[i + 1]
                i += 1
            if name in ("--shards", "--workers"):
                if not value.isdigit() or int(value) < 1:
                    raise UsageError(f"{name} must be a positive integer, not {value!r}")
                setattr(options, name[2:], int(value))
            elif name == "--mode":
                if value not in ("sync", "async"):
                    raise UsageError(f"--mode must be sync or async, not {value!r}")
                options.mode = value
            elif name == "--stop-timeout":
                try:
                    options.stop_timeout = float(value)
                except ValueError:
                    raise UsageError(f"--stop-timeout must be a number, not {value!r}") from None
                if not options.stop_timeout > 0:
                    raise UsageError("--stop-timeout must be > 0")
            elif name == "--build-dir":
                options.build_dir = value
            else:
                options.logs = value
        elif arg.startswith("-") and len(arg) > 1:
            if _flag_name(arg) in _OWN_SERVER_FLAGS:
                raise UsageError(
                    f"{arg}: the launcher sets --{_flag_name(arg)} itself "
                    "(use --shards, --workers, --mode)")
            options.server_flags.append(arg)
        else:
            # A value of the previous ps-server flag ("--lr 0.05").
            if not options.server_flags:
                raise UsageError(f"unexpected argument {arg!r} before '--'")
            options.server_flags.append(arg)
        i += 1
    given = {_flag_name(a) for a in options.server_flags if a.startswith("-")}
    if not given & {"optimizer", "lr"}:
        options.server_flags = list(_DEFAULT_SERVER_FLAGS) + options.server_flags
    return options


def _flag_value(flags: Sequence[str], name: str) -> Optional[str]:
    """The last value of ps-server flag `name` in `flags` (--name=V or
    --name V), or None."""
    value = None
    for i, arg in enumerate(flags):
        if arg.startswith("-") and _flag_name(arg) == name:
            if "=" in arg:
                value = arg.split("=", 1)[1]
            elif i + 1 < len(flags):
                value = flags[i + 1]
    return value


def default_build_dir() -> str:
    """$BUILD_DIR, else the build/ directory beside python/ and scripts/."""
    if os.environ.get("BUILD_DIR"):
        return os.environ["BUILD_DIR"]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(root, "build")


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _parent_death_signal():
    """A preexec_fn: the child gets SIGKILL when the launcher dies (Linux),
    and runs in its own process group."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        prctl = None
    parent = os.getpid()

    def setup():
        os.setpgid(0, 0)
        if prctl is not None:
            prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the launcher died before prctl
            os._exit(1)

    return setup


class Child:
    """One process the launcher started, and the threads forwarding its
    output. Not thread-safe: the launcher's main thread owns it."""

    def __init__(self, name: str, argv: Sequence[str], env: dict,
                 stdout: Optional[IO], stderr: IO, log_path: str, lock: threading.RLock):
        self.name = name
        self.log = open(log_path, "a", encoding="utf-8", errors="replace") if log_path else None
        self.process = subprocess.Popen(
            list(argv), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, preexec_fn=_parent_death_signal(), close_fds=True)
        self.pid = self.process.pid
        self.tail: List[str] = []  # the last lines, for error messages
        self._threads = [
            threading.Thread(target=self._forward, args=(self.process.stdout, stdout, lock),
                             daemon=True, name=f"{name} stdout"),
            threading.Thread(target=self._forward, args=(self.process.stderr, stderr, lock),
                             daemon=True, name=f"{name} stderr"),
        ]
        for thread in self._threads:
            thread.start()

    def _forward(self, source, sink: Optional[IO], lock: threading.RLock):
        prefix = f"[{self.name}] "
        for raw in iter(source.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            with lock:
                self.tail = (self.tail + [line])[-20:]
                if self.log is not None:
                    self.log.write(line + "\n")
                    self.log.flush()
                if sink is not None:
                    try:
                        sink.write(prefix + line + "\n")
                        sink.flush()
                    except (OSError, ValueError):
                        pass  # our own output is gone; keep draining the pipe
        source.close()

    def poll(self) -> Optional[int]:
        return self.process.poll()

    def terminate(self):
        self._signal(signal.SIGTERM)

    def kill(self):
        self._signal(signal.SIGKILL)

    def _signal(self, signum: int):
        """Signals the child's process group (the child and what it started,
        e.g. data loader processes), while the child itself still runs."""
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            pass
        except PermissionError:  # not a group leader after all
            os.kill(self.pid, signum)

    def finish_output(self, timeout: float):
        """Waits (bounded) for the forwarding threads to drain the pipes."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self.log is not None and not any(t.is_alive() for t in self._threads):
            self.log.close()


class Launcher:
    """Runs one job. Not thread-safe: run() is called once, from the main
    thread (it installs signal handlers)."""

    def __init__(self, options: Options, stdout: IO = sys.stdout, stderr: IO = sys.stderr):
        self.options = options
        self.stdout = stdout
        self.stderr = stderr
        # Serialises writes to stdout, stderr and the logs.
        self.lock = threading.RLock()
        # The first SIGINT/SIGTERM received, or None.
        self.stop_signal: Optional[int] = None
        self.shards: List[Child] = []
        self.workers: List[Child] = []
        self.build_dir = os.path.abspath(options.build_dir or default_build_dir())

    def say(self, message: str):
        with self.lock:
            self.stderr.write(f"[shardtrain-run] {message}\n")
            self.stderr.flush()

    def _log_path(self, name: str) -> str:
        if not self.options.logs:
            return ""
        return os.path.join(self.options.logs, name.replace(" ", "-") + ".log")

    def run(self) -> int:
        """Runs the job and stops everything it started; returns the exit
        code (see the module comment)."""
        previous = {}

        def on_signal(signum, frame):
            # Checked by the polling loops: nothing is interrupted halfway.
            if self.stop_signal is None:
                self.stop_signal = signum

        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, on_signal)
        try:
            code = self._run()
            if self.stop_signal is not None:
                self.say(f"{signal.Signals(self.stop_signal).name}: stopping the job")
                code = 128 + self.stop_signal
            return code
        finally:
            self.stop_all()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _run(self) -> int:
        server = os.path.join(self.build_dir, "bin", "ps-server")
        if not os.access(server, os.X_OK):
            self.say(f"{server} not found: build it first "
                     f"(cmake --build {self.build_dir} --target ps-server), "
                     "or point --build-dir (or $BUILD_DIR) at a build")
            return 2
        if self.options.logs:
            os.makedirs(self.options.logs, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="shardtrain-run.") as run_dir:
            servers = self._start_shards(server, run_dir)
            if servers is None:
                return 1
            if self.stop_signal is not None:
                return 0
            failed = self._start_workers(servers)
            if failed is not None:
                return failed
            return self._wait()

    def _start_shards(self, server: str, run_dir: str) -> Optional[List[str]]:
        o = self.options
        port_files = []
        for s in range(o.shards):
            port_file = os.path.join(run_dir, f"shard{s}.port")
            port_files.append(port_file)
            argv = [server, f"--shard_index={s}", f"--num_shards={o.shards}",
                    f"--num_workers={o.workers}", f"--mode={o.mode}",
                    "--listen=127.0.0.1:0", f"--port_file={port_file}"] + o.server_flags
            self.shards.append(Child(f"shard {s}", argv, dict(os.environ), None, self.stderr,
                                     self._log_path(f"shard {s}"), self.lock))
        servers = []
        deadline = time.monotonic() + _SHARD_START_TIMEOUT_S
        for s, port_file in enumerate(port_files):
            while True:
                text = _read(port_file)
                if text:
                    break
                code = self.shards[s].poll()
                if code is not None:
                    self._report_dead_shard(s, code, "did not start")
                    return None
                if self.stop_signal is not None:
                    return []
                if time.monotonic() > deadline:
                    self._report(f"shard {s} did not start within "
                                 f"{_SHARD_START_TIMEOUT_S:.0f} s", self.shards[s])
                    return None
                time.sleep(_POLL_S)
            port = text.split()[0]
            servers.append(f"127.0.0.1:{port}")
            self.say(f"shard {s} on 127.0.0.1:{port} (metrics :{text.split()[1]}, "
                     f"pid {self.shards[s].pid})")
        return servers

    def _start_workers(self, servers: List[str]) -> Optional[int]:
        """Starts the workers; an exit code if one cannot be started."""
        o = self.options
        python_dir = os.path.join(self.build_dir, "python")
        if not os.path.isdir(os.path.join(python_dir, "shardtrain")):
            self.say(f"warning: {python_dir}/shardtrain is missing (build the python "
                     "extension): `import shardtrain` will fail in the workers")
        flags = " ".join(o.server_flags)
        self.say(f"{o.workers} workers, {o.shards} shards, {o.mode} mode, ps-server {flags}")
        threads = max(1, (os.cpu_count() or 1) // o.workers)
        for w in range(o.workers):
            env = dict(os.environ)
            env.update({
                "SHARDTRAIN_SERVERS": ",".join(servers),
                "SHARDTRAIN_WORKER": str(w),
                "SHARDTRAIN_NUM_WORKERS": str(o.workers),
                "SHARDTRAIN_MODE": o.mode,
                "PYTHONUNBUFFERED": "1",
            })
            env.setdefault("SHARDTRAIN_METRICS_PORT", "0")
            partition = _flag_value(o.server_flags, "max_partition_elements")
            if partition is not None:
                env["SHARDTRAIN_MAX_PARTITION_ELEMENTS"] = partition
            env.setdefault("OMP_NUM_THREADS", str(threads))
            path = env.get("PYTHONPATH", "")
            env["PYTHONPATH"] = python_dir + (os.pathsep + path if path else "")
            try:
                self.workers.append(Child(f"worker {w}", o.command, env, self.stdout,
                                          self.stderr, self._log_path(f"worker {w}"),
                                          self.lock))
            except OSError as e:
                self.say(f"cannot start {o.command[0]!r}: {e}")
                return 127
            self.say(f"worker {w}: pid {self.workers[-1].pid}")
        return None

    def _wait(self) -> int:
        running = list(range(len(self.workers)))
        while running and self.stop_signal is None:
            for s, shard in enumerate(self.shards):
                code = shard.poll()
                if code is not None:
                    self._report_dead_shard(s, code, "died")
                    return 1
            for w in list(running):
                code = self.workers[w].poll()
                if code is None:
                    continue
                running.remove(w)
                if code != 0:
                    self.workers[w].finish_output(1.0)
                    self.say(f"worker {w} failed ({_describe_exit(code)}); stopping the job")
                    return _exit_code(code)
            time.sleep(_POLL_S)
        if running:
            return 0  # stopped by a signal; run() says so
        self.say(f"all {len(self.workers)} workers finished")
        return 0

    def _report_dead_shard(self, s: int, code: int, what: str):
        self.shards[s].finish_output(1.0)
        self._report(f"shard {s} {what} ({_describe_exit(code)}); stopping the job",
                     self.shards[s], show_tail=self.options.logs != "")

    def _report(self, message: str, child: Child, show_tail: bool = True):
        self.say(message)
        if show_tail and child.tail:
            self.say(f"last lines of {child.name}:")
            with self.lock:
                for line in child.tail:
                    self.stderr.write(f"  {line}\n")
                self.stderr.flush()

    def stop_all(self):
        """SIGTERM to every child still running (workers first, then the
        shards they talk to), SIGKILL to any left after --stop-timeout."""
        children = self.workers + self.shards
        for group in (self.workers, self.shards):
            for child in group:
                child.terminate()
            self._wait_exit(group, self.options.stop_timeout)
        for child in children:
            if child.poll() is None:
                self.say(f"{child.name} (pid {child.pid}) ignored SIGTERM; killing it")
                child.kill()
        for child in children:
            try:
                child.process.wait(timeout=self.options.stop_timeout)
            except subprocess.TimeoutExpired:
                self.say(f"{child.name} (pid {child.pid}) did not exit after SIGKILL")
        for child in children:
            child.finish_output(1.0)

    @staticmethod
    def _wait_exit(children: List[Child], timeout: float):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(c.poll() is None for c in children):
            time.sleep(_POLL_S)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return ""
    # The shard writes the file atomically: a full line or nothing.
    return text if text.endswith("\n") else ""


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    try:
        options = parse_args(argv)
    except UsageError as e:
        sys.stderr.write(f"shardtrain-run: {e}\nusage:\n{USAGE}\n"
                         "(shardtrain-run --help for more)\n")
        return 2
    return Launcher(options).run()


if __name__ == "__main__":
    sys.exit(main())
