"""On-policy states labelled by the teacher (DAgger-style aggregation; docs/training.md "On-policy relabelling").

    python -m pipeline.relabel --planner CKPT_OR_URL --out DIR --round K [--config configs/collect/embedded.yaml]
                              [--split train] [--limit N] [--teacher-data runs/collect] [--previous DIR ...]

1. run: the collect engine runs the ledger runtime over a split with the planner role swapped for the student (a
   checkpoint served by serve.local, or an OpenAI-compatible endpoint: pipeline.planners), critic, finalizer
   and need parser staying the configured ones -> DIR/collect/trajectories.jsonl (every state the student reached:
   its own mistakes, blocked finishes and rejection notes are in the recorded steps).
2. relabel: at every recorded planner step the privileged teacher (collect.teacher.TeacherPlanner.choose, which reads
   only R0 and the ledger) picks the action for the ledger the student saw; (step prompt, teacher action) becomes an
   SFT row and an rl_states row built by collect.harvest.decision_rows, marked origin "onpolicy", round K
   -> DIR/onpolicy_sft.jsonl, DIR/onpolicy_rl_states.jsonl, DIR/relabel_stats.json.
3. aggregate (--teacher-data): teacher rows + on-policy rows of this and the --previous rounds, identical prompts
   kept once (first wins: teacher, then rounds in order) -> DIR/data/{sft,rl_states} (+ .jsonl mirrors), the dataset
   of round K's SFT.

Test-split tasks are never relabelled: a test (or "all") split, or any selected task whose split is "test", is refused
before anything runs. Only the ledger arm is relabelled (the teacher reads the ledger).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import sys
from collections import Counter
from pathlib import Path

from collect import jsonio
from collect.actions import Action, ActionError, offered_refs, resolve_refs, validate_action
from collect.cli import run_cli
from collect.config import load_config
from collect.harvest import _save, decision_rows, split_of
from collect.ledger import Asset, Budget, TaskContext, ledger_from_dict
from collect.merge import merge
from collect.processes import parse_processes, raise_first, resolve_processes, run_spawned, threads_per_process
from collect.run import RunDirError, embedded_world, load_task_list, run_collection, setup_logging
from collect.teacher import TeacherPlanner
from collect.trajectory import iter_trajectories
from pipeline.planners import PLANNER_ENDPOINT, parse_planner_arg, planner_endpoint, require_checkpoint

FORBIDDEN_SPLITS = ("test", "all", None)

log = logging.getLogger(__name__)


class TestSplitError(ValueError):
    """Relabelling was asked to touch the test split."""

    __test__ = False  # not a pytest class


def r0_from_dict(d: dict) -> TaskContext:
    """TaskContext from `TaskContext.to_dict()` (the trajectory's `r0`)."""
    kw = dict(d)
    kw["assets"] = tuple(Asset(**a) for a in d.get("assets") or ())
    kw["options"] = tuple(d.get("options") or ())
    if "allowed_tools" in d:
        kw["allowed_tools"] = tuple(d["allowed_tools"])
    kw["budget"] = Budget(**d["budget"]) if d.get("budget") else Budget()
    return TaskContext(**kw)


def check_split(split: str | None, tasks=()) -> None:
    """Refuse the test split: by name, and by every selected task's own split."""
    if split in FORBIDDEN_SPLITS:
        raise TestSplitError(
            f"refusing to relabel split {split!r}: it includes the test split, which must stay unseen by training; "
            "use train or dev"
        )
    bad = [t.id for t in tasks if getattr(t, "split", None) == "test"]
    if bad:
        raise TestSplitError(f"refusing to relabel {len(bad)} test-split task(s) (e.g. {bad[:3]}); use train or dev")


def relabel_trajectory(traj: dict, round_: int, stats: Counter, teacher=None) -> tuple[list[dict], list[dict]]:
    """(sft rows, rl rows): one per recorded planner step of a student trajectory, labelled by the teacher."""
    teacher = teacher or TeacherPlanner()
    r0 = r0_from_dict(traj["r0"])
    sft, rl = [], []
    for st in traj.get("steps", []):
        tools = st["planner_input"].get("tools") or []
        offered = [t.get("function", t)["name"] for t in tools]
        msgs = st["planner_input"].get("messages") or []  # the references the student's prompt offered
        refs = offered_refs(msgs)
        ledger = ledger_from_dict(st["ledger_before"])
        action = teacher.choose(r0, ledger, offered, refs)
        try:  # as the runtime checks it, references resolved
            validate_action(resolve_refs(action, ledger, refs), tools)
        except ActionError as e:  # the teacher's action must fit the step's schemas, or it teaches nothing
            stats["teacher_invalid"] += 1
            print(f"relabel: task {traj['task_id']} step {st['t']}: teacher action invalid ({e})", file=sys.stderr)
            continue
        student = st.get("action")
        stats["states"] += 1
        stats["student_invalid"] += student is None
        stats["same_tool"] += bool(student) and student["name"] == action.name
        stats["same_action"] += bool(student) and Action(student["name"], student.get("arguments") or {}) == action
        latest = st.get("latest_observation") or ""
        stats["after_rejected_reply"] += latest.startswith("Your previous reply was rejected")
        stats["after_tool_failure"] += latest.startswith("Tool ") and " failed: " in latest
        s_row, r_row = decision_rows(traj, st, action, origin="onpolicy", round_=round_)
        sft.append(s_row)
        rl.append(r_row)
    return sft, rl


def relabel_trajectories(path: str | Path, round_: int, forbidden_ids: set[str] = frozenset()) -> tuple:
    """(sft rows, rl rows, stats) of every trajectory in a student's trajectory file."""
    stats: Counter = Counter()
    sft, rl = [], []
    for _, traj in iter_trajectories(path, []):
        if traj["task_id"] in forbidden_ids:
            raise TestSplitError(f"{path}: task {traj['task_id']!r} is a test-split task; refusing to relabel it")
        if traj.get("arm", "ledger") != "ledger":
            raise ValueError(f"{path}: task {traj['task_id']!r} ran the {traj.get('arm')!r} arm; relabel needs ledger")
        stats["tasks"] += 1
        stats["tasks_correct"] += traj.get("correct") is True
        s, r = relabel_trajectory(traj, round_, stats)
        sft += s
        rl += r
    key = lambda r: (r["task_id"], r["step"])  # noqa: E731
    return sorted(sft, key=key), sorted(rl, key=key), stats


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(jsonio.dumps(r, what=f"{path}: row of task {r.get('task_id')}", ensure_ascii=False) + "\n")


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def _prompt_key(row: dict) -> str:
    return json.dumps([row.get("kind", "decision"), row["prompt"]], ensure_ascii=False, sort_keys=True)


def aggregate(teacher_data: str | Path, round_dirs: list[str | Path], out: str | Path, eval_share=0.1, seed=0) -> dict:
    """Teacher rows (harvest's DATA/{sft,rl_states}.{train,eval}.jsonl) + on-policy rows of `round_dirs`, identical
    prompts kept once (first wins: teacher rows, then the rounds in the given order). A task keeps the teacher's
    train/eval assignment; a task the teacher never kept is split like harvest (`split_of(task_id, eval_share, seed)`).
    Writes OUT/sft, OUT/rl_states (+ .jsonl mirrors) and OUT/aggregate_stats.json."""
    teacher_data, out = Path(teacher_data), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"teacher_data": str(teacher_data), "rounds": [str(d) for d in round_dirs]}
    for name in ("sft", "rl_states"):
        rows: dict[str, list[dict]] = {"train": [], "eval": []}
        task_split: dict[str, str] = {}
        for split in ("train", "eval"):
            p = teacher_data / f"{name}.{split}.jsonl"
            if split == "train" and not p.is_file():
                raise FileNotFoundError(f"{p} not found: run collect (with harvest) for the teacher data first")
            for r in _read_jsonl(p) if p.is_file() else []:
                r.setdefault("origin", "teacher")  # harvests written before the origin column
                r.setdefault("round", 0)
                rows[split].append(r)
                task_split[r["task_id"]] = split
        seen = {_prompt_key(r) for rs in rows.values() for r in rs}
        added, dupes = Counter(), 0
        for d in round_dirs:
            for r in _read_jsonl(Path(d) / f"onpolicy_{name}.jsonl"):
                k = _prompt_key(r)
                if k in seen:
                    dupes += 1
                    continue
                seen.add(k)
                split = task_split.setdefault(r["task_id"], split_of(r["task_id"], eval_share, seed))
                rows[split].append(r)
                added[f"round_{r['round']}"] += 1
        for rs in rows.values():
            rs.sort(key=lambda r: (r["task_id"], r.get("kind", "") != "need_parse", r["round"], r["step"]))
        _save(rows, out, name)
        result[name] = {
            "rows": {k: len(v) for k, v in rows.items()},
            "by_origin": dict(Counter(r["origin"] for rs in rows.values() for r in rs)),
            "onpolicy_added_by_round": dict(sorted(added.items())),
            "onpolicy_duplicates_dropped": dupes,
        }
    jsonio.write_json(out / "aggregate_stats.json", result)
    return result


def run_relabel(
    planner,
    out: str | Path,
    round_: int,
    *,
    config: str = "configs/collect/embedded.yaml",
    split: str = "train",
    limit: int | None = None,
    planner_defaults: dict | None = None,
    concurrency: int | None = None,
    overwrite: bool = False,
    processes: int | str = 1,
) -> dict:
    """Run the student (`planner`: a pipeline.planners spec) over `split`, relabel its states; returns the stats.

    `processes` > 1 (or 'auto') with a checkpoint student: the tasks are split into that many shards (collect's
    stable task-id hash), each run in a spawned process that serves the checkpoint itself with its share of the cores
    as torch threads, into OUT/shards/K; collect.merge then writes OUT/collect (the same records as one process: the
    rows are sorted by task and step either way)."""
    check_split(split)
    base = load_config(config, {"split": split, "limit": limit, "progress": False})
    tasks = load_task_list(base)
    check_split(split, tasks)
    if base.runtime.arm != "ledger":
        raise ValueError(f"{config}: runtime.arm is {base.runtime.arm!r}; relabelling needs the ledger arm")
    forbidden: set[str] = set()
    if base.tasks.kind == "embedded":  # belt and braces: no trajectory of a test task is ever turned into rows
        forbidden = {t.id for t in embedded_world(base.tasks.seed, base.tasks.n_tasks).tasks if t.split == "test"}
    out = Path(out)
    defaults = planner_defaults or PLANNER_ENDPOINT
    cfg = copy.deepcopy(base)
    cfg.name = f"relabel-round{round_}"
    cfg.runtime = dataclasses.replace(cfg.runtime, concurrency=concurrency or cfg.runtime.concurrency)
    served = isinstance(planner, dict) and "checkpoint" in planner  # only a checkpoint is served per process
    n = resolve_processes(processes, len(tasks)) if served else 1
    if n > 1:
        if cfg.shard is not None:
            raise ValueError(f"{config}: shard {cfg.shard!r} is set; the relabel's processes shard the tasks itself")
        require_checkpoint(planner, "student")  # before any process starts
        threads = threads_per_process(n)
        log.info("student: %d task shards, %d at a time, %d torch thread(s) each", n, n, threads)
        shards = {f"{k}/{n}": out / "shards" / str(k) for k in range(n)}
        jobs = {
            s: (dataclasses.replace(cfg, shard=s), planner, defaults, d, overwrite, threads) for s, d in shards.items()
        }
        _, errors = run_spawned(student_run, jobs, n, "student shard")
        raise_first(errors, "student shard", (RunDirError,))
        summary = merge(list(shards.values()), out / "collect", overwrite=True)
    else:
        summary = student_run(cfg, planner, defaults, out / "collect", overwrite)
    sft, rl, stats = relabel_trajectories(out / "collect" / "trajectories.jsonl", round_, forbidden)
    _write_jsonl(out / "onpolicy_sft.jsonl", sft)
    _write_jsonl(out / "onpolicy_rl_states.jsonl", rl)
    n = stats["states"] or 1
    result = {
        "round": round_,
        "split": split,
        "student": {k: summary.get(k) for k in ("n_tasks", "accuracy", "ci95", "outcomes", "valid_action_rate")},
        "tasks": stats["tasks"],
        "states": stats["states"],
        "teacher_invalid": stats["teacher_invalid"],
        "student_invalid_share": round(stats["student_invalid"] / n, 4),
        "student_same_tool_share": round(stats["same_tool"] / n, 4),
        "student_same_action_share": round(stats["same_action"] / n, 4),
        "states_after_rejected_reply": stats["after_rejected_reply"],
        "states_after_tool_failure": stats["after_tool_failure"],
    }
    jsonio.write_json(out / "relabel_stats.json", result)
    return result


def student_run(cfg, planner, defaults: dict, out: Path, overwrite: bool, threads: int | None = None) -> dict:
    """One collect run of the student over cfg's tasks (a shard of them in a relabel process, with `threads` torch
    threads), its checkpoint served for the run; returns the run's summary."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
        setup_logging()
    with planner_endpoint(planner, defaults) as endpoint:
        if endpoint is not None:
            cfg.endpoints = {**cfg.endpoints, "planner": endpoint}
            cfg.roles = dataclasses.replace(cfg.roles, planner="planner")
        return run_collection(cfg, out, overwrite=overwrite)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.relabel", description=__doc__.split("\n\n")[0])
    ap.add_argument("--planner", required=True, help="student: checkpoint dir | URL#model")
    ap.add_argument("--out", required=True, help="round folder (collect/, onpolicy_*.jsonl, data/)")
    ap.add_argument("--round", type=int, default=1, dest="round_")
    ap.add_argument("--config", default="configs/collect/embedded.yaml")
    ap.add_argument("--split", default="train", help="train | dev (test is refused)")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=PLANNER_ENDPOINT["max_tokens"], help="student reply cap")
    ap.add_argument("--concurrency", type=int, default=None)
    ap.add_argument("--processes", default="1", help="checkpoint student: task shards run at once, N or 'auto'")
    ap.add_argument("--teacher-data", default=None, help="teacher harvest dir: also write OUT/data (the aggregate)")
    ap.add_argument("--previous", nargs="*", default=[], help="earlier round folders to aggregate")
    ap.add_argument("--eval-share", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    setup_logging()
    try:
        stats = run_relabel(
            parse_planner_arg(a.planner),
            a.out,
            a.round_,
            config=a.config,
            split=a.split,
            limit=a.limit,
            planner_defaults={**PLANNER_ENDPOINT, "max_tokens": a.max_tokens},
            concurrency=a.concurrency,
            processes=parse_processes(a.processes, "--processes"),
        )
        if a.teacher_data:
            stats["aggregate"] = aggregate(
                a.teacher_data, [*a.previous, a.out], Path(a.out) / "data", a.eval_share, a.seed
            )
    except (ValueError, FileNotFoundError, RunDirError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(jsonio.dumps(stats, nonfinite="string", indent=1))
    return 0


if __name__ == "__main__":
    run_cli(main)
