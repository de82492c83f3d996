"""Main program of every sandboxed child (`python -I -u -B -c <this file's text> <json config>`).

It is not imported by the runtime: code_executor.py reads this file's text and passes it with `-c`, so it must stay
self-contained (stdlib only, no project imports; the project is not even visible from inside the sandbox).

Steps, as PID 1 of the sandbox's PID namespace when namespaces are on:
1. With a private filesystem view (`cfg["fs"]`; we are host root inside a fresh mount namespace): build a minimal root
   on a tmpfs from read-only bind mounts (/usr, /etc, the interpreter's prefix), a tiny /dev, the sandbox's own /proc
   and ONE size-capped tmpfs that backs /tmp, /dev/shm and the scratch dir (so the quota is a total), pivot_root into
   it and detach the host's root. Nothing else of the host (the repository, the run's OUT dir, /run's sockets, other
   sandboxes' scratch) exists in this view.
2. Leave the runtime's kernel state behind: join a fresh anonymous session keyring (`cfg["keyctl_nr"]`; the runtime's
   session keyring and every key in it would otherwise be inherited through fork, unshare and setuid), then install
   the seccomp filter (`cfg["seccomp"]`, built by code_executor._seccomp_program: only AF_UNIX sockets, no keyring
   syscalls, no io_uring, no other syscall ABI), which this process and everything it starts keep.
   Install the audit hook (defence in depth only).
3. Fork. The child drops to the run's own uid (when `cfg["uid"]` is set), sets no_new_privs and PR_SET_PDEATHSIG,
   writes the code into the scratch dir and execs it. This process waits for it and writes its true exit status to
   the status fd (`unshare --fork` does not propagate a death-by-signal reliably).
4. A watchdog thread kills the sandbox when the runtime dies (the lifeline pipe reaches EOF: the runtime holds its only
   write end) or at the wall-clock backstop. As PID 1, exiting is enough: the kernel then kills every process in the
   namespace. The scratch tmpfs lives only in this mount namespace, so it is freed with it.
"""

import os
import select
import sys
import threading

_cfg = eval(sys.argv[1], {"__builtins__": {}})  # a dict literal the runtime wrote (json would cost ~20 ms of imports)
_status_fd = _cfg["status_fd"]
_life_fd = _cfg["life_fd"]
_code_fd = _cfg["code_fd"]
SETUP_ERROR_EXIT = 87


def _fail_setup(msg):
    os.write(_status_fd, f"setup {msg}".encode()[:4000])
    os._exit(SETUP_ERROR_EXIT)


def _build_fs_view(fs):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ms_rdonly, ms_nosuid, ms_nodev, ms_noexec = 1, 2, 4, 8
    ms_remount, ms_bind = 32, 4096
    o_path = 0o10000000

    def mount(src, dst, fstype, flags, data=None):
        enc = [None if x is None else os.fsencode(x) for x in (src, dst, fstype, data)]
        if libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount {src} -> {dst} ({fstype}): {os.strerror(err)}")

    def bind(src_fd, dst, flags):
        mount(f"/proc/self/fd/{src_fd}", dst, None, ms_bind)
        mount(None, dst, None, ms_remount | ms_bind | flags)

    # Open every host source first: once the new root is mounted, binds come from these fds, not from host paths.
    sources = {p: os.open(p, o_path | os.O_CLOEXEC) for p in fs["ro"] + fs["dev"] + ["/proc"]}
    if fs["rw"]:
        sources[fs["rw"]] = os.open(fs["rw"], o_path | os.O_CLOEXEC)
    root = fs["mountpoint"]
    mount("tmpfs", root, "tmpfs", ms_nosuid | ms_nodev, "size=256k,nr_inodes=512,mode=755")
    for d in ("proc", "dev", "tmp", "run", "var", "scratch-w"):
        os.mkdir(f"{root}/{d}")
    for name, target in fs["links"]:
        os.symlink(target, f"{root}/{name}")
    os.symlink("../tmp", f"{root}/var/tmp")
    os.symlink("../run", f"{root}/var/run")
    ro = ms_rdonly | ms_nosuid | ms_nodev
    for path in fs["ro"]:
        os.makedirs(root + path, exist_ok=True)
        bind(sources[path], root + path, ro)
    bind(sources["/proc"], f"{root}/proc", ms_nosuid | ms_nodev | ms_noexec)
    mount("tmpfs", f"{root}/dev", "tmpfs", ms_nosuid | ms_noexec, "size=64k,nr_inodes=64,mode=755")
    for path in fs["dev"]:
        open(root + path, "x").close()
        bind(sources[path], root + path, ms_nosuid | ms_noexec)
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{root}/dev/{name}")
    os.symlink("/proc/self/fd", f"{root}/dev/fd")
    os.mkdir(f"{root}/dev/shm")
    # One quota for every writable place: /tmp, /dev/shm and the scratch dir are bind mounts of this one tmpfs.
    w = f"{root}/scratch-w"
    mount("tmpfs", w, "tmpfs", ms_nosuid | ms_nodev, f"size={fs['quota_bytes']},nr_inodes={fs['inodes']},mode=700")
    for sub in ("tmp", "shm"):
        os.mkdir(f"{w}/{sub}")
        os.chmod(f"{w}/{sub}", 0o1777)
    mount(f"{w}/tmp", f"{root}/tmp", None, ms_bind)
    mount(f"{w}/shm", f"{root}/dev/shm", None, ms_bind)
    scratch = fs["scratch"]
    if fs["rw"]:  # a caller-given scratch dir: the host dir itself, bound read-write (only RLIMIT_FSIZE caps it)
        os.makedirs(root + scratch, exist_ok=True)
        bind(sources[fs["rw"]], root + scratch, ms_nosuid | ms_nodev)
    else:
        os.mkdir(root + scratch, 0o700)
    if fs["uid"] is not None:
        os.chown(root + scratch, fs["uid"], fs["uid"])
    os.chdir(root)
    if libc.syscall(fs["pivot_root_nr"], b".", b".") != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"pivot_root: {os.strerror(err)}")
    if libc.umount2(b".", 2) != 0:  # MNT_DETACH: the host's root (stacked under the new one) is gone from this view
        err = ctypes.get_errno()
        raise OSError(err, f"umount old root: {os.strerror(err)}")
    os.chdir("/")
    if libc.umount2(b"/scratch-w", 2) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount staging tmpfs: {os.strerror(err)}")
    os.rmdir("/scratch-w")
    mount(None, "/", None, ms_remount | ms_bind | ro)
    for fd in sources.values():
        os.close(fd)


def _harden(keyctl_nr, seccomp):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    L = ctypes.c_ulong
    if keyctl_nr is not None:
        # KEYCTL_JOIN_SESSION_KEYRING(NULL): a new anonymous session keyring, owned by this process alone
        if libc.syscall(ctypes.c_long(keyctl_nr), ctypes.c_long(1), ctypes.c_void_p(None)) < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"fresh session keyring: keyctl(JOIN_SESSION_KEYRING): {os.strerror(err)}")
    if seccomp is not None:
        if libc.prctl(38, L(1), L(0), L(0), L(0)) != 0:  # PR_SET_NO_NEW_PRIVS, required for an unprivileged filter
            err = ctypes.get_errno()
            raise OSError(err, f"seccomp filter: prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")

        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        prog = ctypes.create_string_buffer(seccomp, len(seccomp))
        fprog = SockFprog(len(seccomp) // 8, ctypes.addressof(prog))
        if libc.prctl(22, L(2), ctypes.byref(fprog), L(0), L(0)) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
            err = ctypes.get_errno()
            raise OSError(err, f"seccomp filter: prctl(PR_SET_SECCOMP): {os.strerror(err)}")


if _cfg["fs"] is not None:
    try:
        _build_fs_view(_cfg["fs"])
    except BaseException as e:  # noqa: BLE001 - reported to the runtime, which refuses to run unprotected
        _fail_setup(f"private filesystem view: {type(e).__name__}: {e}")

if _cfg["keyctl_nr"] is not None or _cfg["seccomp"] is not None:
    try:
        _harden(_cfg["keyctl_nr"], _cfg["seccomp"])
    except BaseException as e:  # noqa: BLE001 - as above: the probe promised these, so no run goes without them
        _fail_setup(f"{type(e).__name__}: {e}")

_scratch = os.path.realpath(_cfg["scratch"])
_own_proc = ("/proc/self/", "/proc/thread-self/")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {"os.remove": (0,), "os.rename": (0, 1), "os.mkdir": (0,), "os.rmdir": (0,), "os.symlink": (1,),
                "os.link": (1,), "os.chmod": (0,), "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,),
                "shutil.rmtree": (0,), "shutil.copyfile": (1,), "shutil.move": (1,), "os.mkfifo": (0,),
                "os.mknod": (0,)}  # fmt: skip
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


with os.fdopen(_code_fd, "rb") as _f:
    _src = _f.read().decode("utf-8")

if os.environ.pop("OMNI_SANDBOX_AUDIT", "1") == "1":
    sys.addaudithook(_hook)

_pid = os.fork()
if _pid == 0:
    os.close(_status_fd)
    os.close(_life_fd)
    _uid = _cfg["uid"]
    if _uid is not None and os.getuid() == 0:  # fs view mode: PID 1 stays root, only the user code drops
        import ctypes

        os.setgroups([])
        os.setgid(_uid)
        os.setuid(_uid)
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: no setuid binary can give privileges back
        _libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG=SIGKILL (setuid cleared the inherited one)
        if os.getppid() != 1 and _cfg["fs"] is not None:
            os._exit(1)
    os.chdir(_scratch)
    _code_file = os.path.join(_scratch, "main.py")
    with open(_code_file, "w", encoding="utf-8") as _f:
        _f.write(_src)
    del _src
    sys.argv = [_code_file]
    with open(_code_file, encoding="utf-8") as _f:
        _src = _f.read()
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
    except BaseException:  # noqa: BLE001
        pass
    os._exit(_rc)


def _watchdog():
    # EOF on the lifeline = the runtime is gone (nothing else holds the write end); timeout = wall-clock backstop.
    select.select([_life_fd], [], [], _cfg["backstop_s"])
    try:
        os.kill(_pid, 9)
        if os.getpid() != 1:  # no PID namespace: take the sandbox's process group down too
            os.killpg(0, 9)
    finally:
        os._exit(0)


threading.Thread(target=_watchdog, daemon=True).start()
_, _st = os.waitpid(_pid, 0)
_msg = f"signal {os.WTERMSIG(_st)}" if os.WIFSIGNALED(_st) else f"exit {os.WEXITSTATUS(_st)}"
os.write(_status_fd, _msg.encode())
os._exit(0)
