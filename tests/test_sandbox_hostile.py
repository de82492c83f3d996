"""Hostile-program tests for the code_executor sandbox (issue 16 class 7).

Each test attacks through the public `run_code` only, and each failed on the executor before the private filesystem
view / per-run uid / supervisor existed (checked against that code). Attacks that the in-child audit hook would stop
are also tried through a child interpreter or a shell, which the hook never sees.
"""

from __future__ import annotations

import os
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

from collect.tools.code_executor import run_code, sandbox_capabilities

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
