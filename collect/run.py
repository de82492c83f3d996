"""Run the ledger runtime over a task set: the engine behind `make collect` and `make eval`.

One task -> one trajectory line, appended atomically as soon as the task finishes; a rerun with the same OUT skips
finished task ids; a changed configuration refuses to mix into an old OUT unless `allow_mixed_config` is set.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import hashlib
import json
import logging
import multiprocessing
import os
import sys
import time
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from collect import jsonio, judges, loaders, tasks
from collect.config import CollectConfig, EndpointConfig, ToolsConfig, from_mapping, parse_shard, shard_of
from collect.harvest import EVAL_SPLITS
from collect.ledger import INSUFFICIENT
from collect.llm import ChatError, ClientPool, add_usage, redact, usage_scope
from collect.loop import run_task
from collect.roles.factory import build_roles
from collect.summary import summarize
from collect.tasks import TASK_LIMIT_KEYS, TaskLimits, load_corpus, sidecar_corpus
from collect.tools import ToolBox
from collect.trajectory import TrajectoryWriter, encode_record, iter_trajectories, read_trajectories
from collect.world import DEFAULT_N_TASKS, load_world

log = logging.getLogger("collect")


@functools.lru_cache(maxsize=4)
def embedded_world(seed: int, n_tasks: int = DEFAULT_N_TASKS):
    """The generated world, built once per process, seed and size (tasks and corpus; eval cells reuse it)."""
    return load_world(seed=seed, n_tasks=n_tasks)


def setup_logging() -> None:
    """Console logging for the entry points, without the per-request INFO lines of HTTP and BM25 libraries, and with
    every record redacted (collect.jsonio.RedactingFilter)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in ("httpx", "httpx2", "bm25s"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    jsonio.install_log_redaction()  # every line the console handler writes has the known secrets removed


def load_task_list(cfg: CollectConfig) -> list:

    src = cfg.tasks
    limits = task_limits(src)
    if src.kind == "embedded":
        items = embedded_world(src.seed, src.n_tasks).tasks
        name = f"the embedded world (seed {src.seed}, {src.n_tasks} tasks)"
    elif src.kind == "file":
        items, name = tasks.load_tasks(src.path, limits), str(src.path)
    elif src.kind == "omnigaia":
        items, name = loaders.load_omnigaia(src.path, media_root=src.media_root, limits=limits), str(src.path)
    else:
        items = loaders.load_worldsense(
            src.path, video_root=src.media_root, subtitles_root=src.subtitles_root, limits=limits
        )
        name = str(src.path)
    selected = tasks.select_tasks(items, cfg.split, cfg.limit, name)
    if cfg.shard is None:
        return selected
    k, n = parse_shard(cfg.shard)  # after split/limit: the shards of a run partition exactly its task set
    return [t for t in selected if shard_of(t.id, n) == k]


def task_limits(src) -> TaskLimits:
    """The size limits a task source sets (tasks.max_file_bytes, ...); ValueError naming the key when one is bad."""
    return TaskLimits(**{k: getattr(src, k) for k in TASK_LIMIT_KEYS})


def load_task_corpus(cfg: CollectConfig) -> list[dict]:
    """The web corpus a run's bm25 search indexes: the embedded world's own, else the task source's `corpus` JSONL,
    else (task files) `<stem>.corpus.jsonl` next to the task file when it exists, else none (docs/world.md,
    "External tasks with evidence"). Tasks may add their own `documents` on top (collect.tools.ToolBox)."""

    src = cfg.tasks
    if src.kind == "embedded":
        return embedded_world(src.seed, src.n_tasks).corpus
    if src.corpus:
        return load_corpus(src.corpus, task_limits(src))
    if src.kind == "file" and sidecar_corpus(src.path).is_file():
        return load_corpus(sidecar_corpus(src.path), task_limits(src))
    return []


MISSING_MEDIA_SHOWN = 10  # task ids named in the pre-flight refusal (the count covers them all)


class MissingMediaError(ValueError):
    """Tasks whose media files are missing, refused before OUT is touched unless allow_missing_media is set."""


def missing_media(tasks: list, tools_cfg) -> dict[str, list[str]]:
    """Task id -> the media files its perception would need but cannot find. With the annotations backend an asset
    that carries annotation tracks needs no file; every other asset (e.g. an OmniGAIA asset) needs its `path`,
    resolved against tools.media_root when relative, to exist."""
    out: dict[str, list[str]] = {}
    for task in tasks:
        missing = []
        for a in task.assets:
            tr = a.tracks
            annotated = bool(tr.subtitles or tr.audio or tr.clips or tr.frames)
            if tools_cfg.perception_backend == "annotations" and annotated:
                continue
            if not a.path:
                missing.append(f"{a.id} (no path)")
                continue
            root = tools_cfg.media_root
            p = a.path if os.path.isabs(a.path) or not root else os.path.join(root, a.path)
            if not os.path.exists(p):
                missing.append(p)
        if missing:
            out[task.id] = missing
    return out


def task_fingerprint(task) -> str:
    """What a task is, for resume: a hash of its whole content (question, answer, assets, gold chain, ...). A record
    keeps the fingerprint of the task it ran, so a rerun sees a task changed since (a fixed task file) instead of
    reporting its old result as current."""
    content = task.model_dump(mode="json") if hasattr(task, "model_dump") else repr(task)
    return hashlib.sha256(json.dumps(content, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def _task_meta(task, missing: list[str] | None = None) -> dict:
    meta = {
        "difficulty": getattr(task, "difficulty", None),
        "category": getattr(task, "category", None),
        "family": getattr(task, "family", None),
        "answer_type": getattr(task, "answer_type", None),
        "source": getattr(task, "source", None),
        "split": getattr(task, "split", None),  # harvest trains only on train-split tasks (EVAL_SPLITS refused)
    }
    if missing:
        meta["missing_media"] = list(missing)  # run anyway under allow_missing_media (counted in the summary)
    return meta


def engine_answer(record: dict) -> str | None:
    """The answer the engine reports for a finished run: the run's own, or "insufficient" for a run that ended
    insufficient or out of budget without one (Algorithm 1, lines 17 and 20: "return insufficient")."""
    if record.get("answer") is None and record.get("outcome") in ("insufficient", "budget_exhausted"):
        return INSUFFICIENT
    return record.get("answer")


async def judge_answer(cfg: CollectConfig, task, answer: str | None, pool) -> tuple[bool | None, dict]:
    """(correct, how it was judged) of one answer to one task, by the task source's scorer and cfg.judge (the
    embedded world's and WorldSense's rules; OmniGAIA's judge endpoint, None when it gave no usable verdict)."""

    source = getattr(task, "source", "embedded")
    mode = judges.resolve_mode(cfg.judge.get("scoring"), source)  # judge.scoring: official | robust (docs/world.md)
    if source == "embedded":
        return judges.judge_embedded(task, answer, mode), {"method": "embedded", "mode": mode}
    if source == "worldsense":
        ok = judges.worldsense_correct(answer or "", str(task.answer).strip().upper(), mode, task.options)
        return ok, {"method": "worldsense_option", "mode": mode}
    ep = cfg.judge.get("endpoint")
    client, model = (pool.client(ep), cfg.endpoints[ep].model) if ep else (None, None)
    kw = {"max_tokens": int(cfg.judge["max_tokens"])} if cfg.judge.get("max_tokens") else {}
    res = await judges.omnigaia_judge(task.question, answer or "", task.answer, client, model, mode, **kw)
    info = {"method": res.method, "mode": mode}
    if res.correct is None:
        info["detail"] = res.detail  # unjudged: the judge gave no usable verdict (counted in the summary)
    return res.correct, info


def used_endpoints(cfg: CollectConfig) -> dict[str, EndpointConfig]:
    names = {b for b in cfg.roles.as_dict().values() if b != "offline"}
    if cfg.judge.get("endpoint"):
        names.add(cfg.judge["endpoint"])
    return {n: cfg.endpoints[n] for n in sorted(names)}


GOLD_ROLES = ("need_parser", "critic")  # the offline teacher's roles that read a task's gold chain


def check_gold_chains(cfg: CollectConfig, tasks) -> None:
    """The offline teacher's need parser and critic read each task's gold chain: a selected task without one would
    run zero steps and answer "insufficient" (accuracy 0, exit 0). Refused before any task runs."""
    offline = [r for r in GOLD_ROLES if getattr(cfg.roles, r) == "offline"]
    bare = [t.id for t in tasks if not getattr(t, "gold_chain", None)] if offline else []
    if bare:
        raise ValueError(
            f"roles {offline} are 'offline', the privileged teacher, which reads each task's gold chain; "
            f"{len(bare)} of {len(tasks)} selected task(s) have none (e.g. {bare[:3]}): give those roles an endpoint "
            "(roles: / endpoints:, as configs/collect/omnigaia_api.yaml does) or add a gold_chain to the tasks"
        )


def check_keys(cfg: CollectConfig, tasks, tools_cfg: ToolsConfig) -> None:
    """Every key variable a used endpoint or tool names must be set: an unset one would make every call a 401 (or
    every search an error) and the run a silent failure. Refused before any task runs, naming each variable."""
    unset = []
    for name, ep in used_endpoints(cfg).items():
        if ep.api_key_env and not os.environ.get(ep.api_key_env):
            unset.append(f"{ep.api_key_env} (endpoint {name!r}, {ep.base_url})")
    if tools_cfg.perception_backend == "media" and any(t.assets for t in tasks):
        if tools_cfg.media_api_key_env and not os.environ.get(tools_cfg.media_api_key_env):
            unset.append(f"{tools_cfg.media_api_key_env} (tools.media_base_url {tools_cfg.media_base_url})")
    if tools_cfg.web_backend == "http" and any("web_search" in t.to_context().tools() for t in tasks):
        if tools_cfg.web_api_key_env and not os.environ.get(tools_cfg.web_api_key_env):
            unset.append(f"{tools_cfg.web_api_key_env} (tools.web_provider_url {tools_cfg.web_provider_url})")
    if unset:
        raise ValueError(
            f"key variable(s) not set: {'; '.join(unset)}. Export them; for a server that needs no key, set the "
            "endpoint's api_key_env: null (tools: media_api_key_env / web_api_key_env: '')"
        )


async def check_endpoints(cfg: CollectConfig, timeout_s: float = 10.0) -> None:
    """Fail fast, naming the URL, when a configured endpoint does not answer GET /models at start-up, and naming the
    key variable when it refuses the key (401/403)."""

    async with httpx.AsyncClient(timeout=timeout_s) as http:
        for name, ep in used_endpoints(cfg).items():
            url = ep.base_url.rstrip("/") + "/models"
            key = os.environ.get(ep.api_key_env or "", "")
            try:
                r = await http.get(url, headers={"Authorization": f"Bearer {key}"} if key else {})
            except httpx.HTTPError as e:
                raise ValueError(f"endpoint {name!r} is unreachable at {url}: {type(e).__name__}") from None
            if r.status_code in (401, 403):
                var = f"the key in {ep.api_key_env}" if ep.api_key_env else "no key (api_key_env is not set)"
                raise ValueError(
                    f"endpoint {name!r} at {url} refused {var}: HTTP {r.status_code} to GET /models; "
                    f"{redact(r.text[:200])}"
                )
            if r.status_code >= 400:  # some servers do not implement /models; reachable is what matters here
                log.warning("endpoint %r at %s answered HTTP %d to GET /models", name, url, r.status_code)


class RunDirError(RuntimeError):
    pass


def lock_out(out: Path) -> int:
    """Exclusive writer lock on OUT (flock on OUT/.lock, held until `unlock_out`): a second collect process on the
    same OUT stops with a RunDirError instead of doubling every task. The kernel drops the lock when its holder dies,
    so a SIGKILLed run never leaves a stale lock behind."""
    fd = os.open(out / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RunDirError(
            f"{out} is being written by another collect process (pid {holder}); wait for it or use another OUT"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def unlock_out(fd: int) -> None:
    os.close(fd)  # closing the descriptor releases the flock


def prepare_out(out: Path, cfg: CollectConfig, allow_mixed_config: bool, overwrite: bool) -> None:
    """Create OUT and check that it belongs to this config. The caller holds the OUT lock (`lock_out`)."""

    traj = out / "trajectories.jsonl"
    meta = out / "run_config.json"
    if overwrite:
        for p in (traj, meta, out / "summary.json"):
            p.unlink(missing_ok=True)
    has_records = traj.exists() and traj.stat().st_size > 0
    if has_records and not allow_mixed_config:
        if not meta.exists():
            raise RunDirError(
                f"{out} holds trajectories but no run_config.json, so their configuration is unknown; "
                "use a new OUT, --overwrite, or --allow-mixed-config"
            )
        try:
            old_meta = jsonio.loads(meta.read_bytes())
            old = old_meta.get("config_hash")
            old_shard = (old_meta.get("config") or {}).get("shard")
        except (jsonio.BadJSON, AttributeError) as e:
            raise RunDirError(f"{meta}: not a run_config.json written by collect ({e}); use a new OUT") from None
        if old_shard != cfg.shard:  # the hash leaves the shard aside (shards share it); one OUT holds one share
            raise RunDirError(
                f"{out} holds trajectories of shard {old_shard!r}, not {cfg.shard!r}; use one OUT per shard "
                "(python -m collect.merge combines them)"
            )
        if old != cfg.hash():
            raise RunDirError(
                f"{out} holds trajectories of another configuration (config_hash {old} != {cfg.hash()}); "
                "use a new OUT, --overwrite, or --allow-mixed-config"
            )
    # strict: a config value JSON cannot hold (a NaN temperature) stops the run here, naming its field
    jsonio.write_json(meta, {"config_hash": cfg.hash(), "config": cfg.to_dict()}, nonfinite="refuse", default=str)


def register_run_keys(cfg: CollectConfig) -> None:
    """Make every write of this process redact the key of every endpoint the config names (collect.jsonio), before
    any client exists: the parent writes the files, a worker encodes the records, either may meet a key first."""
    for ep in cfg.endpoints.values():
        jsonio.register_key_env(ep.api_key_env)


async def run_collection_async(
    cfg: CollectConfig,
    out: Path,
    *,
    allow_mixed_config=False,
    overwrite=False,
    for_training=False,
    rerun_changed=False,
    allow_subset=False,
) -> dict:
    """Run cfg's tasks into OUT (resumable). for_training: the run's trajectories become training rows (the collect
    CLI with harvest on), so evaluation-split tasks are refused in the pre-flight. A finished task whose content
    changed since it ran is refused unless `rerun_changed` (its record is dropped and it runs again); finished tasks
    outside this selection (a smaller --limit) are refused unless `allow_subset` (summary.json then covers the
    selection and says how many records OUT holds)."""
    out = Path(out)
    register_run_keys(cfg)
    # Pre-flight: everything that can fail fast does so before OUT is touched (nothing partial is written).
    all_tasks = load_task_list(cfg)
    if not all_tasks and cfg.shard is None:  # an empty shard is a valid (empty) share of a small task set
        raise ValueError(f"no tasks selected (source={cfg.tasks.kind}, split={cfg.split}, limit={cfg.limit})")
    tools_cfg = from_mapping(ToolsConfig, cfg.tools, "tools")
    judges.resolve_mode(cfg.judge.get("scoring"))  # an unknown judge.scoring fails here, before OUT is touched
    corpus = load_task_corpus(cfg)  # a malformed corpus file fails here; worker processes load their own
    missing = missing_media(all_tasks, tools_cfg)
    if missing and not cfg.allow_missing_media:
        shown = ", ".join(list(missing)[:MISSING_MEDIA_SHOWN]) + (" ..." if len(missing) > MISSING_MEDIA_SHOWN else "")
        first = next(iter(missing.values()))[0]
        raise MissingMediaError(
            f"{len(missing)} of {len(all_tasks)} selected task(s) have missing media files ({shown}; e.g. {first}); "
            f"set tasks.media_root / tools.media_root, or run them anyway with --allow-missing-media "
            f"(make: ARGS=--allow-missing-media; config allow_missing_media: true)"
        )
    if missing:
        log.warning("running %d task(s) with missing media (allow_missing_media): %s", len(missing), list(missing))
    check_gold_chains(cfg, all_tasks)
    check_keys(cfg, all_tasks, tools_cfg)
    held = [t.id for t in all_tasks if t.split in EVAL_SPLITS] if for_training else []
    if held:
        raise ValueError(
            f"the selection holds {len(held)} evaluation-split task(s) (e.g. {held[:3]}) and harvest is on, which "
            'would make them training rows: collect --split train, or --no-harvest (docs/world.md "Train and '
            'evaluation splits")'
        )
    await check_endpoints(cfg)
    out.mkdir(parents=True, exist_ok=True)
    lock = lock_out(out)  # one writer per OUT; the kernel also drops the lock if this process dies
    try:
        return await _run_locked(
            cfg, out, all_tasks, allow_mixed_config, overwrite, corpus, missing, rerun_changed, allow_subset
        )
    finally:
        unlock_out(lock)


async def _run_tasks(
    cfg: CollectConfig, tasks: list, concurrency: int, emit, corpus: list | None = None, missing: dict | None = None
) -> None:
    """Run `tasks` in this process's event loop, at most `concurrency` at a time. For each finished task
    `emit(task_id, line, None)` with its encoded trajectory line; for each task that did not finish
    `emit(task_id, None, error)` (nothing is written for it, so a rerun with the same OUT retries it).
    `corpus` / `missing` come from the pre-flight in the parent; a worker process (None) loads its own."""
    register_run_keys(cfg)  # a worker process registers them itself
    tools_cfg = from_mapping(ToolsConfig, cfg.tools, "tools")
    pool = ClientPool(cfg.endpoints, concurrency=concurrency)
    if corpus is None:
        corpus = load_task_corpus(cfg)
    if missing is None:  # marked in each task's meta; without allow_missing_media the pre-flight refused them
        missing = missing_media(tasks, tools_cfg) if cfg.allow_missing_media else {}
    sem = asyncio.Semaphore(max(1, concurrency))
    config_hash = cfg.hash()

    async def one(task):
        async with sem:
            r0 = task.to_context()  # the tools' view of R0; run_task sets its budget from cfg.runtime
            roles = build_roles(task, cfg.roles, cfg.endpoints, pool)
            toolbox = ToolBox(task, r0, tools_cfg, corpus=corpus)
            try:
                rec = await run_task(task, roles, toolbox, cfg.runtime, config_hash=config_hash)
                rec["answer"] = engine_answer(rec)
                with usage_scope() as judge_usage:  # the answer judge's chat calls count under role "judge"
                    correct, judge_info = await judge_answer(cfg, task, rec.get("answer"), pool)
                add_usage(rec, "judge", judge_usage)
            except ChatError as e:
                # An endpoint that stayed down past its retry budget: nothing is written for this task, so a rerun
                # with the same OUT retries it. Counted in the summary.
                err = redact(f"{e.kind}: {e.detail}")[:300]
                log.warning("task %s failed after retries: %s", task.id, err)
                emit(task.id, None, err)
                return
            except Exception as e:  # a bug must not cost the other tasks of a long paid run: log it, go on
                err = redact(f"{type(e).__name__}: {e}")[:300]
                log.exception("task %s crashed; it is retried on the next run with the same OUT", task.id)
                emit(task.id, None, err)
                return
            rec["correct"] = correct
            rec["judge"] = judge_info
            rec["task_meta"] = _task_meta(task, missing.get(task.id))
            rec["task_fingerprint"] = task_fingerprint(task)
            rec["gold_answer"] = task.answer
            rec["question"] = task.question
            try:
                line = encode_record(rec)  # strict JSON, secrets removed
            except ValueError as e:  # NotJSON (a NaN that got past the boundaries: a bug), named and not written
                err = redact(f"{type(e).__name__}: {e}")[:300]
                log.error("task %s: its record is not writable: %s", task.id, err)
                emit(task.id, None, err)
                return
            emit(task.id, line, None)

    try:
        await asyncio.gather(*(one(t) for t in tasks))
    finally:
        await pool.close()


def _check_finished(out: Path, all_tasks, rerun_changed: bool, allow_subset: bool) -> set[str]:
    """The finished task ids of OUT that this run keeps: a changed task is refused or (rerun_changed) dropped from
    the trajectory file so it runs again; finished tasks outside the selection are refused unless allow_subset."""
    path = out / "trajectories.jsonl"
    recorded = {r["task_id"]: r.get("task_fingerprint") for _, r in iter_trajectories(path)}
    now = {t.id: task_fingerprint(t) for t in all_tasks}
    changed = sorted(i for i, fp in recorded.items() if i in now and fp is not None and fp != now[i])
    if changed and not rerun_changed:
        raise RunDirError(
            f"{out}: {len(changed)} finished task(s) changed since they ran (e.g. {changed[:3]}): their records are "
            "not of the tasks as they are now; rerun them with --rerun-changed, or use a new OUT"
        )
    if changed:
        keep = set(changed)
        lines = [raw for raw in path.read_bytes().splitlines(keepends=True) if _line_task_id(raw) not in keep]
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(b"".join(lines))
        os.replace(tmp, path)
        log.warning("%d changed task(s) will run again: %s", len(changed), changed[:10])
    outside = sorted(set(recorded) - set(now))
    if outside and not allow_subset:
        raise RunDirError(
            f"{out} holds {len(outside)} finished task(s) outside this selection (e.g. {outside[:3]}), so its summary "
            "would cover fewer tasks than its trajectories and harvest: select them all again (the same --split / "
            "--limit), use a new OUT, or pass --allow-subset"
        )
    return set(recorded) - set(changed)


def _line_task_id(raw: bytes) -> str | None:
    try:
        return json.loads(raw).get("task_id")
    except (ValueError, AttributeError, RecursionError):
        return None  # a torn line: TrajectoryWriter repairs the tail, readers skip the rest


async def _run_locked(
    cfg: CollectConfig,
    out: Path,
    all_tasks,
    allow_mixed_config,
    overwrite,
    corpus: list,
    missing: dict,
    rerun_changed: bool = False,
    allow_subset: bool = False,
) -> dict:
    prepare_out(out, cfg, allow_mixed_config, overwrite)
    done = _check_finished(out, all_tasks, rerun_changed, allow_subset)
    todo = [t for t in all_tasks if t.id not in done]
    writer = TrajectoryWriter(out / "trajectories.jsonl")  # repairs a torn tail before anything is appended
    errored: dict[str, str] = {}
    bar = _progress(len(all_tasks), len(done), cfg.progress, cfg.name)
    n_workers = max(1, min(cfg.n_workers(), len(todo), cfg.runtime.concurrency))

    def emit(task_id: str, line: bytes | None, error: str | None) -> None:
        if line is not None:
            writer.append_line(line)  # the only writer of OUT/trajectories.jsonl is this (the locking) process
        else:
            errored[task_id] = error
        bar.update(1)

    t0 = time.perf_counter()
    try:
        if n_workers == 1:
            await _run_tasks(cfg, todo, cfg.runtime.concurrency, emit, corpus, missing)
        else:
            _run_workers(cfg, todo, n_workers, emit)
    finally:
        bar.close()
    wall = time.perf_counter() - t0
    wanted = {t.id for t in all_tasks}
    in_out = read_trajectories(out / "trajectories.jsonl")
    records = [r for r in in_out if r["task_id"] in wanted]
    priced = any(e.price_in_per_mtok or e.price_out_per_mtok for e in cfg.endpoints.values())
    summary = summarize(records, prices_configured=priced)
    summary.update({"config_hash": cfg.hash(), "split": cfg.split, "arm": cfg.runtime.arm, "wall_s": round(wall, 2)})
    summary["errored_tasks"] = errored  # retried on the next run with the same OUT
    summary["workers"] = n_workers
    # which tasks the figures cover: the selection (its size and a digest of its ids) and what OUT holds besides
    summary["selection"] = {
        "split": cfg.split,
        "limit": cfg.limit,
        "n_selected": len(all_tasks),
        "task_ids_sha256": hashlib.sha256("\n".join(sorted(wanted)).encode()).hexdigest()[:16],
        "n_records_in_out": len(in_out),
    }
    if cfg.shard is not None:
        summary["shard"] = cfg.shard
    jsonio.write_json(out / "summary.json", summary)  # strict JSON; a figure that is not finite is written as text
    return summary


# --------------------------------------------------------------------------------------------------------------------
# Worker processes (cfg.workers > 1). Each worker runs its share of the tasks in its own event loop with its share of
# the concurrency, encodes each finished record itself (the JSON encoding is most of the cost of a record) and sends
# the line to the parent over its own pipe; the parent, which holds the OUT lock, is the only process that appends to
# trajectories.jsonl. Why a pipe rather than every worker appending to the file: a worker SIGKILLed inside its
# `os.write` of a large record can leave a partial line with no newline, and the next record appended by another
# worker would be glued onto it and lost; a message torn by a dead worker is only ever that worker's own record, and
# the parent never writes it. A worker that dies loses only its own unfinished tasks: they are listed in
# `errored_tasks` and retried by the next run with the same OUT (not re-dispatched in this run, so a task that kills
# its worker cannot take the others down one after another). Workers exit when the parent dies.
# --------------------------------------------------------------------------------------------------------------------


def _shares(items: list, n: int) -> list[list]:
    return [items[i::n] for i in range(n)]


def _run_workers(cfg: CollectConfig, todo: list, n_workers: int, emit) -> None:

    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads (tokenizers, HTTP)
    conc = cfg.runtime.concurrency
    pending: dict = {}  # read end -> (process, task ids not yet reported)
    try:
        for i, share in enumerate(_shares(todo, n_workers)):
            ids = [t.id for t in share]
            rd, wr = ctx.Pipe(duplex=False)
            share_conc = conc // n_workers + (i < conc % n_workers)
            p = ctx.Process(
                target=_worker_main,
                args=(cfg, ids, share_conc, wr, os.getpid()),
                name=f"collect-worker-{i}",
                daemon=True,
            )
            p.start()
            wr.close()  # only the worker holds the write end: its death is an EOF here
            log.info("worker %d (pid %d): %d task(s), concurrency %d", i, p.pid, len(ids), share_conc)
            pending[rd] = (p, set(ids))
        while pending:
            for rd in wait(list(pending)):
                p, left = pending[rd]
                try:
                    msg = rd.recv_bytes()
                except (EOFError, OSError):
                    msg = None
                if msg is None or msg == b"end":
                    del pending[rd]
                    rd.close()
                    p.join(timeout=10)
                    if left:  # the worker died (or ended) before reporting these: retried on the next run
                        why = f"worker process {p.pid} exited (code {p.exitcode}) before this task finished"
                        log.warning("%s: %d task(s) not finished; rerun with the same OUT", why, len(left))
                        for tid in sorted(left):
                            emit(tid, None, why)
                    continue
                head, _, line = msg.partition(b"\n")
                task_id, error = json.loads(head)
                left.discard(task_id)
                emit(task_id, line if error is None else None, error)
    finally:
        for p, _ in pending.values():  # only on an error in the parent: do not leave workers running
            p.terminate()
        for p, _ in pending.values():
            p.join(timeout=10)


def _worker_main(cfg: CollectConfig, task_ids: list[str], concurrency: int, conn, parent_pid: int) -> None:
    setup_logging()
    wanted = set(task_ids)
    tasks = [t for t in load_task_list(cfg) if t.id in wanted]

    def send(task_id: str, line: bytes | None, error: str | None) -> None:
        head = json.dumps([task_id, error]).encode()
        try:
            conn.send_bytes(head + b"\n" + (line or b""))
        except (BrokenPipeError, ConnectionResetError, OSError):
            os._exit(1)  # the parent is gone: nothing may be written for it any more

    async def main() -> None:
        async def orphan_watch() -> None:  # a SIGKILLed parent closes no pipe we would notice until the next send
            while True:
                await asyncio.sleep(0.25)
                if os.getppid() != parent_pid:
                    os._exit(1)

        watch = asyncio.create_task(orphan_watch())
        try:
            await _run_tasks(cfg, tasks, concurrency, send)
        finally:
            watch.cancel()

    asyncio.run(main())
    conn.send_bytes(b"end")
    conn.close()


def run_collection(cfg: CollectConfig, out: str | os.PathLike, **kw: Any) -> dict:
    return asyncio.run(run_collection_async(cfg, Path(out), **kw))


class _NullBar:
    def update(self, n):
        pass

    def close(self):
        pass


def _progress(total: int, initial: int, enabled: bool, desc: str):
    if not enabled:
        return _NullBar()

    return tqdm(total=total, initial=initial, desc=desc, unit="task", file=sys.stderr, dynamic_ncols=True)
