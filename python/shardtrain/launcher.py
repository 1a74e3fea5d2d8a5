"""shardtrain-run: starts a local shardtrain job and runs a training command.

    shardtrain-run [--shards N] [--workers N] [--mode sync|async]
                   [--replicas R] [--build-dir DIR] [--logs DIR] [--stop-timeout S]
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
    SHARDTRAIN_REPLICAS, SHARDTRAIN_ETCD_ENDPOINTS, SHARDTRAIN_JOB
                            with --replicas R > 1 (below)
    PYTHONPATH              BUILD_DIR/python (installed: the package's
                            directory) first, so `import shardtrain` works
    PYTHONUNBUFFERED        1, so output arrives line by line
    OMP_NUM_THREADS         cpus / workers (at least 1) unless already set

(see shardtrain/env.py for the optional variables, which pass through from
the launcher's own environment). Every line a worker prints is forwarded with
a "[worker I] " prefix (stdout to stdout, stderr to stderr); the shards'
lines go to stderr with "[shard S] ". With --logs DIR each process's output
is also written, unprefixed, to DIR/worker-I.log and DIR/shard-S.log.

--replicas R (1-3, at most --shards; default 1) keeps every partition and
every sparse table's rows on a chain of R shards: the launcher starts an
etcd of its own (Debian's etcd-server; its log is in DIR/etcd.log with
--logs) and gives the shards and workers its address and the job name
"shardtrain-run". A shard that dies then does not end the job: its chains
go on without it (the launcher says so and does not restart it).

BUILD_DIR is --build-dir, else $BUILD_DIR, else build/ beside scripts/; an
installed shardtrain-run uses the ps-server beside it and the installed
package unless --build-dir is given.

The workers' Python. A COMMAND that is a Python script without an
interpreter (`-- examples/torch_fmnist_cnn.py`) runs with the interpreter
the extension was built for (the build's Python3_EXECUTABLE; unless the
script's first line names an interpreter by its path). Before any shard
starts, the launcher asks the command's interpreter (`python3`, a script's,
...) to import shardtrain and to find the modules the script imports at its
top level (torch, numpy, ...), with the workers' PYTHONPATH; when one is
missing it exits 2, naming the interpreter it found, the one the extension
was built for and the command to use instead. Commands that are not Python
are not checked.

Arguments before "--" that are not the launcher's own are ps-server flags,
passed to every shard (e.g. --lr 0.05 --optimizer momentum --max_staleness 4).
When none of them sets --optimizer or --lr the shards get --optimizer=adam
--lr=0.001 (the defaults of run-local.sh); otherwise ps-server's own defaults
fill in what is not given.

The launcher exits with the code of the first worker that fails (128 + N
for one killed by signal N) after stopping the others, 0 when every worker
succeeds, 1 when a shard does not start or (without --replicas) dies, or
etcd does not start (with its last lines), 2 on
a usage error and 128 + N when stopped by signal N (SIGINT, SIGTERM). On
every exit it stops what it started, by PID, workers first: SIGTERM, then
SIGKILL after --stop-timeout seconds (etcd last). Each child runs in its own process
group, which gets the signals (so a worker's own subprocesses stop too, and
a Ctrl-C reaches only the launcher, which stops the children in order), and
gets SIGKILL if the launcher itself is killed (Linux parent-death signal).

Uses the standard library only: it runs before anything is importable.
"""

import ast
import ctypes
import glob
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import IO, List, Optional, Sequence

USAGE = __doc__.split("\n\n")[1]
# ps-server flags the launcher sets itself; passing them is a usage error.
_OWN_SERVER_FLAGS = ("shard_index", "num_shards", "num_workers", "mode",
                     "port_file", "listen", "replicas", "etcd_endpoints", "job")
# The job's name in the launcher's etcd (--replicas > 1).
_JOB = "shardtrain-run"
_ETCD_START_TIMEOUT_S = 30.0
_DEFAULT_SERVER_FLAGS = ("--optimizer=adam", "--lr=0.001")
_SHARD_START_TIMEOUT_S = 30.0
# Bounds the check of the workers' interpreter (it imports shardtrain).
_INTERPRETER_CHECK_TIMEOUT_S = 60.0
_POLL_S = 0.05


class UsageError(Exception):
    pass


class Options:
    """The parsed command line."""

    def __init__(self):
        self.shards = 1
        self.workers = 1
        self.mode = "async"
        self.replicas = 1
        self.build_dir = ""
        self.logs = ""
        self.stop_timeout = 10.0
        self.server_flags: List[str] = []
        self.command: List[str] = []
        # The arguments before "--", as given (to print a corrected command).
        self.own_args: List[str] = []


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
    options.own_args = own
    if not options.command:
        raise UsageError("no command after '--'")
    i = 0
    while i < len(own):
        arg = own[i]
        name, has_value, value = arg.partition("=")
        if name in ("--shards", "--workers", "--mode", "--replicas", "--build-dir", "--logs",
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
            elif name == "--replicas":
                if value not in ("1", "2", "3"):
                    raise UsageError(f"--replicas must be 1, 2 or 3, not {value!r}")
                options.replicas = int(value)
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
                    "(use --shards, --workers, --mode, --replicas)")
            options.server_flags.append(arg)
        else:
            # A value of the previous ps-server flag ("--lr 0.05").
            if not options.server_flags:
                raise UsageError(f"unexpected argument {arg!r} before '--'")
            options.server_flags.append(arg)
        i += 1
    if options.replicas > options.shards:
        raise UsageError(f"--replicas {options.replicas} needs at least {options.replicas} "
                         f"shards, not {options.shards}")
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


class Layout:
    """Where a job's pieces are: the directory of ps-server, the directory
    put first on the workers' PYTHONPATH (it holds the shardtrain package)
    and the interpreter the extension was built for ("" when unknown).
    build_dir is set for a build tree (it names the targets to build)."""

    def __init__(self, bin_dir: str, python_dir: str, python: str, build_dir: str = ""):
        self.bin_dir = bin_dir
        self.python_dir = python_dir
        self.python = python
        self.build_dir = build_dir

    @staticmethod
    def of_build(build_dir: str) -> "Layout":
        """A CMake build tree: BUILD/bin, BUILD/python and the cache's
        Python3_EXECUTABLE."""
        build_dir = os.path.abspath(build_dir)
        python = ""
        try:
            with open(os.path.join(build_dir, "CMakeCache.txt"), encoding="utf-8",
                      errors="replace") as f:
                for line in f:
                    if line.startswith("Python3_EXECUTABLE:"):
                        python = line.split("=", 1)[1].strip()
                        break
        except OSError:
            pass
        return Layout(os.path.join(build_dir, "bin"), os.path.join(build_dir, "python"),
                      python, build_dir)

    def extension_python_version(self) -> str:
        """"3.11" from the extension's file name (_core.cpython-311-...so),
        or "" when it is not there."""
        for path in glob.glob(os.path.join(self.python_dir, "shardtrain", "_core.*.so")):
            match = re.search(r"\.cpython-(\d)(\d+)", os.path.basename(path))
            if match:
                return f"{match.group(1)}.{match.group(2)}"
        return ""


_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)*)?$")


def _is_python(program: str) -> bool:
    return bool(_PYTHON_NAME.match(os.path.basename(program)))


def _first_line(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.readline(256).decode("utf-8", errors="replace").strip()
    except OSError:
        return ""


def _script_of(args: Sequence[str]) -> Optional[str]:
    """The script a Python command line runs (its first argument that is
    not an option), or None for -c, -m and stdin."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-c", "-m", "-") or arg.startswith(("-c", "-m")) and len(arg) > 2 \
                and not arg.startswith("--"):
            return None
        if arg in ("-W", "-X"):
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return arg
    return None


def resolve_command(command: Sequence[str], layout: Layout):
    """(argv to run, the Python interpreter it runs or None, the script or
    None). A Python script given without an interpreter (a .py file, or one
    whose first line is a python #! line) runs with the interpreter its #!
    line names by path, else with the extension's."""
    first = command[0]
    if _is_python(first):
        return list(command), first, _script_of(command[1:])
    if os.path.isfile(first):
        line = _first_line(first)
        shebang = line[2:].split() if line.startswith("#!") else []
        if first.endswith(".py") or (shebang and any("python" in w for w in shebang)):
            interpreter = ""
            if shebang and _is_python(shebang[0]) and os.path.isabs(shebang[0]):
                interpreter = shebang[0]  # "#!/usr/bin/python3", not "#!/usr/bin/env python3"
            interpreter = interpreter or layout.python or sys.executable
            return [interpreter] + list(command), interpreter, first
    return list(command), None, None


def script_imports(script: Optional[str]) -> List[str]:
    """The modules `script` needs, to check before it runs: what it imports
    unconditionally (statements at its top level, not under try/if; the
    top-level package of each, "torch" for "torch.nn"), and the shardtrain
    modules it imports anywhere ("shardtrain.torch", which needs torch too)."""
    if not script:
        return []
    try:
        with open(script, "rb") as f:
            tree = ast.parse(f.read(), filename=script)
    except (OSError, SyntaxError, ValueError):
        return []  # the interpreter will say what is wrong with it

    def imported(node) -> List[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "shardtrain":  # from shardtrain import torch
                return ["shardtrain"] + [f"shardtrain.{a.name}" for a in node.names
                                         if a.name == "torch"]
            return [node.module]
        return []

    names = []
    for node in tree.body:
        names += [n if n.startswith("shardtrain.") else n.split(".")[0]
                  for n in imported(node)]
    for node in ast.walk(tree):
        for name in imported(node):
            if name.split(".")[0] == "shardtrain":
                names.append(name)
                if name.startswith("shardtrain.torch"):
                    names.append("torch")
    return [n for n in dict.fromkeys(names) if n != "__future__"]


# Run by the workers' interpreter with sys.path as running the script (or
# -c/-m) would have it: imports shardtrain (the extension loads) and finds
# each module in argv[2:] (without running it: finding is cheap).
_CHECK_SOURCE = r"""
import importlib, importlib.util, json, os, sys
script, names = sys.argv[1], sys.argv[2:]
if script:  # python SCRIPT puts the script's directory first, not the working directory
    sys.path[0] = os.path.dirname(os.path.abspath(script))
missing = {}
try:
    importlib.import_module("shardtrain")
except BaseException as e:
    missing["shardtrain"] = "%s: %s" % (type(e).__name__, e)
for name in names:
    if name.split(".")[0] in missing:
        continue
    try:
        if importlib.util.find_spec(name) is None:
            missing[name] = "ModuleNotFoundError: No module named %r" % name
    except BaseException as e:
        missing[name] = "%s: %s" % (type(e).__name__, e)
print(json.dumps({"executable": sys.executable, "missing": missing,
                  "version": "%d.%d.%d" % sys.version_info[:3]}))
"""


def check_interpreter(python: str, script: Optional[str], env: dict) -> dict:
    """Asks `python` (a name looked up on env's PATH, or a path) whether
    it can import shardtrain and find what `script` imports. Returns
    {"found": path or "", "executable", "version", "missing": {name: error},
    "error": why the check itself failed, or ""}."""
    found = shutil.which(python, path=env.get("PATH")) if os.sep not in python else python
    result = {"found": found or "", "executable": "", "version": "", "missing": {}, "error": ""}
    if not found:
        result["error"] = f"{python} not found on PATH"
        return result
    try:
        done = subprocess.run([found, "-c", _CHECK_SOURCE, script or ""] + script_imports(script),
                              env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=_INTERPRETER_CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        result["error"] = f"did not answer within {_INTERPRETER_CHECK_TIMEOUT_S:.0f} s"
        return result
    except OSError as e:
        result["error"] = str(e)
        return result
    lines = done.stdout.decode("utf-8", errors="replace").strip().splitlines()
    try:
        result.update(json.loads(lines[-1]))
    except (IndexError, ValueError):
        error = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
        result["error"] = (error[-1] if error else f"exit status {done.returncode}")
    return result


def _same_program(a: str, b: str) -> bool:
    return bool(a) and bool(b) and os.path.realpath(a) == os.path.realpath(b)


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

    def __init__(self, options: Options, stdout: IO = sys.stdout, stderr: IO = sys.stderr,
                 layout: Optional[Layout] = None):
        self.options = options
        self.stdout = stdout
        self.stderr = stderr
        # Serialises writes to stdout, stderr and the logs.
        self.lock = threading.RLock()
        # The first SIGINT/SIGTERM received, or None.
        self.stop_signal: Optional[int] = None
        self.shards: List[Child] = []
        self.workers: List[Child] = []
        self.etcd: Optional[Child] = None
        self.etcd_endpoint = ""
        # --build-dir wins; an installed launcher passes its own layout.
        if options.build_dir or layout is None:
            layout = Layout.of_build(options.build_dir or default_build_dir())
        self.layout = layout
        self.command = list(options.command)

    def say(self, message: str):
        with self.lock:
            self.stderr.write(f"[shardtrain-run] {message}\n")
            self.stderr.flush()

    def _log_path(self, name: str) -> str:
        if not self.options.logs:
            return ""
        return os.path.join(self.options.logs, name.replace(" ", "-") + ".log")

    def _worker_env(self) -> dict:
        """The launcher's environment with the package's directory first on
        PYTHONPATH (what every worker gets, before its job variables)."""
        env = dict(os.environ)
        path = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = self.layout.python_dir + (os.pathsep + path if path else "")
        return env

    def _check_workers_python(self) -> bool:
        """Resolves the command's interpreter and checks that it imports
        shardtrain and finds the script's modules; says what is wrong (and
        the command to use) when not."""
        argv, python, script = resolve_command(self.options.command, self.layout)
        self.command = argv
        if python is None:
            return True  # not a Python command: nothing to check
        env = self._worker_env()
        result = check_interpreter(python, script, env)
        if not result["error"] and not result["missing"]:
            return True
        layout = self.layout
        built_for = layout.python
        found = result["found"] or python
        if result["executable"] and result["executable"] != found:
            found = f"{found} (that is {result['executable']})"
        if result["error"]:
            self.say(f"the workers' Python {found} cannot be run: {result['error']}")
        else:
            self.say(f"the workers' Python {found} (Python {result['version']}) cannot import "
                     f"{', '.join(result['missing'])}:")
            for name, error in result["missing"].items():
                self.say(f"  {name}: {error}")
        extension_version = layout.extension_python_version()
        if built_for:
            self.say(f"the shardtrain extension in {layout.python_dir} was built for {built_for}"
                     + (f" (Python {extension_version})" if extension_version else ""))
        # Another interpreter than the extension's: does that one work?
        if built_for and built_for not in (python, result["found"], result["executable"]):
            other = check_interpreter(built_for, script, env)
            if not other["error"] and not other["missing"]:
                self.say("run the workers with that interpreter:")
                self.say("  " + shlex.join(self._command_with(built_for)))
                return False
            if not other["error"]:
                self.say(f"{built_for} cannot import {', '.join(other['missing'])} either")
                result = other
        for line in self._advice(result["missing"], built_for or python, extension_version):
            self.say(line)
        return False

    def _advice(self, missing: dict, python: str, extension_version: str) -> List[str]:
        """What to do about the modules `python` lacks."""
        layout = self.layout
        ours = [n for n in missing if n.split(".")[0] == "shardtrain"]
        if ours and layout.build_dir:
            what = ("the extension is not built" if "shardtrain" in missing
                    and not extension_version else f"the package in {layout.python_dir} "
                    "is incomplete")
            return [f"{what}: cmake --build {layout.build_dir} --target _core"]
        if ours:
            return [f"the shardtrain package in {layout.python_dir} is incomplete: "
                    "reinstall shardtrain"]
        if missing:
            packages = " ".join(sorted({f"python3-{n.split('.')[0].replace('_', '-')}"
                                        for n in missing}))
            return [f"install them for {python} (Debian: apt-get install {packages})"]
        return []

    def _command_with(self, python: str) -> List[str]:
        """This launcher's command line with the workers' interpreter
        replaced by `python`."""
        command = list(self.options.command)
        if _is_python(command[0]):
            command[0] = python
        else:
            command = [python] + command
        launcher = sys.argv[0] if sys.argv and sys.argv[0] else "shardtrain-run"
        on_path = shutil.which(os.path.basename(launcher))
        if on_path and _same_program(on_path, launcher):
            launcher = os.path.basename(launcher)
        return [launcher] + self.options.own_args + ["--"] + command

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
        server = os.path.join(self.layout.bin_dir, "ps-server")
        if not os.access(server, os.X_OK):
            if self.layout.build_dir:
                self.say(f"{server} not found: build it first "
                         f"(cmake --build {self.layout.build_dir} --target ps-server), "
                         "or point --build-dir (or $BUILD_DIR) at a build")
            else:
                self.say(f"{server} not found: the installation is incomplete "
                         "(or point --build-dir at a build)")
            return 2
        if not self._check_workers_python():
            return 2
        if self.options.logs:
            os.makedirs(self.options.logs, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="shardtrain-run.") as run_dir:
            if self.options.replicas > 1:
                code = self._start_etcd(run_dir)
                if code is not None:
                    return code
                if self.stop_signal is not None:
                    return 0
            servers = self._start_shards(server, run_dir)
            if servers is None:
                return 1
            if self.stop_signal is not None:
                return 0
            failed = self._start_workers(servers)
            if failed is not None:
                return failed
            return self._wait()

    def _start_etcd(self, run_dir: str) -> Optional[int]:
        """Starts the job's etcd on free ports (tried again on others if it
        cannot bind); an exit code when it cannot start."""
        etcd = shutil.which("etcd") or ("/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK)
                                        else None)
        if etcd is None:
            self.say(f"--replicas {self.options.replicas} needs etcd, which is not installed "
                     "(Debian: apt-get install etcd-server)")
            return 2
        log = self._log_path("etcd") or os.path.join(run_dir, "etcd.log")
        for attempt in range(5):
            client, peer = _free_port(), _free_port()
            if client == peer:
                continue
            data = os.path.join(run_dir, f"etcd{attempt}")
            argv = [etcd, "--name=local", f"--data-dir={data}",
                    f"--listen-client-urls=http://127.0.0.1:{client}",
                    f"--advertise-client-urls=http://127.0.0.1:{client}",
                    f"--listen-peer-urls=http://127.0.0.1:{peer}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                    f"--initial-cluster=local=http://127.0.0.1:{peer}",
                    "--heartbeat-interval=25", "--election-timeout=250"]
            self.etcd = Child("etcd", argv, dict(os.environ), None, None, log, self.lock)
            deadline = time.monotonic() + _ETCD_START_TIMEOUT_S
            while self.etcd.poll() is None and self.stop_signal is None:
                if _etcd_answers(client):
                    self.etcd_endpoint = f"127.0.0.1:{client}"
                    self.say(f"etcd on {self.etcd_endpoint} (pid {self.etcd.pid}); the chains: "
                             f"psctl chains --etcd_endpoints={self.etcd_endpoint} --job={_JOB}")
                    return None
                if time.monotonic() > deadline:
                    self._report(f"etcd did not answer on 127.0.0.1:{client} within "
                                 f"{_ETCD_START_TIMEOUT_S:.0f} s", self.etcd)
                    return 1
                time.sleep(_POLL_S)
            if self.stop_signal is not None:
                return None
            self.etcd.finish_output(1.0)  # it exited: a port taken meanwhile?
        self._report("etcd did not start", self.etcd)
        return 1

    def _start_shards(self, server: str, run_dir: str) -> Optional[List[str]]:
        o = self.options
        port_files = []
        replication = []
        if o.replicas > 1:
            replication = [f"--replicas={o.replicas}", f"--etcd_endpoints={self.etcd_endpoint}",
                           f"--job={_JOB}", "--lease_ttl_s=1"]
        # The data path goes to each shard's data port (frames on TCP; in
        # TLS, with the gRPC port's certificates and token, when the shards
        # serve TLS).
        data_port = ["--data_listen=127.0.0.1:0"]
        for s in range(o.shards):
            port_file = os.path.join(run_dir, f"shard{s}.port")
            port_files.append(port_file)
            argv = [server, f"--shard_index={s}", f"--num_shards={o.shards}",
                    f"--num_workers={o.workers}", f"--mode={o.mode}",
                    "--listen=127.0.0.1:0", f"--port_file={port_file}"] + replication + \
                data_port + o.server_flags
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
        flags = " ".join(o.server_flags)
        replicated = f" in chains of {o.replicas}" if o.replicas > 1 else ""
        self.say(f"{o.workers} workers, {o.shards} shards{replicated}, {o.mode} mode, "
                 f"ps-server {flags}")
        threads = max(1, (os.cpu_count() or 1) // o.workers)
        for w in range(o.workers):
            env = self._worker_env()
            env.update({
                "SHARDTRAIN_SERVERS": ",".join(servers),
                "SHARDTRAIN_WORKER": str(w),
                "SHARDTRAIN_NUM_WORKERS": str(o.workers),
                "SHARDTRAIN_MODE": o.mode,
                "PYTHONUNBUFFERED": "1",
            })
            if o.replicas > 1:
                env.update({
                    "SHARDTRAIN_REPLICAS": str(o.replicas),
                    "SHARDTRAIN_ETCD_ENDPOINTS": self.etcd_endpoint,
                    "SHARDTRAIN_JOB": _JOB,
                })
            env.setdefault("SHARDTRAIN_METRICS_PORT", "0")
            partition = _flag_value(o.server_flags, "max_partition_elements")
            if partition is not None:
                env["SHARDTRAIN_MAX_PARTITION_ELEMENTS"] = partition
            env.setdefault("OMP_NUM_THREADS", str(threads))
            try:
                self.workers.append(Child(f"worker {w}", self.command, env, self.stdout,
                                          self.stderr, self._log_path(f"worker {w}"),
                                          self.lock))
            except OSError as e:
                self.say(f"cannot start {self.command[0]!r}: {e}")
                return 127
            self.say(f"worker {w}: pid {self.workers[-1].pid}")
        return None

    def _wait(self) -> int:
        running = list(range(len(self.workers)))
        dead_shards = set()
        while running and self.stop_signal is None:
            for s, shard in enumerate(self.shards):
                code = shard.poll()
                if code is None or s in dead_shards:
                    continue
                if self.options.replicas == 1:
                    self._report_dead_shard(s, code, "died")
                    return 1
                dead_shards.add(s)
                shard.finish_output(1.0)
                self.say(f"shard {s} died ({_describe_exit(code)}); with --replicas "
                         f"{self.options.replicas} its chains go on without it")
            if self.etcd is not None and self.etcd.poll() is not None:
                self._report(f"etcd died ({_describe_exit(self.etcd.poll())}); stopping the job",
                             self.etcd)
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
        etcd = [self.etcd] if self.etcd is not None else []
        children = self.workers + self.shards + etcd
        # etcd last: the shards do not see it go.
        for group in (self.workers, self.shards, etcd):
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


def _free_port() -> int:
    """A port of 127.0.0.1 free now (another process may take it before it
    is used: the caller tries again)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _etcd_answers(port: int) -> bool:
    """Whether the etcd on 127.0.0.1:port says it is healthy."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
            return json.loads(response.read().decode()).get("health") == "true"
    except (OSError, ValueError):
        return False


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return ""
    # The shard writes the file atomically: a full line or nothing.
    return text if text.endswith("\n") else ""


def main(argv: Optional[Sequence[str]] = None, layout: Optional[Layout] = None) -> int:
    """shardtrain-run's command line. `layout`: where an installed launcher
    finds ps-server and the package (default: a build tree, see --build-dir)."""
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
    return Launcher(options, layout=layout).run()


if __name__ == "__main__":
    sys.exit(main())
