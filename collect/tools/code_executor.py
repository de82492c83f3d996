"""Sandboxed execution of model-written Python (the `code_executor` tool).

Model-written code is never exec'd in the runtime's process. `run_code` starts a separate interpreter with layered
protections (see docs/sandbox.md for the threat model and what each layer does and does not stop):

1. Private filesystem view (root + namespaces): the sandbox's PID 1 (collect/tools/sandbox_bootstrap.py) builds a
   minimal root of read-only bind mounts (/usr, /etc, the interpreter's prefix), a tiny /dev and the sandbox's own
   /proc, plus ONE size-capped tmpfs behind /tmp, /dev/shm and the scratch dir, and pivot_roots into it. The project
   repository, the run's OUT dir, host sockets (/tmp, /run, ...) and other sandboxes' scratch do not exist in it.
2. Own identity per run: the user code runs as a uid of its own (UID_BASE + slot, a slot held by flock for the run),
   never shared by two live sandboxes; without the fs view the preexec drops to that uid instead.
3. Namespaces via util-linux `unshare`: network (only a down loopback), PID (private /proc; when the sandbox's PID 1
   exits the kernel kills every process in it), IPC (SysV IPC and POSIX message queues of its own, gone with it) and
   mount; plus a user namespace when the runtime is not root.
4. Supervision: PR_SET_PDEATHSIG(SIGKILL) on the child (preexec) and `unshare --kill-child`, plus a lifeline pipe
   whose EOF makes PID 1 exit, so a SIGKILLed runtime takes its sandboxes down within milliseconds; a wall-clock
   backstop in PID 1; the scratch tmpfs dies with the mount namespace. Stale host scratch dirs (no fs view) of dead
   runtimes are removed at the next start.
5. rlimits set in preexec_fn: RLIMIT_AS (memory), RLIMIT_CPU, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE.
6. A new session / process group that is SIGKILLed as a whole on wall-clock timeout and after every run.
7. A scrubbed environment (PATH, LANG, HOME=scratch only) and `python -I` (isolated mode).
8. An audit hook (defence in depth only: ctypes or a child interpreter bypass it).
9. Kernel facilities no namespace covers: the sandbox's PID 1 joins a fresh session keyring (the runtime's, and every
   key in it, is inherited through fork, unshare and setuid otherwise), then installs a seccomp filter that refuses
   socket()/socketpair() for every family but AF_UNIX (vsock is not per network namespace), the keyring syscalls,
   io_uring (which opens sockets without socket()) and the other syscall ABIs of the architecture.

Every mechanism is probed once per process; `sandbox_capabilities()` reports which are active, and the first probe
logs one line listing the available and missing ones (a warning when any is missing). A run never silently gets less
than the probe promised: a failing fs-view setup raises instead of running unprotected.
"""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import errno
import fcntl
import functools
import json
import logging
import math
import os
import platform
import pwd
import random
import re
import resource
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path

__all__ = ["ExecResult", "SandboxPolicy", "SandboxSetupError", "run_code", "run_code_async", "sandbox_capabilities"]

log = logging.getLogger(__name__)

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
MEMORY_EXIT_CODE = 86  # the bootstrap exits with this when user code raised MemoryError (RLIMIT_AS hit)
SETUP_ERROR_EXIT = 87  # the bootstrap could not build the private filesystem view
FSIZE_LIMIT_BYTES = 64 * 1024 * 1024
NOFILE_LIMIT = 256
DEFAULT_DISK_MB = 64  # total of /tmp + /dev/shm + scratch inside one sandbox (tmpfs size=)
DISK_INODES = 4096
UID_BASE = 1_600_000_000  # per-run uids: UID_BASE + slot (far above any allocated or subuid range)
UID_SLOTS = 1024
SCRATCH_PREFIX = "omni-sbx-"
_READ_CHUNK = 65536
_BOOTSTRAP = (Path(__file__).with_name("sandbox_bootstrap.py")).read_text(encoding="utf-8")
_PIVOT_ROOT_NR = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_DEV_NODES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_PR_SET_PDEATHSIG = 1


class SandboxSetupError(RuntimeError):
    """The sandbox could not be set up as the start-up probe promised (the code was not run)."""


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

    drop_privileges: bool = dataclasses.field(default=True, metadata={"help": "run as a per-run uid when root"})
    namespaces: bool = dataclasses.field(default=True, metadata={"help": "net+pid+mount namespaces (unshare)"})
    fs_view: bool = dataclasses.field(
        default=True, metadata={"help": "private root (pivot_root) + one size-capped tmpfs; needs root + namespaces"}
    )
    audit_hook: bool = dataclasses.field(default=True, metadata={"help": "in-child audit hook (defence in depth)"})
    rlimits: bool = dataclasses.field(default=True, metadata={"help": "RLIMIT_AS/CPU/NPROC/FSIZE/NOFILE"})
    scrub_env: bool = dataclasses.field(default=True, metadata={"help": "pass only PATH, LANG, HOME to the child"})
    fresh_keyring: bool = dataclasses.field(
        default=True, metadata={"help": "PID 1 joins a new session keyring (the runtime's is not inherited)"}
    )
    seccomp: bool = dataclasses.field(
        default=True, metadata={"help": "seccomp filter: only AF_UNIX sockets, no keyring calls, no io_uring"}
    )


# ---- seccomp --------------------------------------------------------------------------------------------------------

# Per machine: the AUDIT_ARCH_* value of its native syscall ABI, the bit that marks a syscall of its second ABI on the
# same arch value (x86_64's x32) and the syscall numbers the filter looks at (asm/unistd_64.h; aarch64 uses the
# generic table, asm-generic/unistd.h).
_SECCOMP_ARCH: dict[str, tuple[int, int | None, dict[str, int]]] = {
    "x86_64": (0xC000003E, 0x40000000, {"socket": 41, "socketpair": 53, "add_key": 248, "request_key": 249,
                                        "keyctl": 250, "io_uring_setup": 425, "io_uring_enter": 426,
                                        "io_uring_register": 427}),
    "aarch64": (0xC00000B7, None, {"socket": 198, "socketpair": 199, "add_key": 217, "request_key": 218,
                                   "keyctl": 219, "io_uring_setup": 425, "io_uring_enter": 426,
                                   "io_uring_register": 427}),
}  # fmt: skip
_REFUSED_SYSCALLS = ("add_key", "request_key", "keyctl", "io_uring_setup", "io_uring_enter", "io_uring_register")
_AF_UNIX = 1
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x06
_SECCOMP_RET_KILL_PROCESS, _SECCOMP_RET_ERRNO, _SECCOMP_RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
_SECCOMP_DATA_NR, _SECCOMP_DATA_ARCH, _SECCOMP_DATA_ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg0: low word)


def _keyctl_nr(machine: str | None = None) -> int | None:
    arch = _SECCOMP_ARCH.get(machine or platform.machine())
    return arch[2]["keyctl"] if arch else None


@functools.lru_cache(maxsize=4)
def _seccomp_program(machine: str | None = None) -> bytes | None:
    """The sandbox's seccomp filter as packed `struct sock_filter`s (None: an architecture without a table here).

    A syscall of another ABI (i386 `int 0x80` and x32 on x86_64, AArch32 on aarch64: their numbers differ and i386
    has socketcall) kills the process; the keyring syscalls and io_uring fail with EPERM; socket() and socketpair()
    fail with EPERM unless the family (argument 0, an int: its low 32 bits are what the kernel reads) is AF_UNIX.
    Everything else is allowed. Little-endian machines only (both in the table are).
    """
    arch = _SECCOMP_ARCH.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, other_abi_bit, nrs = arch
    prog: list[tuple[int, int, str | None, str | None]] = [  # (code, k, jump-if-true label, jump-if-false label)
        (_BPF_LD_W_ABS, _SECCOMP_DATA_ARCH, None, None),
        (_BPF_JEQ_K, audit_arch, None, "kill"),
        (_BPF_LD_W_ABS, _SECCOMP_DATA_NR, None, None),
    ]
    if other_abi_bit is not None:
        prog.append((_BPF_JGE_K, other_abi_bit, "kill", None))
    prog += [(_BPF_JEQ_K, nrs[name], "deny", None) for name in _REFUSED_SYSCALLS]
    prog += [(_BPF_JEQ_K, nrs[name], "family", None) for name in ("socket", "socketpair")]
    prog.append((_BPF_RET_K, _SECCOMP_RET_ALLOW, None, None))
    labels = {"family": len(prog)}
    prog += [(_BPF_LD_W_ABS, _SECCOMP_DATA_ARG0, None, None), (_BPF_JEQ_K, _AF_UNIX, "allow", "deny")]
    for label, ret in (("deny", _SECCOMP_RET_ERRNO | errno.EPERM), ("allow", _SECCOMP_RET_ALLOW),
                       ("kill", _SECCOMP_RET_KILL_PROCESS)):  # fmt: skip
        labels[label] = len(prog)
        prog.append((_BPF_RET_K, ret, None, None))
    out = b""
    for i, (code, k, jt, jf) in enumerate(prog):  # jumps are relative and forward only
        out += struct.pack("=HBBI", code, labels[jt] - i - 1 if jt else 0, labels[jf] - i - 1 if jf else 0, k)
    return out


# ---- identity -------------------------------------------------------------------------------------------------------


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
    """(uid, gid) used to probe what an unprivileged uid can run, or None when not root or no `nobody` user exists."""
    if os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return pw.pw_uid, pw.pw_gid


@functools.lru_cache(maxsize=1)
def _lock_dir() -> str | None:
    """A root-only directory holding one flock file per uid slot (None: per-run uids unavailable)."""
    if os.geteuid() != 0:
        return None
    for d in ("/run/omni-sandbox", os.path.join(tempfile.gettempdir(), "omni-sandbox-locks")):
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
            st = os.lstat(d)
        except OSError:
            continue
        if st.st_uid == 0 and os.path.isdir(d) and not os.path.islink(d) and not st.st_mode & 0o022:
            return d
    return None


def _acquire_uid() -> tuple[int, int]:
    """Claim a uid no live sandbox (of any runtime on this host) uses: (uid, lock fd held for the whole run).

    The flock is released by the kernel when the holder dies, and a slot whose uid still owns processes (a sandbox of
    a killed runtime that has not finished dying) is skipped.
    """
    d = _lock_dir()
    if d is None:
        raise SandboxSetupError("per-run uids need root and a lock dir")
    start = random.randrange(UID_SLOTS)
    for i in range(UID_SLOTS):
        slot = (start + i) % UID_SLOTS
        fd = os.open(f"{d}/slot-{slot}", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        uid = UID_BASE + slot
        # "free" = the last holder saw its sandbox's PID namespace gone; anything else (a killed holder, a timeout,
        # no PID namespace) costs one scan of /proc for leftover processes of that uid.
        if _is_account(uid) or (os.pread(fd, 8, 0) != b"free" and _uid_proc_count(uid) > 0):
            os.close(fd)
            continue
        os.pwrite(fd, b"busy", 0)
        return uid, fd
    raise SandboxSetupError(f"all {UID_SLOTS} sandbox uid slots are busy")


def _release_uid(fd: int, clean: bool) -> None:
    if clean:
        os.pwrite(fd, b"free", 0)
    os.close(fd)  # drops the flock


@functools.lru_cache(maxsize=UID_SLOTS)
def _is_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True  # a real account: never borrow it


# ---- probes ---------------------------------------------------------------------------------------------------------


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
    """An interpreter an unprivileged uid can execute and import the stdlib with (the venv's may live under /root)."""
    ids = _nobody()
    if ids is None:
        return None
    candidates = [sys.executable, getattr(sys, "_base_executable", ""), shutil.which("python3", path=SAFE_PATH)]
    for exe in dict.fromkeys(c for c in candidates if c):
        if _probe([exe, "-I", "-c", "import datetime, json, math; print('ok')"], ids):
            return exe
    return None


def _user_ns_prefix(uid: int) -> list[str]:
    return [
        "unshare", "--user", f"--map-user={uid}", f"--map-group={uid}", "--net", "--pid", "--ipc", "--fork",
        "--mount-proc", "--kill-child", "--",
    ]  # fmt: skip


_ROOT_NS_PREFIX = ["unshare", "--mount", "--net", "--pid", "--ipc", "--fork", "--mount-proc", "--kill-child", "--"]


@functools.lru_cache(maxsize=4)
def _namespaces_work(exe: str, drop: bool) -> bool:
    """Probe once whether `unshare` can give this (possibly unprivileged) child its namespaces."""
    if shutil.which("unshare", path=SAFE_PATH) is None:
        return False
    ids = _nobody() if drop else None
    if ids is None and os.geteuid() == 0:
        return _probe(_ROOT_NS_PREFIX + [exe, "-I", "-c", "print('ok')"], None)
    uid = ids[0] if ids else os.getuid()
    return _probe(_user_ns_prefix(uid) + [exe, "-I", "-c", "print('ok')"], ids)


@functools.lru_cache(maxsize=1)
def _prctl():
    """libc's prctl through ctypes, or None (no PR_SET_PDEATHSIG then)."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    return fn


@functools.lru_cache(maxsize=4)
def _fs_layout(exe: str) -> dict | None:
    """What the private root binds read-only: /usr, /etc, non-symlink /bin,/lib*,/sbin and the interpreter's prefix."""
    nr = _PIVOT_ROOT_NR.get(platform.machine())
    if nr is None:
        return None
    ro, links = ["/usr", "/etc"], []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            links.append((name, os.readlink(path)))
        elif os.path.isdir(path):
            ro.append(path)
    try:
        out = subprocess.run(
            [exe, "-I", "-c", "import sys; print(sys.base_prefix); print(sys.prefix)"],
            capture_output=True, text=True, timeout=20, env={"PATH": SAFE_PATH}, cwd="/",
        ).stdout.split()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    for path in [*out, os.path.dirname(os.path.realpath(exe)), os.path.dirname(os.path.abspath(exe))]:
        path = os.path.realpath(path)
        if os.path.isdir(path) and not any(path == r or path.startswith(r.rstrip("/") + "/") for r in ro):
            ro.append(path)
    dev = [d for d in _DEV_NODES if os.path.exists(d)]
    return {"ro": ro, "links": links, "dev": dev, "pivot_root_nr": nr}


# ---- capabilities ---------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _caps() -> dict[str, bool | str | None]:
    root = os.geteuid() == 0
    exe = _interpreter_for_nobody()
    drop = exe is not None
    exe = exe or sys.executable
    ns = _namespaces_work(exe, drop)
    per_run_uid = drop and _lock_dir() is not None
    caps: dict[str, bool | str | None] = {
        "running_as_root": root,
        "drop_to_nobody": drop,  # kept for callers: "runs as an unprivileged uid" (a per-run one when available)
        "per_run_uid": per_run_uid,
        "interpreter": exe,
        "namespaces": ns,
        "root_namespaces": root and _namespaces_work(exe, False),
        "pdeathsig": _prctl() is not None,
        "lifeline": True,
        "fs_view": False,
    }
    if caps["root_namespaces"] and per_run_uid and _fs_layout(exe) is not None:
        caps["fs_view"] = _fs_view_works(exe)
    caps["scratch_quota"] = caps["fs_view"]
    caps["fresh_keyring"], caps["seccomp"] = _hardening(exe)
    _sweep_stale_scratch()
    mechs = [k for k in caps if k not in ("running_as_root", "interpreter", "root_namespaces", "drop_to_nobody")]
    have = [k for k in mechs if caps[k]]
    missing = [k for k in mechs if not caps[k]]
    line = f"code_executor sandbox mechanisms: available={have} missing={missing} (interpreter {exe}, root={root})"
    (log.warning if missing else log.info)(line + (" -- see docs/sandbox.md for what is then not guaranteed"
                                                   if missing else ""))  # fmt: skip
    return caps


def _fs_view_works(exe: str) -> bool:
    try:
        res = _launch("print('ok')", _Plan(exe=exe, mode="fs"), timeout_s=20, memory_mb=512, max_output_chars=100)
    except (OSError, SandboxSetupError) as e:
        log.warning("code_executor: private filesystem view unavailable: %s", e)
        return False
    if not (res.ok and res.stdout == "ok\n"):
        log.warning("code_executor: private filesystem view probe failed: %s", res)
        return False
    return True


# Run under the filter, it must not get an AF_INET socket (the kernel always has that family).
_SECCOMP_PROBE = (
    "import socket\ntry:\n    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()\n    print('open')\n"
    "except PermissionError:\n    print('ok')\n"
)


def _hardening_works(exe: str, keyring: bool, seccomp: bool) -> bool:
    """Probe the fresh session keyring and/or the seccomp filter in a plain launch (the bootstrap reports a setup
    error when the keyctl or the prctl fails; the probe code checks the filter is in force)."""
    if (keyring and _keyctl_nr() is None) or (seccomp and _seccomp_program() is None):
        log.warning("code_executor: no keyring/seccomp syscall table for %s", platform.machine())
        return False
    plan = _Plan(exe=exe, mode="plain", drop=False, keyring=keyring, seccomp=seccomp)
    what = " and ".join(n for n, on in (("fresh session keyring", keyring), ("seccomp filter", seccomp)) if on)
    try:
        res = _launch(_SECCOMP_PROBE, plan, timeout_s=20, memory_mb=512, max_output_chars=100)
    except (OSError, SandboxSetupError) as e:
        log.warning("code_executor: %s unavailable: %s", what, e)
        return False
    if not res.ok or res.stdout not in (("ok\n",) if seccomp else ("ok\n", "open\n")):
        log.warning("code_executor: %s probe failed: %s", what, res)
        return False
    return True


def _hardening(exe: str) -> tuple[bool, bool]:
    """(fresh_keyring, seccomp) available: one probe launch for both, one each only when that fails."""
    if _hardening_works(exe, keyring=True, seccomp=True):
        return True, True
    return _hardening_works(exe, keyring=True, seccomp=False), _hardening_works(exe, keyring=False, seccomp=True)


def sandbox_capabilities() -> dict[str, bool | str | None]:
    """Which protection layers a default run gets on this machine (for logs, docs and test skips)."""
    return dict(_caps())


def _sweep_stale_scratch() -> None:
    """Remove host scratch dirs (`omni-sbx-<pid>-*`, used without the fs view) whose runtime process is gone."""
    tmp = tempfile.gettempdir()
    try:
        entries = os.listdir(tmp)
    except OSError:
        return
    for name in entries:
        m = re.fullmatch(SCRATCH_PREFIX + r"(\d+)-\w+", name)
        if not m or int(m.group(1)) == os.getpid() or os.path.exists(f"/proc/{m.group(1)}"):
            continue
        path = os.path.join(tmp, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
            log.info("code_executor: removed stale scratch %s (runtime pid %s is gone)", path, m.group(1))


# ---- running --------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Plan:
    """How one run is launched. mode: "fs" (root: private root + per-run uid in PID 1's child), "userns" (preexec
    drop, then unshare --user), "rootns" (namespaces without a fs view and without a drop), "plain" (no namespaces)."""

    exe: str
    mode: str
    drop: bool = True
    keyring: bool = False  # PID 1 joins a fresh session keyring
    seccomp: bool = False  # PID 1 installs the seccomp filter (inherited by everything it starts)


def _preexec(limits: dict[int, tuple[int, int]], ids: tuple[int, int] | None, prctl, parent: int) -> None:
    # Runs in the forked child before exec: only async-signal-tolerant work, no imports.
    for res, lim in limits.items():
        resource.setrlimit(res, lim)
    if ids is not None:
        _drop_to(*ids)
    if prctl is not None:  # after the uid change, which would clear it
        prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)
        if os.getppid() != parent:  # the runtime died before the prctl
            os._exit(1)


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
    disk_mb: int = DEFAULT_DISK_MB,
) -> ExecResult:
    """Run `code` in a sandboxed `python -I` child and return its capped output and how it ended.

    `scratch_dir` is the child's cwd and HOME and the only place it may write. When None it is private to the run: a
    tmpfs inside the sandbox's own mount namespace (with the fs view; nothing of it ever reaches the host's disk) or a
    host `mkdtemp` removed afterwards. A caller-given one is bound into the sandbox (chowned to the run's uid), kept.
    `disk_mb` caps /tmp + /dev/shm + an own scratch together (fs view only). `cpu_s` defaults to the wall limit + 1 s
    (a backstop; the wall clock normally fires first). `max_procs` caps the processes the sandbox may own at once.
    """
    return _run(code, SandboxPolicy(), timeout_s, memory_mb, max_output_chars, scratch_dir, cpu_s, max_procs, disk_mb)


def _run(
    code: str,
    policy: SandboxPolicy,
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    max_output_chars: int = 4000,
    scratch_dir: str | None = None,
    cpu_s: float | None = None,
    max_procs: int = 16,
    disk_mb: int = DEFAULT_DISK_MB,
) -> ExecResult:
    """run_code with an explicit SandboxPolicy (tests use it to check each layer on its own)."""
    if timeout_s <= 0 or memory_mb <= 0 or max_output_chars < 0 or max_procs < 3 or disk_mb <= 0:
        raise ValueError(
            f"run_code: bad limits timeout_s={timeout_s!r} memory_mb={memory_mb!r} "
            f"max_output_chars={max_output_chars!r} max_procs={max_procs!r} disk_mb={disk_mb!r} "
            "(max_procs must be >= 3)"
        )
    caps = _caps()
    drop = policy.drop_privileges and bool(caps["drop_to_nobody"])
    exe = str(caps["interpreter"]) if drop else sys.executable
    if policy.namespaces and policy.fs_view and caps["fs_view"]:
        mode = "fs"
        exe = str(caps["interpreter"])
    elif policy.namespaces and drop and caps["namespaces"]:
        mode = "userns"
    elif policy.namespaces and not drop and _namespaces_work(exe, False):
        mode = "rootns" if os.geteuid() == 0 else "userns"
    else:
        mode = "plain"
    keyring = policy.fresh_keyring and bool(caps["fresh_keyring"])
    plan = _Plan(exe=exe, mode=mode, drop=drop, keyring=keyring, seccomp=policy.seccomp and bool(caps["seccomp"]))
    return _launch(code, plan, timeout_s, memory_mb, max_output_chars, scratch_dir, cpu_s, max_procs, disk_mb, policy)


def _launch(
    code: str,
    plan: _Plan,
    timeout_s: float,
    memory_mb: int,
    max_output_chars: int,
    scratch_dir: str | None = None,
    cpu_s: float | None = None,
    max_procs: int = 16,
    disk_mb: int = DEFAULT_DISK_MB,
    policy: SandboxPolicy = SandboxPolicy(),  # noqa: B008 - frozen dataclass
) -> ExecResult:
    fs_mode = plan.mode == "fs"
    owns_scratch = scratch_dir is None
    uid_fd = -1
    host_scratch: str | None = None
    fds: list[int] = []
    proc: subprocess.Popen[bytes] | None = None
    clean = False
    try:
        ids: tuple[int, int] | None = None
        if plan.drop or fs_mode:
            if _lock_dir() is not None:
                uid, uid_fd = _acquire_uid()
                ids = (uid, uid)
            else:
                ids = _nobody()
        if fs_mode:
            scratch = f"/tmp/{SCRATCH_PREFIX}{os.urandom(6).hex()}" if owns_scratch else os.path.abspath(scratch_dir)
            if not owns_scratch:
                os.makedirs(scratch, exist_ok=True)
                if ids is not None:
                    os.chown(scratch, *ids)
        else:
            if owns_scratch:
                host_scratch = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")
                scratch = host_scratch
            else:
                scratch = os.path.abspath(scratch_dir)
                os.makedirs(scratch, exist_ok=True)
            if ids is not None:
                os.chown(scratch, *ids)

        code_fd = os.memfd_create("omni-sbx-code", os.MFD_CLOEXEC)
        fds.append(code_fd)
        os.write(code_fd, code.encode("utf-8"))
        os.lseek(code_fd, 0, os.SEEK_SET)
        status_r, status_w = os.pipe()
        life_r, life_w = os.pipe()  # the runtime holds the only write end: EOF in the sandbox = runtime gone
        fds += [status_r, status_w, life_r, life_w]

        env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "HOME": scratch}
        if not policy.scrub_env:
            env = {**os.environ, **env}
        env["OMNI_SANDBOX_AUDIT"] = "1" if policy.audit_hook else "0"

        limits: dict[int, tuple[int, int]] = {resource.RLIMIT_CORE: (0, 0)}
        if policy.rlimits:
            cpu = math.ceil(cpu_s if cpu_s is not None else timeout_s + 1)
            child_uid = ids[0] if ids else os.getuid()
            nproc = max_procs + (0 if uid_fd >= 0 else _uid_proc_count(child_uid))
            mem = memory_mb * 1024 * 1024
            limits |= {
                resource.RLIMIT_AS: (mem, mem),
                resource.RLIMIT_CPU: (cpu, cpu + 1),
                resource.RLIMIT_NPROC: (nproc, nproc),
                resource.RLIMIT_FSIZE: (FSIZE_LIMIT_BYTES, FSIZE_LIMIT_BYTES),
                resource.RLIMIT_NOFILE: (NOFILE_LIMIT, NOFILE_LIMIT),
            }
        fs_cfg = None
        if fs_mode:
            layout = _fs_layout(plan.exe)
            assert layout is not None
            fs_cfg = {
                **layout,
                "mountpoint": "/tmp",  # inside the private mount namespace only
                "scratch": scratch,
                "rw": None if owns_scratch else scratch,
                "uid": ids[0] if ids else None,
                "quota_bytes": disk_mb * 1024 * 1024,
                "inodes": DISK_INODES,
            }
        cfg = {
            "status_fd": status_w,
            "life_fd": life_r,
            "code_fd": code_fd,
            "scratch": scratch,
            "uid": ids[0] if fs_mode and ids else None,
            "fs": fs_cfg,
            "backstop_s": timeout_s + 5,
            "keyctl_nr": _keyctl_nr() if plan.keyring else None,
            "seccomp": _seccomp_program() if plan.seccomp else None,
        }
        cmd = [plan.exe, "-I", "-u", "-B", "-c", _BOOTSTRAP, repr(cfg)]
        if plan.mode == "fs" or plan.mode == "rootns":
            cmd = _ROOT_NS_PREFIX + cmd
        elif plan.mode == "userns":
            cmd = _user_ns_prefix(ids[0] if ids and plan.drop else os.getuid()) + cmd
        preexec_ids = ids if plan.drop and not fs_mode else None

        start = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd="/" if fs_mode else scratch,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(status_w, life_r, code_fd),
            start_new_session=True,
            preexec_fn=functools.partial(_preexec, limits, preexec_ids, _prctl(), os.getpid()),
        )
        for fd in (status_w, life_r, code_fd):
            os.close(fd)
            fds.remove(fd)
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
            status = os.read(status_r, 4096).decode(errors="replace")
        except BlockingIOError:
            status = ""
        clean = bool(status) and not timed_out and plan.mode != "plain"  # PID 1 ended normally: nothing of U left
        if status.startswith("setup "):
            raise SandboxSetupError(f"code_executor: sandbox setup failed: {status[6:]}")
        returncode, killed = _classify(proc.returncode, status, timed_out, truncated)
        stdout, t1 = _decode_capped(out[0], max_output_chars, out[1])
        stderr, t2 = _decode_capped(err[0], max_output_chars, err[1])
        return ExecResult(stdout, stderr, returncode, timed_out, killed, t1 or t2, round(wall, 3))
    finally:
        if proc is not None and proc.poll() is None:
            _kill_group(proc)
            proc.wait()
        for fd in fds:
            os.close(fd)
        if host_scratch is not None:
            shutil.rmtree(host_scratch, ignore_errors=True)
        if uid_fd >= 0:
            _release_uid(uid_fd, clean)


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


# ---- the launcher: sandboxes are started from a helper process, not from the runtime ------------------------------


class SandboxLauncherError(RuntimeError):
    """The launcher process died or could not be started: the call it carried has no result."""


# Sandboxes run this much nicer than the runtime: model-written code must not take the CPU from the event loop that
# keeps hundreds of model calls in flight. On 2 cores at 256 slots (1 s endpoint) collect efficiency was 0.789 at nice
# 0, 0.851-0.897 at 10 and 0.92 at 19 (docs/scale.md); 10, not 19, so that a code call still gets ~10% of a core when
# the runtime saturates the machine and does not run into its wall-clock limit.
SANDBOX_NICE = 10

_ERRORS = {"SandboxSetupError": SandboxSetupError, "ValueError": ValueError}


class _Launcher:
    """Client side of collect/tools/sandbox_launcher.py: one helper process per runtime process. Requests are written
    under a lock; one reader thread resolves each caller's future from the reply lines (any event loop can await)."""

    def __init__(self, threads: int, cmd: list[str] | None = None):
        self.owner = os.getpid()
        script = str(Path(__file__).with_name("sandbox_launcher.py"))
        self.proc = subprocess.Popen(
            cmd or [sys.executable, "-I", script, __file__, str(self.owner), str(threads), str(SANDBOX_NICE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            # out of the terminal's process group: Ctrl-C is the runtime's to handle; the launcher ends with the
            # runtime's stdin (or its death signal) as always
            start_new_session=True,
        )
        self.lock = threading.Lock()
        self.pending: dict[int, Future] = {}
        self.next_id = 0
        self.dead = False
        threading.Thread(target=self._read, name="sandbox-launcher-reader", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                fut = self.pending.pop(msg.get("id"), None)
            if fut is None or not fut.set_running_or_notify_cancel():  # the caller gave up (a cancelled task)
                continue
            try:
                if "result" in msg:
                    fut.set_result(ExecResult(**msg["result"]))
                else:
                    name, text = msg["error"]
                    fut.set_exception(_ERRORS.get(name, RuntimeError)(text if name in _ERRORS else f"{name}: {text}"))
            except Exception as e:  # noqa: BLE001 - a reply this client cannot read fails its call, not the reader
                if not fut.done():
                    fut.set_exception(SandboxLauncherError(f"unreadable launcher reply: {type(e).__name__}: {e}"))
        with self.lock:
            self.dead = True
            lost, self.pending = list(self.pending.values()), {}
        self.proc.wait()
        for fut in lost:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(SandboxLauncherError(f"sandbox launcher exited ({self.proc.returncode})"))

    def submit(self, code: str, kw: dict) -> Future:
        fut: Future = Future()
        with self.lock:
            if self.dead:
                raise SandboxLauncherError(f"sandbox launcher exited ({self.proc.returncode})")
            i = self.next_id
            self.next_id += 1
            data = (json.dumps({"id": i, "code": code, "kw": kw}) + "\n").encode()
            self.pending[i] = fut
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError) as e:
                self.pending.pop(i, None)
                self.dead = True
                raise SandboxLauncherError(f"sandbox launcher unreachable: {e}") from None
        return fut

    def close(self) -> None:
        with self.lock:
            self.dead = True
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


_launcher: _Launcher | None = None
_launcher_lock = threading.Lock()


def _get_launcher() -> _Launcher:
    global _launcher
    with _launcher_lock:
        if _launcher is None or _launcher.dead or _launcher.owner != os.getpid():
            if _launcher is not None and _launcher.owner == os.getpid():
                _launcher.close()
            _launcher = _Launcher(threads=min(32, (os.cpu_count() or 1) + 4))  # the default thread pool's size
        return _launcher


def _close_launcher() -> None:
    if _launcher is not None and _launcher.owner == os.getpid():
        _launcher.close()


atexit.register(_close_launcher)


async def run_code_async(code: str, **kw) -> ExecResult:
    """`run_code(code, **kw)` run by this process's sandbox launcher (collect/tools/sandbox_launcher.py), awaited
    without a thread. Keyword arguments must be JSON values (the limits are). A launcher that died is restarted at
    the next call; the calls it was carrying raise SandboxLauncherError."""
    import asyncio

    return await asyncio.wrap_future(_get_launcher().submit(code, kw))
