"""Tests for collect.tools.code_executor: every protection is attacked and must hold.

Where a property is guarded by two layers, one test per layer switches the other layer off (via the private
`_run(code, SandboxPolicy(...))`) so each layer is proven on its own, and a control run with the protections off shows
the attack itself works (so the protected assertions cannot pass vacuously).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import tracemalloc
import uuid
from pathlib import Path

import pytest

from collect.tools.code_executor import SandboxPolicy, _run, run_code, sandbox_capabilities

CAPS = sandbox_capabilities()
needs_ns = pytest.mark.skipif(not CAPS["namespaces"], reason="unshare namespaces unavailable here")
needs_drop = pytest.mark.skipif(not CAPS["drop_to_nobody"], reason="not root / no interpreter readable by nobody")


def _procs_with_cmdline(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker in Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry))
            except OSError:
                pass
    return found


def test_normal_datetime_computation_returns_stdout():
    code = (
        "import datetime as d\nprint((d.date(2024, 3, 1) - d.date(2024, 2, 1)).days)\n"
        "print(d.date(2024, 2, 29).isoformat())"
    )
    res = run_code(code)
    assert res.ok, res
    assert res.stdout == "29\n2024-02-29\n"
    assert res.returncode == 0 and res.killed is None and not res.truncated
    assert "29" in res.to_observation_text()


def test_scratch_dir_is_cwd_writable_and_removed_afterwards():
    res = run_code("import os\nopen('notes.txt', 'w').write('hi')\nprint(os.getcwd())")
    assert res.ok, res
    scratch = res.stdout.strip()
    assert not os.path.exists(scratch)


def test_infinite_loop_killed_at_wall_clock_limit():
    res = run_code("while True:\n    pass", timeout_s=1.5)
    assert res.timed_out and res.killed == "timeout" and not res.ok
    assert 1.4 <= res.wall_s < 3.0, res.wall_s


def test_cpu_limit_kills_busy_loop_before_wall_limit():
    res = run_code("while True:\n    pass", timeout_s=8, cpu_s=1)
    assert res.killed == "cpu" and not res.timed_out, res
    assert res.wall_s < 6


def test_memory_bomb_killed_by_address_space_limit():
    code = (
        "chunks = []\nwhile True:\n    chunks.append(bytearray(32 * 1024 * 1024))\n    print(len(chunks), flush=True)"
    )
    res = run_code(code, memory_mb=256, timeout_s=10)
    assert res.killed == "memory" and not res.timed_out, res
    assert "MemoryError" in res.stderr
    assert int(res.stdout.split()[-1]) < 256 // 32  # never got near 256 MiB of chunks


def test_fork_bomb_contained_and_no_process_survives():
    marker = f"25.{uuid.uuid4().int % 10**9}"  # sleep argument that tags this test's children; bounded if they leak
    code = (
        "import os\nn = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n    except OSError:\n"
        "        break\n    if pid == 0:\n        os.setsid()\n"  # setsid: escape the process group on purpose
        f"        os.execv('/bin/sleep', ['sleep', '{marker}'])\n    n += 1\nprint(n)"
    )
    try:
        res = run_code(code, max_procs=16, timeout_s=10)
        assert res.ok, res
        assert int(res.stdout) <= 16  # the sandbox's own interpreters count too
        time.sleep(0.2)
        assert _procs_with_cmdline(marker) == [], "forked children outlived the sandbox"
    finally:
        for pid in _procs_with_cmdline(marker):  # on failure: do not leave the bomb behind
            try:
                os.kill(pid, 9)
            except OSError:
                pass
    assert run_code("print(6 * 7)").stdout == "42\n"  # machine still usable


def test_huge_output_truncated_and_parent_memory_bounded():
    tracemalloc.start()
    try:
        res = run_code("import sys\nfor _ in range(50):\n    sys.stdout.write('y' * 1_000_000)", max_output_chars=1000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert res.ok and res.truncated
    assert res.stdout == "y" * 1000
    assert peak < 5_000_000, f"parent buffered {peak} bytes for 50 MB of output"


@pytest.fixture()
def loopback_server():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    accepted: list[bool] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            accepted.append(True)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield srv.getsockname()[1], accepted
    stop.set()
    thread.join(2)
    srv.close()


def _connect_code(port: int) -> str:
    return (
        "import socket\ntry:\n    s = socket.socket()\n    s.settimeout(2)\n"
        f"    s.connect(('127.0.0.1', {port}))\n    print('CONNECTED')\nexcept Exception as e:\n"
        "    print('BLOCKED', type(e).__name__, e)"
    )


def test_network_loopback_server_unreachable(loopback_server):
    port, accepted = loopback_server
    res = run_code(_connect_code(port))
    assert res.stdout.startswith("BLOCKED"), res
    time.sleep(0.3)
    assert accepted == []


@needs_ns
def test_network_namespace_alone_blocks_loopback(loopback_server):
    port, accepted = loopback_server
    res = _run(_connect_code(port), SandboxPolicy(audit_hook=False, seccomp=False))
    assert res.stdout.startswith("BLOCKED") and "sandbox" not in res.stdout, res
    time.sleep(0.3)
    assert accepted == []


def test_audit_hook_alone_blocks_loopback(loopback_server):
    port, accepted = loopback_server
    res = _run(_connect_code(port), SandboxPolicy(namespaces=False, seccomp=False))
    assert res.stdout.startswith("BLOCKED PermissionError sandbox: network access is refused"), res
    time.sleep(0.3)
    assert accepted == []


def test_seccomp_alone_blocks_loopback(loopback_server):
    # the filter refuses the AF_INET socket itself: nothing to connect with, even from a child interpreter
    port, accepted = loopback_server
    res = _run(_connect_code(port), SandboxPolicy(namespaces=False, audit_hook=False))
    assert res.stdout.startswith("BLOCKED PermissionError [Errno 1] Operation not permitted"), res
    time.sleep(0.3)
    assert accepted == []


def test_control_loopback_reachable_without_network_protections(loopback_server):
    port, accepted = loopback_server
    res = _run(_connect_code(port), SandboxPolicy(namespaces=False, audit_hook=False, seccomp=False))
    assert res.stdout.startswith("CONNECTED"), res
    time.sleep(0.3)
    assert accepted == [True]


def _write_code(target: Path) -> str:
    return (
        f"try:\n    open({str(target)!r}, 'w').write('pwned')\n    print('WROTE')\n"
        "except OSError as e:\n    print('DENIED', e)"
    )


@pytest.fixture()
def outside_targets(tmp_path):
    """A path in a dir the test owns (0700) and one directly in world-writable /tmp."""
    shared = Path("/tmp") / f"omni-sbx-test-{uuid.uuid4().hex}.txt"
    yield tmp_path / "owned.txt", shared
    shared.unlink(missing_ok=True)


def test_write_outside_scratch_fails_and_file_absent(outside_targets):
    for target in outside_targets:
        res = run_code(_write_code(target))
        assert res.stdout.startswith("DENIED"), (target, res)
        assert not target.exists()
    res = run_code(
        "import os\ntry:\n    os.mkdir('/tmp/omni-sbx-evil-dir')\nexcept OSError as e:\n    print('DENIED', e)"
    )
    assert res.stdout.startswith("DENIED") and not os.path.exists("/tmp/omni-sbx-evil-dir")


@needs_drop
def test_unprivileged_user_alone_blocks_write_to_owned_dir(outside_targets):
    owned, _ = outside_targets
    res = _run(_write_code(owned), SandboxPolicy(audit_hook=False, fs_view=False))  # the path exists in this view
    assert res.stdout.startswith("DENIED") and "sandbox" not in res.stdout, res
    assert not owned.exists()


def test_audit_hook_alone_blocks_write(outside_targets):
    for target in outside_targets:
        res = _run(_write_code(target), SandboxPolicy(drop_privileges=False, namespaces=False))
        assert res.stdout.startswith("DENIED sandbox: writing outside the scratch dir"), res
        assert not target.exists()


def test_control_write_succeeds_without_protections(outside_targets):
    owned, _ = outside_targets
    res = _run(_write_code(owned), SandboxPolicy(drop_privileges=False, namespaces=False, audit_hook=False))
    assert res.stdout.startswith("WROTE") and owned.read_text() == "pwned"


def _env_probe_code() -> str:
    return (
        "import os, json\nseen = {'env': dict(os.environ), 'proc': {}}\n"
        f"for pid in sorted({{os.getppid(), 1, {os.getpid()}}}):\n"
        "    try:\n        seen['proc'][pid] = open(f'/proc/{pid}/environ', 'rb').read().decode(errors='replace')\n"
        "    except OSError as e:\n        seen['proc'][pid] = 'ERR ' + type(e).__name__\n"
        "print(json.dumps(seen))"
    )


def test_host_env_and_parent_proc_environ_invisible(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    res = run_code(_env_probe_code())
    assert res.ok, res
    seen = json.loads(res.stdout)
    assert set(seen["env"]) <= {"PATH", "LANG", "HOME"}
    assert "sk-test-secret" not in res.stdout
    assert "OPENAI_API_KEY" not in res.stdout


@needs_drop
def test_runtime_proc_environ_unreadable_without_namespaces(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    res = _run(_env_probe_code(), SandboxPolicy(namespaces=False, audit_hook=False))
    assert "sk-test-secret" not in res.stdout, res
    assert json.loads(res.stdout)["proc"][str(os.getpid())].startswith("ERR")


def test_control_secret_visible_without_env_scrub(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    res = _run(_env_probe_code(), SandboxPolicy(scrub_env=False))
    assert json.loads(res.stdout)["env"].get("OPENAI_API_KEY") == "sk-test-secret"


def test_bad_limits_rejected_with_field_names():
    with pytest.raises(ValueError, match="timeout_s=0"):
        run_code("print(1)", timeout_s=0)
