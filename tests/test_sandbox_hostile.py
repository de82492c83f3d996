"""Hostile-program tests for the code_executor sandbox (issue 16 class 7).

Each test attacks through the public `run_code` only, and each failed on the executor before the private filesystem
view / per-run uid / supervisor existed (checked against that code). Attacks that the in-child audit hook would stop
are also tried through a child interpreter or a shell, which the hook never sees.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from collect.tools.code_executor import SandboxPolicy, _run, run_code, sandbox_capabilities

REPO = Path(__file__).resolve().parents[1]
CAPS = sandbox_capabilities()
needs_fs_view = pytest.mark.skipif(not CAPS.get("fs_view"), reason="private filesystem view unavailable here")


def _pids_with_cmdline(marker: str) -> list[int]:
    """Pids of `/bin/sleep <marker>` processes (exact argv: the runtime's own cmdline may contain the marker)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/cmdline").read_bytes() == f"/bin/sleep\0{marker}\0".encode():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def _wait_for_pid(marker: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = _pids_with_cmdline(marker)
        if pids:
            return pids[0]
        time.sleep(0.05)
    raise AssertionError(f"no process with {marker!r} appeared within {timeout}s")


def _kill_all(marker: str) -> None:
    for pid in _pids_with_cmdline(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _child_map() -> dict[int, list[int]]:
    """parent pid -> its children's pids, over every process now in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    return children


def _descendants(root: int) -> set[int]:
    children = _child_map()
    out, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def _world_dir() -> Path:
    """A fresh host dir any uid may traverse (like a run's OUT dir or a checkout outside /root)."""
    d = Path(tempfile.mkdtemp(prefix="omni-hostile-"))
    d.chmod(0o755)
    return d


# ---- host Unix sockets --------------------------------------------------------------------------------------------


class _UnixServer:
    def __init__(self, path: Path):
        self.path = path
        self.accepted = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        path.chmod(0o777)  # world-writable, as the issue saw
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self):
        self.stop.set()
        self.thread.join(2)
        self.sock.close()
        self.path.unlink(missing_ok=True)


def _unix_connect_code(paths: list[str]) -> str:
    child = (
        "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\n"
        "    print('CONNECTED', sys.argv[1])\nexcept OSError as e:\n    print('BLOCKED', sys.argv[1], e)"
    )
    return (
        "import socket, subprocess, sys\n"
        f"for p in {paths!r}:\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    try:\n        s.connect(p)\n        print('CONNECTED', p)\n"
        "    except OSError as e:\n        print('BLOCKED', p, e)\n"
        f"    r = subprocess.run([sys.executable, '-c', {child!r}, p], capture_output=True, text=True)\n"
        "    print(r.stdout.strip(), r.stderr.strip()[-200:])\n"
    )


def test_host_unix_sockets_unreachable_even_from_a_child_interpreter():
    world = _world_dir()
    servers = [
        _UnixServer(world / "agent.sock"),
        _UnixServer(Path("/tmp") / f"omni-hostile-{uuid.uuid4().hex[:8]}.sock"),
    ]
    try:
        for srv in servers:  # control: the sockets really accept connections from outside the sandbox
            with socket.socket(socket.AF_UNIX) as c:
                c.connect(str(srv.path))
        time.sleep(0.5)
        assert [srv.accepted for srv in servers] == [1, 1]
        res = run_code(_unix_connect_code([str(srv.path) for srv in servers]), timeout_s=20)
        time.sleep(0.5)
        assert "CONNECTED" not in res.stdout, res
        assert res.stdout.count("BLOCKED") == 4, res  # both ways, both sockets were actually tried
        assert [srv.accepted for srv in servers] == [1, 1], res
    finally:
        for srv in servers:
            srv.close()
        for p in world.iterdir():
            p.unlink()
        world.rmdir()


# ---- repository and OUT dir ---------------------------------------------------------------------------------------


def _read_code(paths: list[str]) -> str:
    return (
        "import subprocess\n"
        f"for p in {paths!r}:\n"
        "    try:\n        print('GOT', p, open(p).read()[:200].replace('\\n', ' '))\n"
        "    except OSError as e:\n        print('DENIED', p, type(e).__name__)\n"
        "    r = subprocess.run(['/bin/cat', p], capture_output=True, text=True)\n"
        "    print('CAT', r.returncode, r.stdout[:200].replace('\\n', ' '))\n"
    )


def test_repository_sources_and_out_trajectories_unreadable():
    readme = REPO / "README.md"
    source = REPO / "collect" / "tools" / "code_executor.py"
    out = _world_dir() / "OUT"
    out.mkdir(mode=0o755)
    secret = f"gold-answer-{uuid.uuid4().hex}"
    traj = out / "trajectories.jsonl"
    traj.write_text(f'{{"answer": "{secret}"}}\n')
    traj.chmod(0o644)
    try:
        readme_head = readme.read_text()[:60].split("\n")[0]
        assert readme_head and source.exists()
        res = run_code(_read_code([str(readme), str(source), str(traj)]), timeout_s=20)
        assert res.ok, res
        assert res.stdout.count("DENIED") == 3 and "GOT" not in res.stdout, res
        assert secret not in res.stdout and readme_head not in res.stdout, res
        assert "CAT 0" not in res.stdout, res
        listing = run_code(
            f"import os\ntry:\n    print(os.listdir({str(REPO)!r}))\nexcept OSError as e:\n    print('NO')"
        )
        assert listing.stdout.strip() == "NO", listing
    finally:
        traj.unlink()
        out.rmdir()
        out.parent.rmdir()


# ---- concurrent sandboxes -----------------------------------------------------------------------------------------


def test_concurrent_sandboxes_cannot_read_or_overwrite_each_others_scratch():
    secret = f"secret-{uuid.uuid4().hex}"
    marker = f"3000.{uuid.uuid4().int % 10**9}"  # sleep argument that tags sandbox A's child
    code_a = (
        "import subprocess\n"
        f"open('secret.txt', 'w').write({secret!r})\n"
        f"subprocess.run(['/bin/sleep', {marker!r}])\n"  # the test kills this sleep once B has tried
        "print('A READS', open('secret.txt').read())"
    )
    results: dict[str, object] = {}
    thread = threading.Thread(target=lambda: results.update(a=run_code(code_a, timeout_s=60)), daemon=True)
    thread.start()
    try:
        pid = _wait_for_pid(marker, 30)
        a_scratch = os.readlink(f"/proc/{pid}/cwd")  # the path as A sees it
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{pid}/cwd/secret.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert Path(f"/proc/{pid}/cwd/secret.txt").read_text() == secret  # A's scratch really holds it
        code_b = (
            "import glob, os, subprocess, sys\n"
            f"cands = [{a_scratch + '/secret.txt'!r}] + glob.glob('/tmp/*/secret.txt') + "
            "glob.glob('/proc/*/cwd/secret.txt') + glob.glob(os.path.dirname(os.getcwd()) + '/*/secret.txt')\n"
            "for p in cands:\n"
            "    if os.path.realpath(p).startswith(os.getcwd()):\n        continue\n"
            "    r = subprocess.run(['/bin/cat', p], capture_output=True, text=True)\n"
            "    print('CAT', p, r.returncode, r.stdout)\n"
            "    w = subprocess.run(['/bin/sh', '-c', 'echo pwned > \"$0\"', p], capture_output=True, text=True)\n"
            "    print('WRITE', p, w.returncode, w.stderr.strip())\n"
            "print('TRIED', len(cands))"
        )
        res_b = run_code(code_b, timeout_s=20)
        assert "TRIED" in res_b.stdout, res_b
        assert secret not in res_b.stdout, res_b
    finally:
        _kill_all(marker)
        thread.join(60)
    res_a = results["a"]
    assert f"A READS {secret}" in res_a.stdout, res_a  # not overwritten by B


# ---- supervisor ---------------------------------------------------------------------------------------------------


def _start_host(code: str, marker: str) -> tuple[subprocess.Popen, int]:
    host_src = (
        "import sys\nfrom collect.tools.code_executor import run_code\n"
        f"run_code({code!r}, timeout_s=120)\nprint('HOST DONE')"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    host = subprocess.Popen([sys.executable, "-c", host_src], env=env, cwd=str(REPO))
    return host, _wait_for_pid(marker, 60)


def _sigkill_and_survivors(host: subprocess.Popen, tree: set[int], grace_s: float = 5.0) -> list[int]:
    """SIGKILL `host`, then give its former descendants `grace_s` to go; the pids still alive."""
    os.kill(host.pid, signal.SIGKILL)
    host.wait(10)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in tree):
        time.sleep(0.05)
    return [p for p in tree if os.path.exists(f"/proc/{p}")]


def test_sigkill_of_host_kills_sandbox_and_leaves_no_scratch():
    marker = f"3000.{uuid.uuid4().int % 10**9}"
    code = (
        "import subprocess\nopen('marker.txt', 'w').write('x' * 1000)\n"
        f"subprocess.run(['/bin/sleep', {marker!r}])\nprint('SANDBOX DONE')"
    )
    host, sleeper = _start_host(code, marker)
    try:
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{sleeper}/cwd/marker.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert Path(f"/proc/{sleeper}/cwd/marker.txt").exists()
        scratch = os.readlink(f"/proc/{sleeper}/cwd")
        sandbox = _descendants(host.pid)
        assert sleeper in sandbox
        alive = _sigkill_and_survivors(host, sandbox)
        assert alive == [], f"sandbox processes outlived the SIGKILLed host: {alive}"
        # Its scratch was a tmpfs of the sandbox's own mount namespace: gone with the last process, never on the
        # host's disk (the old executor left /tmp/omni-sbx-* behind).
        assert not os.path.exists(scratch), scratch
        assert not list(Path(tempfile.gettempdir()).glob(f"omni-sbx-{host.pid}-*"))
    finally:
        if host.poll() is None:
            host.kill()
        _kill_all(marker)


# ---- quota --------------------------------------------------------------------------------------------------------


def test_writes_beyond_quota_fail_and_nothing_persists():
    tag = f"omni-quota-{uuid.uuid4().hex[:8]}"
    mib16 = 16 * 1024 * 1024
    code = (
        "import os, subprocess\nwritten = 0\n"
        "for i in range(8):\n"  # 8 x 16 MiB per place = 128 MiB, each file under RLIMIT_FSIZE
        f"    for d in ('/tmp', '/dev/shm'):\n        p = f'{{d}}/{tag}-{{i}}'\n"
        f"        r = subprocess.run(['/bin/sh', '-c', 'head -c {mib16} /dev/zero > \"$0\"', p],"
        " capture_output=True, text=True)\n"
        "        written += os.path.getsize(p) if os.path.exists(p) else 0\n"
        "        print('SH', p, r.returncode, r.stderr.strip()[-80:])\n"
        "    try:\n"
        f"        with open(f'{tag}-{{i}}', 'wb') as f:\n            f.write(bytes({mib16}))\n"
        "    except OSError as e:\n        print('PY', i, e)\n"
        f"    written += os.path.getsize(f'{tag}-{{i}}') if os.path.exists(f'{tag}-{{i}}') else 0\n"
        "print('WRITTEN', written)"
    )
    try:
        res = run_code(code, timeout_s=60)
        written = int(res.stdout.split("WRITTEN")[-1])
        assert written < 3 * 8 * mib16, res  # some write was refused
        assert written <= 64 * 1024 * 1024 + mib16, (written, res)  # ...at about the quota, all places together
        assert "No space left on device" in res.stdout + res.stderr, res
        assert not list(Path("/tmp").glob(f"{tag}*")) and not list(Path("/dev/shm").glob(f"{tag}*"))
        again = run_code(f"import glob\nprint(glob.glob('/tmp/{tag}*') + glob.glob('/dev/shm/{tag}*'))")
        assert again.stdout.strip() == "[]", again
    finally:
        for d in ("/tmp", "/dev/shm"):
            for p in Path(d).glob(f"{tag}*"):
                p.unlink()


@needs_fs_view
def test_private_root_exposes_only_the_system_and_an_empty_tmp():
    res = run_code(
        "import os\nprint(sorted(os.listdir('/')))\n"
        "print(sorted(os.listdir('/tmp')) == [os.path.basename(os.getcwd())])\nprint(os.listdir('/run'))\n"
        "print(os.getuid())"
    )
    lines = res.stdout.splitlines()
    assert set(eval(lines[0])) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "run", "sbin",
                                    "tmp", "usr", "var"}, res  # fmt: skip
    assert lines[1:3] == ["True", "[]"], res
    assert int(lines[3]) >= 1_600_000_000, res


def test_stale_scratch_of_a_dead_runtime_is_removed_at_next_start():
    # Without the fs view the scratch is a host dir named after the runtime's pid; a SIGKILLed runtime cannot remove
    # it, so the next runtime's start-up does. (With the fs view the scratch never touches the host: see above.)
    dead = subprocess.Popen(["/bin/true"])
    dead.wait()
    stale = Path(tempfile.gettempdir()) / f"omni-sbx-{dead.pid}-test{uuid.uuid4().hex[:6]}"
    stale.mkdir()
    (stale / "main.py").write_text("print(1)")
    live = Path(tempfile.gettempdir()) / f"omni-sbx-{os.getpid()}-test{uuid.uuid4().hex[:6]}"
    live.mkdir()
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        start = "from collect.tools.code_executor import run_code\nprint(run_code('print(6 * 7)').stdout)"
        out = subprocess.run([sys.executable, "-c", start], env=env, capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == "42", out
        assert not stale.exists()
        assert live.exists()  # a live runtime's scratch is left alone
    finally:
        for d in (stale, live):
            if d.exists():
                for p in d.iterdir():
                    p.unlink()
                d.rmdir()


# ---- kernel facilities no namespace covers: the session keyring, socket families (issue 52 class 7) ---------------

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.syscall.restype = ctypes.c_long
_KEY_NR = {"x86_64": (248, 250), "aarch64": (217, 219)}  # (add_key, keyctl) syscall numbers
_KEY_SPEC_SESSION_KEYRING = -3
_KEYCTL_GET_KEYRING_ID, _KEYCTL_JOIN_SESSION_KEYRING, _KEYCTL_SEARCH, _KEYCTL_READ, _KEYCTL_INVALIDATE = (
    0,
    1,
    10,
    11,
    21,
)
_KEY_DESC = b"omni-test-runtime-key"


def _keyctl(*args) -> int:
    c_args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    return _LIBC.syscall(ctypes.c_long(_KEY_NR[platform.machine()][1]), *c_args)


def _keyring_attack_code(serial: int) -> str:
    """Sandboxed code that looks for the runtime's key: by its serial, by searching its session keyring for the
    description, and in /proc/keys. Plain ctypes: the audit hook never sees a syscall."""
    return f"""
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
nr = {{"x86_64": 250, "aarch64": 219}}[platform.machine()]
L = ctypes.c_long
def keyctl(*a):
    r = libc.syscall(L(nr), *a)
    return r, ctypes.get_errno() if r < 0 else 0
buf = ctypes.create_string_buffer(4096)
print("SESSION", *keyctl(L({_KEYCTL_GET_KEYRING_ID}), L({_KEY_SPEC_SESSION_KEYRING}), L(0)))
print("READ", *keyctl(L({_KEYCTL_READ}), L({serial}), buf, L(4096)), buf.value.decode(errors="replace"))
found, err = keyctl(L({_KEYCTL_SEARCH}), L({_KEY_SPEC_SESSION_KEYRING}), ctypes.c_char_p(b"user"),
                    ctypes.c_char_p({_KEY_DESC!r}), L(0))
print("SEARCH", found, err)
if found > 0:
    print("READ-FOUND", *keyctl(L({_KEYCTL_READ}), L(found), buf, L(4096)), buf.value.decode(errors="replace"))
try:
    print("PROCKEYS", open("/proc/keys").read().replace(chr(10), " | "))
except OSError as e:
    print("PROCKEYS", e)
"""


@pytest.fixture()
def runtime_key():
    """A secret in this (runtime) process's session keyring, as a runtime started from a login session, a container
    entrypoint or a `keyctl`-using wrapper holds; every process it starts inherits the keyring (fork, unshare,
    setuid keep it). Yields (serial, secret, this process's session keyring id)."""
    if platform.machine() not in _KEY_NR:
        pytest.skip(f"keyring syscall numbers are known here for {sorted(_KEY_NR)} only, not {platform.machine()}")
    # a fresh session keyring for this test process first, so the key never lands in one shared with other processes
    if _keyctl(_KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        err = ctypes.get_errno()
        if err == errno.ENOSYS:
            pytest.skip("this kernel has no keyrings (CONFIG_KEYS off): nothing for a sandbox to inherit")
        raise OSError(err, f"keyctl(JOIN_SESSION_KEYRING): {os.strerror(err)}")
    session = _keyctl(_KEYCTL_GET_KEYRING_ID, _KEY_SPEC_SESSION_KEYRING, 0)
    secret = f"omni-keyring-secret-{uuid.uuid4().hex}".encode()
    add_key = ctypes.c_long(_KEY_NR[platform.machine()][0])
    serial = _LIBC.syscall(add_key, ctypes.c_char_p(b"user"), ctypes.c_char_p(_KEY_DESC), ctypes.c_char_p(secret),
                           ctypes.c_size_t(len(secret)), ctypes.c_long(_KEY_SPEC_SESSION_KEYRING))  # fmt: skip
    assert serial > 0, os.strerror(ctypes.get_errno())
    # the attack's premise, outside any sandbox: a plain child process (fork + exec) reads the key
    plain = subprocess.run([sys.executable, "-I", "-c", _keyring_attack_code(serial)], capture_output=True, text=True)
    assert secret.decode() in plain.stdout, plain
    yield serial, secret.decode(), session
    _keyctl(_KEYCTL_INVALIDATE, serial)


def _lines(res) -> dict[str, list[str]]:
    return {line.split()[0]: line.split()[1:] for line in res.stdout.splitlines() if line.strip()}


def test_sandbox_cannot_read_a_key_in_the_runtimes_session_keyring(runtime_key):
    serial, secret, session = runtime_key
    res = run_code(_keyring_attack_code(serial))
    assert res.ok, res
    assert secret not in res.stdout + res.stderr, res
    out = _lines(res)
    assert int(out["READ"][0]) < 0 and int(out["SEARCH"][0]) < 0, res
    assert _KEY_DESC.decode() not in " ".join(out["PROCKEYS"]), res  # not even its description is visible


def test_fresh_session_keyring_alone_hides_the_runtimes_key(runtime_key):
    serial, secret, session = runtime_key
    res = _run(_keyring_attack_code(serial), SandboxPolicy(seccomp=False))
    out = _lines(res)
    assert secret not in res.stdout + res.stderr, res
    assert int(out["SESSION"][0]) > 0 and int(out["SESSION"][0]) != session, res  # a keyring of its own
    assert int(out["READ"][0]) < 0 and int(out["SEARCH"][0]) < 0, res
    assert _KEY_DESC.decode() not in " ".join(out["PROCKEYS"]), res


def test_seccomp_alone_refuses_every_keyring_call(runtime_key):
    serial, secret, session = runtime_key
    res = _run(_keyring_attack_code(serial), SandboxPolicy(fresh_keyring=False))
    out = _lines(res)
    assert secret not in res.stdout + res.stderr, res
    for call in ("SESSION", "READ", "SEARCH"):
        assert out[call][:2] == ["-1", str(errno.EPERM)], (call, res)


def test_control_keyring_attack_works_with_every_other_mechanism_on(runtime_key):
    # the case: fs view, per-run uid, namespaces, audit hook all on; only the two keyring layers off
    serial, secret, session = runtime_key
    res = _run(_keyring_attack_code(serial), SandboxPolicy(seccomp=False, fresh_keyring=False))
    assert secret in res.stdout, res


def _vsock_code(port: int) -> str:
    # in a child interpreter, so the audit hook (which refuses socket.bind in the sandbox's own interpreter) is out
    inner = (
        "import socket\ntry:\n    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\nexcept OSError as e:\n"
        "    print('CREATE-REFUSED', e.errno)\n    raise SystemExit\n"
        f"s.bind((socket.VMADDR_CID_ANY, {port}))\ns.listen(1)\nprint('BOUND', s.getsockname())\n"
    )
    return (
        f"import subprocess, sys\nr = subprocess.run([sys.executable, '-I', '-c', {inner!r}], capture_output=True, "
        "text=True)\nprint(r.stdout.strip(), r.stderr.strip()[-300:])"
    )


@pytest.fixture()
def vsock_port() -> int:
    """A free vsock port, or a skip when this kernel has no AF_VSOCK at all."""
    if not hasattr(socket, "AF_VSOCK"):
        pytest.skip("this Python has no socket.AF_VSOCK")
    try:
        s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    except OSError as e:
        pytest.skip(f"this kernel offers no AF_VSOCK sockets ({e}): nothing to refuse")
    with s:
        s.bind((socket.VMADDR_CID_ANY, socket.VMADDR_PORT_ANY))
        return s.getsockname()[1]  # released at close: the sandbox binds it next


def test_sandbox_cannot_create_or_bind_a_vsock_socket(vsock_port):
    res = run_code(_vsock_code(vsock_port))
    assert res.stdout.startswith(f"CREATE-REFUSED {errno.EPERM}"), res


def test_control_vsock_bind_works_without_the_seccomp_filter(vsock_port):
    # the network namespace does not cover vsock: with every mechanism but seccomp on, the bind succeeds
    res = _run(_vsock_code(vsock_port), SandboxPolicy(seccomp=False))
    assert res.stdout.startswith("BOUND"), res


def test_only_unix_sockets_can_be_created_in_the_sandbox():
    code = (
        "import socket\nopened = []\n"
        "for fam in range(64):\n"
        "    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW, socket.SOCK_SEQPACKET):\n"
        "        try:\n            socket.socket(fam, kind).close()\n            opened.append((fam, kind))\n"
        "        except OSError as e:\n            if fam != socket.AF_UNIX and e.errno != 1:\n"
        "                opened.append((fam, kind, e.errno))\n"
        "print('OTHER', sorted({o[0] for o in opened if o[0] != socket.AF_UNIX}))\n"
        "a, b = socket.socketpair()\na.sendall(b'ping')\nprint('PAIR', b.recv(4).decode())\n"
        "try:\n    socket.socketpair(socket.AF_INET)\n    print('INETPAIR open')\nexcept OSError as e:\n"
        "    print('INETPAIR', e.errno)\n"
    )
    res = run_code(code)
    # every family but AF_UNIX is refused by the filter itself (EPERM), before the kernel looks for (or loads) it
    assert _lines(res) == {"OTHER": ["[]"], "PAIR": ["ping"], "INETPAIR": [str(errno.EPERM)]}, res


def test_io_uring_cannot_be_set_up_to_open_sockets_around_the_filter():
    # io_uring's IORING_OP_SOCKET creates sockets without the socket() syscall: the ring itself is refused
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
        "params = ctypes.create_string_buffer(120)\n"
        "r = libc.syscall(ctypes.c_long(425), ctypes.c_long(4), params)\nprint('URING', r, ctypes.get_errno())\n"
    )
    res = run_code(code)
    assert _lines(res)["URING"] == ["-1", str(errno.EPERM)], res
    control = _run(code, SandboxPolicy(seccomp=False))
    r, err = (int(x) for x in _lines(control)["URING"])
    if r < 0 and err in (errno.ENOSYS, errno.EPERM):
        pytest.skip(f"io_uring is off on this kernel (errno {err}): the control cannot show the ring")
    assert r >= 0, control


_I386_SOCKET_VSOCK = bytes.fromhex(  # push rbx; eax=359 (i386 socket); ebx=40 (AF_VSOCK); ecx=1; edx=0; int 0x80
    "53b867010000bb28000000b90100000031d2cd805bc3"
)


def _other_abi_code() -> str:
    """The socket syscall through the two other ABIs an x86_64 kernel may offer: x32 (syscall number | 0x40000000)
    and i386 (`int 0x80`, from mapped machine code), each in its own child interpreter."""
    x32 = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
        "r = libc.syscall(ctypes.c_long(0x40000000 | 41), ctypes.c_long(40), ctypes.c_long(1), ctypes.c_long(0))\n"
        "print(r, ctypes.get_errno())"
    )
    i386 = (
        "import ctypes, mmap\nm = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        f"m.write({_I386_SOCKET_VSOCK!r})\n"
        "f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))\nprint(f(), 0)"
    )
    return (
        "import subprocess, sys\n"
        f"for name, src in (('X32', {x32!r}), ('I386', {i386!r})):\n"
        "    r = subprocess.run([sys.executable, '-I', '-c', src], capture_output=True, text=True)\n"
        "    print(name, r.returncode, r.stdout.strip() or '- -')\n"
    )


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x32 and i386 are x86_64's other syscall ABIs")
def test_other_syscall_abis_cannot_bypass_the_filter():
    res = run_code(_other_abi_code())
    out = _lines(res)
    # killed by the filter (SIGSYS), or by the CPU where the kernel lacks the ABI (SIGSEGV); never a socket
    assert int(out["X32"][0]) == -signal.SIGSYS, res
    assert int(out["I386"][0]) in (-signal.SIGSYS, -signal.SIGSEGV), res
    control = _lines(_run(_other_abi_code(), SandboxPolicy(seccomp=False)))
    if control["I386"][0] != "0":
        pytest.skip(f"no i386 syscall ABI on this kernel (int 0x80 ended the process: {control['I386']})")
    assert int(control["I386"][1]) >= 0, control  # the control opened a vsock socket through int 0x80


def _sysv_shm_code(key: int) -> str:
    return (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"print('HOST', libc.shmget({key}, 0, 0), ctypes.get_errno())\n"
        f"print('NEW', libc.shmget({key} + 1, 1 << 20, 0o1000 | 0o600), ctypes.get_errno())\n"
    )


@needs_fs_view
def test_sysv_ipc_of_the_host_is_out_of_reach_and_nothing_outlives_the_sandbox():
    # SysV shared memory lives in the IPC namespace, not in any file: without an IPC namespace of its own the sandbox
    # opened the host's world-writable segment and left a 1 MiB segment behind (RAM outside memory_mb and the quota)
    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x5EED0000 + (os.getpid() & 0xFFF) * 16
    shmid = libc.shmget(key, 4096, 0o1000 | 0o666)  # IPC_CREAT, world read/write, as a careless host process does
    assert shmid >= 0, os.strerror(ctypes.get_errno())
    try:
        res = run_code(_sysv_shm_code(key))
        out = _lines(res)
        assert out["HOST"] == ["-1", str(errno.ENOENT)], res  # no such key in the sandbox's namespace
        assert int(out["NEW"][0]) >= 0, res  # it may use SysV IPC inside ...
        assert libc.shmget(key + 1, 0, 0) == -1 and ctypes.get_errno() == errno.ENOENT  # ... which dies with it
    finally:
        libc.shmctl(shmid, 0, None)  # IPC_RMID
        left = libc.shmget(key + 1, 0, 0)
        if left >= 0:
            libc.shmctl(left, 0, None)
