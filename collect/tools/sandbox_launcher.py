"""Main program of the sandbox launcher: a small helper process that starts the code_executor's sandboxes.

    python -I sandbox_launcher.py <path of code_executor.py> <runtime pid> <threads>

It is not imported by the runtime (stdlib only, like sandbox_bootstrap.py): `code_executor.run_code_async` starts one
per runtime process at the first code call. It loads code_executor.py from its path (not through the `collect`
package, so it stays a ~16 MB interpreter) and runs `run_code` in a thread pool, so the fork of every sandbox, its
output pumps and their GIL traffic happen here and not in the runtime's event loop, and it renices itself
(SANDBOX_NICE) so the sandboxes it forks do not take the CPU from the runtime. With sandboxes started from the runtime
at its own priority, 256 slots on the idle 2-core machine had a loop lag of 6.6-6.9 ms per 10 ms tick (2.1-2.4 ms with
the code run in-process, a harness only) and a collect efficiency of 0.797 (in-process: 1.0); docs/scale.md.

Protocol, one JSON object per line: request on stdin {"id": n, "code": "...", "kw": {run_code keyword args}}; reply on
stdout {"id": n, "result": {ExecResult fields}} or {"id": n, "error": [exception type name, message]}.

Lifetime: EOF on stdin (the runtime closed it, or died: it holds the only write end) ends the launcher at once, and so
does the runtime's death through PR_SET_PDEATHSIG. Every sandbox it started then sees its lifeline pipe close (this
process held the write end) and its PID 1 kills it: the chain "runtime gone -> sandboxes gone" is unchanged.
"""

import concurrent.futures
import dataclasses
import importlib.util
import json
import os
import signal
import sys
import threading


def main():
    # Ctrl-C reaches the whole process group: the runtime handles it; this process ends with the runtime's stdin
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    path, parent, threads, nice = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG=SIGKILL
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the runtime died before the prctl
        os._exit(0)
    if nice:
        os.nice(nice)
    spec = importlib.util.spec_from_file_location("omni_sandbox_code_executor", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(mod)

    out = sys.stdout.buffer
    lock = threading.Lock()

    def reply(obj):
        data = (json.dumps(obj) + "\n").encode()
        with lock:
            try:
                out.write(data)
                out.flush()
            except (BrokenPipeError, ValueError):  # the runtime is gone
                os._exit(0)

    def one(req):
        try:
            res = mod.run_code(req["code"], **req["kw"])
            reply({"id": req["id"], "result": dataclasses.asdict(res)})
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the caller, typed by name
            reply({"id": req["id"], "error": [type(e).__name__, str(e)]})

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sandbox")
    for line in sys.stdin.buffer:
        try:
            req = json.loads(line)
        except ValueError:
            continue
        pool.submit(one, req)
    os._exit(0)  # EOF: do not wait for running sandboxes; their lifelines close with this process


if __name__ == "__main__":
    main()
