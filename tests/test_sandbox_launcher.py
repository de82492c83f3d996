"""The sandbox launcher (collect/tools/sandbox_launcher.py): the runtime's code calls start their sandboxes from one
helper process per runtime process, at a lower CPU priority, and the "runtime gone -> sandboxes gone" chain holds
through it (SIGKILL of the runtime, death of the launcher)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from collect.tools import ToolBox, ToolsConfig, code_executor
from collect.tools.code_executor import SandboxLauncherError, run_code_async
from tests.test_sandbox_hostile import REPO, _child_map, _descendants, _kill_all, _sigkill_and_survivors, _wait_for_pid
from tests.test_tools import _video_task


def _children(pid: int) -> list[int]:
    return _child_map().get(pid, [])


def test_sandboxes_start_from_one_launcher_process_not_from_the_runtime():
    marker = f"3001.{uuid.uuid4().int % 10**9}"

    async def main():
        first = await run_code_async("print(6 * 7)", timeout_s=20)
        launcher = code_executor._launcher
        task = _video_task()  # through the tool, as the runtime calls it
        box = ToolBox(task, task.to_context(), ToolsConfig(code_timeout_s=60))
        code = f"import subprocess\nsubprocess.run(['/bin/sleep', {marker!r}])\nprint('slept')"
        slow = asyncio.create_task(box.execute("code_executor", {"code": code}))
        sleeper = await asyncio.to_thread(_wait_for_pid, marker, 30)
        in_launcher = sleeper in _descendants(launcher.proc.pid)
        direct = set(_children(os.getpid()))
        _kill_all(marker)
        _, obs = await slow
        assert obs.ok and obs.items == ("slept",)
        again = await run_code_async("print(1)", timeout_s=20)
        return first, launcher, in_launcher, direct, again

    try:
        first, launcher, in_launcher, direct, again = asyncio.run(main())
    finally:
        _kill_all(marker)
    assert first.stdout.strip() == "42" and first.returncode == 0
    assert in_launcher, "the sandbox is not a descendant of the launcher"
    # the runtime's only child for code is the launcher: no unshare/python sandbox hangs off the runtime itself
    assert launcher.proc.pid in direct
    assert not any(p in direct for p in _descendants(launcher.proc.pid))
    assert again.returncode == 0 and code_executor._launcher is launcher  # started once, reused


def test_concurrent_calls_get_their_own_results():
    async def main():
        return await asyncio.gather(*(run_code_async(f"print({i} * 3)", timeout_s=30) for i in range(12)))

    results = asyncio.run(main())
    assert [r.stdout.strip() for r in results] == [str(i * 3) for i in range(12)]


def test_sandbox_runs_below_the_runtime_priority():
    res = asyncio.run(run_code_async("import os\nprint(os.nice(0))", timeout_s=20))
    assert res.returncode == 0, res
    assert code_executor.SANDBOX_NICE > 0
    assert int(res.stdout.strip()) == min(19, os.nice(0) + code_executor.SANDBOX_NICE)


def test_errors_keep_their_type_through_the_launcher():
    with pytest.raises(ValueError, match="bad limits"):
        asyncio.run(run_code_async("print(1)", timeout_s=-1))


def test_a_dead_launcher_fails_its_calls_and_is_replaced():
    marker = f"3002.{uuid.uuid4().int % 10**9}"

    async def main():
        await run_code_async("print(0)", timeout_s=20)
        old = code_executor._launcher
        call = asyncio.create_task(
            run_code_async(f"import subprocess\nsubprocess.run(['/bin/sleep', {marker!r}])", timeout_s=60)
        )
        sleeper = await asyncio.to_thread(_wait_for_pid, marker, 30)
        os.kill(old.proc.pid, signal.SIGKILL)
        with pytest.raises(SandboxLauncherError):
            await call
        deadline = time.monotonic() + 5  # its sandbox went with it (lifeline EOF -> PID 1 exits)
        while os.path.exists(f"/proc/{sleeper}") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        gone = not os.path.exists(f"/proc/{sleeper}")
        res = await run_code_async("print(5)", timeout_s=20)
        return old, gone, res

    try:
        old, gone, res = asyncio.run(main())
    finally:
        _kill_all(marker)
    assert gone, "the sandbox outlived its launcher"
    assert res.stdout.strip() == "5" and code_executor._launcher is not old


def test_sigkill_of_the_runtime_takes_launcher_and_sandbox_down():
    marker = f"3003.{uuid.uuid4().int % 10**9}"
    code = f"import subprocess\nsubprocess.run(['/bin/sleep', {marker!r}])"
    host_src = (
        "import asyncio\nfrom collect.tools.code_executor import run_code_async\n"
        f"asyncio.run(run_code_async({code!r}, timeout_s=120))\nprint('HOST DONE')"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    host = subprocess.Popen([sys.executable, "-c", host_src], env=env, cwd=str(REPO))
    try:
        sleeper = _wait_for_pid(marker, 60)
        tree = _descendants(host.pid)
        assert sleeper in tree and len(tree) >= 3  # launcher -> unshare -> ... -> sleep
        alive = _sigkill_and_survivors(host, tree)
        assert alive == [], f"launcher or sandbox processes outlived the SIGKILLed runtime: {alive}"
    finally:
        if host.poll() is None:
            host.kill()
        _kill_all(marker)


def test_unreadable_replies_fail_their_own_call_and_nothing_else():
    """A launcher that answers garbage (a result with unknown fields, a line that is not JSON) fails exactly the
    calls it garbled; the reader keeps going and the next well-formed reply still arrives."""
    ok = {"stdout": "ok", "stderr": "", "returncode": 0, "timed_out": False, "killed": None, "truncated": False}
    fake = (
        "import sys, json\n"
        "for line in sys.stdin:\n"
        "    i = json.loads(line)['id']\n"
        "    if i == 0: print(json.dumps({'id': 0, 'result': {'bogus': 1}}), flush=True)\n"
        "    elif i == 1: print('not json at all', flush=True)\n"
        "    if i == 1: print(json.dumps({'id': 1, 'error': ['ValueError', 'x']}), flush=True)\n"
        f"    if i > 1: print(json.dumps({{'id': i, 'result': {{**{ok!r}, 'wall_s': 0.0}}}}), flush=True)\n"
    )
    la = code_executor._Launcher(1, cmd=[sys.executable, "-c", fake])
    try:
        with pytest.raises(SandboxLauncherError, match="unreadable"):
            la.submit("a", {}).result(10)
        with pytest.raises(ValueError, match="x"):
            la.submit("b", {}).result(10)
        assert la.submit("c", {}).result(10).stdout == "ok"
    finally:
        la.close()
    assert la.dead
