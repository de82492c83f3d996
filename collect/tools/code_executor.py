"""Sandboxed execution of model-written Python (the `code_executor` tool).

Model-written code is never exec'd in the runtime's process. `run_code` starts a separate interpreter with layered
protections (see docs/sandbox.md for the threat model and what each layer does and does not stop):

1. Unprivileged user: when the runtime runs as root, the child drops to `nobody` (setgroups/setgid/setuid in
   preexec_fn). Linux does not enforce RLIMIT_NPROC for root, so this is what makes the fork limit real; it also
   makes filesystem permissions refuse writes outside the scratch dir and hides root-owned /proc/<pid>/environ.
2. Namespaces via util-linux `unshare`: a new user + network namespace (no interface but a down loopback, so no
   connection can reach anything, not even 127.0.0.1 on the host), a new PID namespace with a private /proc (the
   parent's processes are invisible and every process in it is killed when its init exits) and a mount namespace.
3. rlimits set in preexec_fn: RLIMIT_AS (memory), RLIMIT_CPU, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE.
4. A new session / process group that is SIGKILLed as a whole on wall-clock timeout and after every run.
5. A scrubbed environment (PATH, LANG, HOME=scratch only) and `python -I` (isolated mode).
6. An audit hook (sys.addaudithook, installed by the bootstrap before user code) that refuses writes/removals/renames
   outside the scratch dir, reading /proc/*/environ of other processes, and socket connect/bind/send. This is
   defence in depth only: audit hooks can be bypassed (e.g. with ctypes), so layers 1-2 are the real boundary.

Layers 1 and 2 are probed once per process and silently degrade when unavailable (not root / no interpreter readable
by nobody / user namespaces disabled); `sandbox_capabilities()` reports which layers are active.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import pwd
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time

__all__ = ["ExecResult", "SandboxPolicy", "run_code", "sandbox_capabilities"]

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
MEMORY_EXIT_CODE = 86  # the bootstrap exits with this when user code raised MemoryError (RLIMIT_AS hit)
FSIZE_LIMIT_BYTES = 64 * 1024 * 1024
NOFILE_LIMIT = 256
_READ_CHUNK = 65536

# Runs as the child's main program (`python -I -u -B -c BOOTSTRAP scratch_dir code_file status_fd`). It installs the
# audit hook, then forks: the grandchild runs the user code; this process (PID 1 of the sandbox PID namespace when
# namespaces are on) waits for it and writes its true exit status to status_fd, because `unshare --fork` does not
# propagate a child's death-by-signal reliably. Its exit kills everything left in the namespace.
BOOTSTRAP = r"""
import os, sys
_scratch = os.path.realpath(sys.argv[1])
_code_file = sys.argv[2]
_status_fd = int(sys.argv[3])
_own_proc = ("/proc/self/", "/proc/thread-self/")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {"os.remove": (0,), "os.rename": (0, 1), "os.mkdir": (0,), "os.rmdir": (0,), "os.symlink": (1,),
                "os.link": (1,), "os.chmod": (0,), "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,),
                "shutil.rmtree": (0,), "shutil.copyfile": (1,), "shutil.move": (1,), "os.mkfifo": (0,),
                "os.mknod": (0,)}
_NET_EVENTS = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"}

def _inside(path):
    real = os.path.realpath(os.fsdecode(path))
    return real == _scratch or real.startswith(_scratch + os.sep)

def _hook(event, args):
    if event == "open":
        path, mode, flags = args
        if not isinstance(path, (str, bytes)):
            return
        writing = bool((flags or 0) & _WRITE_FLAGS) or any(c in (mode or "") for c in "wax+")
        if writing and not _inside(path):
            raise PermissionError(f"sandbox: writing outside the scratch dir is refused: {os.fsdecode(path)!r}")
        name = os.fsdecode(path)
        if name.startswith("/proc/") and name.endswith("/environ") and not name.startswith(_own_proc):
            if name != f"/proc/{os.getpid()}/environ":
                raise PermissionError(f"sandbox: reading another process's environment is refused: {name!r}")
    elif event in _PATH_EVENTS:
        for i in _PATH_EVENTS[event]:
            if i < len(args) and isinstance(args[i], (str, bytes)) and not _inside(args[i]):
                raise PermissionError(f"sandbox: {event} outside the scratch dir is refused: {os.fsdecode(args[i])!r}")
    elif event in _NET_EVENTS:
        raise PermissionError(f"sandbox: network access is refused ({event})")

if os.environ.get("OMNI_SANDBOX_AUDIT", "1") == "1":
    sys.addaudithook(_hook)
os.environ.pop("OMNI_SANDBOX_AUDIT", None)

_pid = os.fork()
if _pid == 0:
    os.close(_status_fd)
    sys.argv = [_code_file]
    with open(_code_file, encoding="utf-8") as f:
        _src = f.read()
    _g = {"__name__": "__main__", "__file__": _code_file, "__builtins__": __builtins__}
    _rc = 0
    try:
        exec(compile(_src, _code_file, "exec"), _g)
    except SystemExit as e:
        _rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException as e:  # report like python would, minus this bootstrap's frame
        import traceback
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        _rc = 86 if isinstance(e, MemoryError) else 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(_rc)
_, _st = os.waitpid(_pid, 0)
_msg = f"signal {os.WTERMSIG(_st)}" if os.WIFSIGNALED(_st) else f"exit {os.WEXITSTATUS(_st)}"
os.write(_status_fd, _msg.encode())
os._exit(0)
"""


@dataclasses.dataclass(frozen=True)
class ExecResult:
    """Outcome of one sandboxed run. `killed` is why the sandbox ended it ("timeout", "memory", "cpu", "signal N")."""

    stdout: str
    stderr: str
    returncode: int
    timed_out: bool
    killed: str | None
    truncated: bool
    wall_s: float

    @property
    def ok(self) -> bool:
        """True when the code ran to completion with exit status 0."""
        return self.returncode == 0 and not self.timed_out and self.killed is None

    def to_observation_text(self) -> str:
        """Render the result as the raw observation text the planner sees."""
        status = f"exit code {self.returncode}"
        if self.killed:
            status += f", killed ({self.killed})"
        head = f"[code_executor: {status}, {self.wall_s:.2f}s{', output truncated' if self.truncated else ''}]"
        parts = [head, "stdout:", self.stdout.rstrip("\n") or "(empty)"]
        if self.stderr.strip():
            parts += ["stderr:", self.stderr.rstrip("\n")]
        return "\n".join(parts)


@dataclasses.dataclass(frozen=True)
class SandboxPolicy:
    """Which protection layers a run uses. All on by default; tests switch single layers off to prove each one."""

    drop_privileges: bool = dataclasses.field(default=True, metadata={"help": "run as nobody when we are root"})
    namespaces: bool = dataclasses.field(default=True, metadata={"help": "user+net+pid+mount namespaces (unshare)"})
    audit_hook: bool = dataclasses.field(default=True, metadata={"help": "in-child audit hook (defence in depth)"})
    rlimits: bool = dataclasses.field(default=True, metadata={"help": "RLIMIT_AS/CPU/NPROC/FSIZE/NOFILE"})
    scrub_env: bool = dataclasses.field(default=True, metadata={"help": "pass only PATH, LANG, HOME to the child"})


def _uid_proc_count(uid: int) -> int:
    """Number of live processes whose real uid is `uid` (RLIMIT_NPROC counts these too)."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        count += int(line.split()[1]) == uid
                        break
        except OSError:
            continue
    return count


def _drop_to(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


@functools.lru_cache(maxsize=1)
def _nobody() -> tuple[int, int] | None:
    """(uid, gid) to drop to, or None when not root or no `nobody` user exists."""
    if os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return pw.pw_uid, pw.pw_gid


def _probe(cmd: list[str], ids: tuple[int, int] | None) -> bool:
    try:
        res = subprocess.run(
            cmd,
            env={"PATH": SAFE_PATH, "LANG": "C.UTF-8"},
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=20,
            preexec_fn=(lambda: _drop_to(*ids)) if ids else None,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return res.returncode == 0 and res.stdout.strip() == b"ok"


@functools.lru_cache(maxsize=1)
def _interpreter_for_nobody() -> str | None:
    """An interpreter that `nobody` can execute and import the stdlib with (the venv's may live under /root)."""
    ids = _nobody()
    if ids is None:
        return None
    candidates = [sys.executable, getattr(sys, "_base_executable", ""), shutil.which("python3", path=SAFE_PATH)]
    for exe in dict.fromkeys(c for c in candidates if c):
        if _probe([exe, "-I", "-c", "import datetime, json, math; print('ok')"], ids):
            return exe
    return None


def _unshare_prefix(uid: int) -> list[str]:
    return [
        "unshare", "--user", f"--map-user={uid}", f"--map-group={uid}", "--net", "--pid", "--fork",
        "--mount-proc", "--kill-child", "--",
    ]  # fmt: skip


@functools.lru_cache(maxsize=4)
def _namespaces_work(exe: str, drop: bool) -> bool:
    """Probe once whether `unshare` can give this (possibly unprivileged) child its namespaces."""
    if shutil.which("unshare", path=SAFE_PATH) is None:
        return False
    ids = _nobody() if drop else None
    uid = ids[0] if ids else os.getuid()
    return _probe(_unshare_prefix(uid) + [exe, "-I", "-c", "print('ok')"], ids)


def sandbox_capabilities() -> dict[str, bool | str | None]:
    """Which protection layers a default run gets on this machine (for logs, docs and test skips)."""
    exe = _interpreter_for_nobody()
    drop = exe is not None
    exe = exe or sys.executable
    return {
        "running_as_root": os.geteuid() == 0,
        "drop_to_nobody": drop,
        "interpreter": exe,
        "namespaces": _namespaces_work(exe, drop),
    }


def _preexec(limits: dict[int, tuple[int, int]], ids: tuple[int, int] | None) -> None:
    # Runs in the forked child before exec: only async-signal-tolerant work, no imports.
    for res, lim in limits.items():
        resource.setrlimit(res, lim)
    if ids is not None:
        _drop_to(*ids)


def _decode_capped(buf: bytearray, cap: int, dropped: bool) -> tuple[str, bool]:
    text = buf.decode("utf-8", errors="replace")
    if len(text) > cap:
        return text[:cap], True
    return text, dropped


def run_code(
    code: str,
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    max_output_chars: int = 4000,
    scratch_dir: str | None = None,
    cpu_s: float | None = None,
    max_procs: int = 16,
) -> ExecResult:
    """Run `code` in a sandboxed `python -I` child and return its capped output and how it ended.

    `scratch_dir` (created and removed per run when None; a caller-given one is kept, and chowned to nobody when the
    sandbox drops privileges) is the child's cwd and HOME and the only place it may write. `cpu_s` defaults to the
    wall limit + 1 s (a backstop; the wall clock normally fires first). `max_procs` caps the processes the sandbox
    may own at once, its own interpreters included.
    """
    return _run(code, SandboxPolicy(), timeout_s, memory_mb, max_output_chars, scratch_dir, cpu_s, max_procs)


def _run(
    code: str,
    policy: SandboxPolicy,
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    max_output_chars: int = 4000,
    scratch_dir: str | None = None,
    cpu_s: float | None = None,
    max_procs: int = 16,
) -> ExecResult:
    """run_code with an explicit SandboxPolicy (tests use it to check each layer on its own)."""
    if timeout_s <= 0 or memory_mb <= 0 or max_output_chars < 0 or max_procs < 3:
        raise ValueError(
            f"run_code: bad limits timeout_s={timeout_s!r} memory_mb={memory_mb!r} "
            f"max_output_chars={max_output_chars!r} max_procs={max_procs!r} (max_procs must be >= 3)"
        )
    exe = _interpreter_for_nobody() if policy.drop_privileges else None
    ids = _nobody() if exe else None
    exe = exe or sys.executable
    use_ns = policy.namespaces and _namespaces_work(exe, ids is not None)

    owns_scratch = scratch_dir is None
    scratch = tempfile.mkdtemp(prefix="omni-sbx-") if owns_scratch else os.path.abspath(scratch_dir)
    os.makedirs(scratch, exist_ok=True)
    status_r, status_w = os.pipe()
    proc: subprocess.Popen[bytes] | None = None
    try:
        code_file = os.path.join(scratch, "main.py")
        with open(code_file, "w", encoding="utf-8") as f:
            f.write(code)
        if ids is not None:
            for path in (scratch, code_file):
                os.chown(path, *ids)

        env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "HOME": scratch}
        if not policy.scrub_env:
            env = {**os.environ, **env}
        env["OMNI_SANDBOX_AUDIT"] = "1" if policy.audit_hook else "0"

        limits: dict[int, tuple[int, int]] = {resource.RLIMIT_CORE: (0, 0)}
        if policy.rlimits:
            cpu = math.ceil(cpu_s if cpu_s is not None else timeout_s + 1)
            child_uid = ids[0] if ids else os.getuid()
            nproc = max_procs + _uid_proc_count(child_uid)
            mem = memory_mb * 1024 * 1024
            limits |= {
                resource.RLIMIT_AS: (mem, mem),
                resource.RLIMIT_CPU: (cpu, cpu + 1),
                resource.RLIMIT_NPROC: (nproc, nproc),
                resource.RLIMIT_FSIZE: (FSIZE_LIMIT_BYTES, FSIZE_LIMIT_BYTES),
                resource.RLIMIT_NOFILE: (NOFILE_LIMIT, NOFILE_LIMIT),
            }
        cmd = [exe, "-I", "-u", "-B", "-c", BOOTSTRAP, scratch, code_file, str(status_w)]
        if use_ns:
            cmd = _unshare_prefix(ids[0] if ids else os.getuid()) + cmd

        start = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=scratch,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(status_w,),
            start_new_session=True,
            preexec_fn=functools.partial(_preexec, limits, ids),
        )
        os.close(status_w)
        status_w = -1
        out, err, truncated, timed_out = _pump(proc, start + timeout_s, max_output_chars)
        if timed_out:
            _kill_group(proc)
        try:
            proc.wait(timeout=max(0.0, start + timeout_s - time.monotonic()) + 1.0)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            proc.wait()
        wall = time.monotonic() - start
        _kill_group(proc)  # leftovers outside a PID namespace (e.g. backgrounded children)

        os.set_blocking(status_r, False)
        try:
            status = os.read(status_r, 64).decode()
        except BlockingIOError:
            status = ""
        returncode, killed = _classify(proc.returncode, status, timed_out, truncated)
        stdout, t1 = _decode_capped(out[0], max_output_chars, out[1])
        stderr, t2 = _decode_capped(err[0], max_output_chars, err[1])
        return ExecResult(stdout, stderr, returncode, timed_out, killed, t1 or t2, round(wall, 3))
    finally:
        if proc is not None and proc.poll() is None:
            _kill_group(proc)
            proc.wait()
        for fd in (status_r, status_w):
            if fd >= 0:
                os.close(fd)
        if owns_scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _pump(
    proc: subprocess.Popen[bytes], deadline: float, cap: int
) -> tuple[tuple[bytearray, bool], tuple[bytearray, bool], bool, bool]:
    """Read stdout/stderr incrementally until EOF or the deadline, keeping at most ~cap chars of each.

    Returns ((stdout_bytes, dropped), (stderr_bytes, dropped), truncated, timed_out). Bytes past the cap are read and
    discarded so the child never blocks on a full pipe and our memory stays bounded (4 bytes per char worst case).
    """
    keep = cap * 4
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    dropped = {proc.stdout: False, proc.stderr: False}
    sel = selectors.DefaultSelector()
    for stream in bufs:
        assert stream is not None
        os.set_blocking(stream.fileno(), False)
        sel.register(stream, selectors.EVENT_READ)
    timed_out = False
    try:
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(timeout=min(remaining, 0.5)):
                try:
                    chunk = os.read(key.fd, _READ_CHUNK)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = bufs[key.fileobj]
                room = keep - len(buf)
                if room > 0:
                    buf += chunk[:room]
                if len(chunk) > max(room, 0):
                    dropped[key.fileobj] = True
    finally:
        sel.close()
        for stream in bufs:
            stream.close()
    out = (bufs[proc.stdout], dropped[proc.stdout])
    err = (bufs[proc.stderr], dropped[proc.stderr])
    return out, err, dropped[proc.stdout] or dropped[proc.stderr], timed_out


def _classify(rc: int, status: str, timed_out: bool, truncated: bool) -> tuple[int, str | None]:
    """Map (process return code, bootstrap status line) to (returncode, killed reason)."""
    del truncated
    if status.startswith("signal "):
        rc = -int(status.split()[1])
    elif status.startswith("exit "):
        rc = int(status.split()[1])
    if timed_out:
        return (rc if rc != 0 else -signal.SIGKILL), "timeout"
    if rc == MEMORY_EXIT_CODE:
        return rc, "memory"
    if rc < 0:
        sig = -rc
        if sig == signal.SIGXCPU:
            return rc, "cpu"
        return rc, f"signal {sig}"
    return rc, None
