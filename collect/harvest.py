"""Trajectories -> state-SFT rows and RL states (paper v3: state-SFT on judged-correct ledger trajectories).

    python -m collect.harvest TRAJECTORIES.jsonl --out DATA [--eval-share 0.1] [--seed 0]

Writes DATA/sft and DATA/rl_states (datasets.save_to_disk DatasetDicts with train/eval), the same rows as
DATA/sft.{train,eval}.jsonl and DATA/rl_states.{train,eval}.jsonl, and DATA/harvest_stats.json.

Rules (why): only judged-correct trajectories (`"correct": true`) teach the planner; each SFT prompt is the recorded
`planner_input.messages` (tool-call arguments decoded to mappings, as vLLM does before templating), so training sees
what the planner saw at collection time; tool calls carry `arguments` as a mapping, the form every real chat template
renders (Qwen3.5 iterates `arguments|items`), stored in Arrow as JSON (`message_features`); only steps
whose recorded action is non-null and valid against that step's tool schemas become rows; train/eval are split by a
hash of the task id so no task is in both. A trajectory of an evaluation-split task (the task's own split is dev or
test: the embedded world's, OmniGAIA's and WorldSense's declared splits, a task file's `split`) is refused unless
--allow-eval-tasks (held-out states for scoring, never for training).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

from collect import jsonio
from collect.actions import Action, ActionError, validate_action
from collect.cli import run_cli
from collect.ledger import Budget, TaskContext, digest, ledger_from_dict
from collect.trajectory import iter_trajectories

EVAL_SPLITS = ("dev", "test")  # a task of these splits is never a training row (harvest, relabel)


class EvalTaskError(ValueError):
    """Training rows were asked for from evaluation-split tasks."""


def task_split(traj: dict) -> str | None:
    """The split of a trajectory's task as the collect engine recorded it (None in records written before it did)."""
    return (traj.get("task_meta") or {}).get("split")


def split_of(task_id: str, eval_share: float, seed: int = 0) -> str:
    """'eval' or 'train' from a stable hash of the task id (same answer in every process and run)."""
    h = hashlib.sha256(f"{seed}:{task_id}".encode()).digest()
    u = int.from_bytes(h[:8], "big") / 2**64
    return "eval" if u < eval_share else "train"


def _tool_call(action: Action) -> dict:
    """The completion's tool call with `arguments` as a mapping: what the Qwen2.5/Qwen3/Qwen3.5/Qwen3-Omni and
    hermes-style chat templates iterate (`arguments|items`) or render (`arguments|tojson`)."""
    return {"type": "function", "function": {"name": action.name, "arguments": dict(action.arguments)}}


def decision_completion(action: Action) -> list[dict]:
    """The assistant turn a decision row trains on (SFT rows) and that rl.train renders for a reference-guided GRPO
    candidate: one tool call, empty content."""
    return [{"role": "assistant", "content": "", "tool_calls": [_tool_call(action)]}]


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as chat templates expect them, i.e. as vLLM's chat endpoint hands them to the template (vLLM 0.31
    `entrypoints/chat_utils.py` `_postprocess_messages`, recorded in tests/fixtures/vllm_tool_parsers.json): assistant
    `tool_calls[].function.arguments` in the OpenAI wire form (a JSON string) decoded into a mapping, any other value
    that is not a mapping (empty, None, malformed, not a JSON object) made {}, and an empty `tool_calls` list dropped;
    everything else unchanged. So the model trains on the prompt it is served; a string would crash Qwen3.5's template
    (`arguments|items`)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if not isinstance(calls, list) or m.get("role") != "assistant":
            out.append(m)
            continue
        if not calls:
            out.append({k: v for k, v in m.items() if k != "tool_calls"})
            continue
        fixed = []
        for tc in calls:
            f = tc.get("function") if isinstance(tc, dict) else None
            if isinstance(f, dict) and not isinstance(f.get("arguments"), dict):
                args = f.get("arguments")
                try:
                    args = jsonio.loads(args) if isinstance(args, str) and args else args
                except jsonio.BadJSON:
                    args = None
                tc = {**tc, "function": {**f, "arguments": args if isinstance(args, dict) else {}}}
            fixed.append(tc)
        out.append({**m, "tool_calls": fixed})
    return out


def _digest_json(traj: dict, step: dict, ledger_dict: dict) -> str:
    """The digest the planner saw: recorded on the step when present, else recomputed from the ledger snapshot.

    Recomputing needs R0's budget; trajectories carry it as `r0` when the collector records it, else the default
    Budget is used (only `budget.steps_left` depends on it)."""
    if step.get("digest") is not None:
        d = step["digest"]
        return d if isinstance(d, str) else json.dumps(d, ensure_ascii=False)
    r0 = traj.get("r0") or {}
    budget = Budget(**r0["budget"]) if r0.get("budget") else Budget()
    ctx = TaskContext(task_id=traj["task_id"], question=traj.get("question", ""), budget=budget)
    return json.dumps(digest(ctx, ledger_from_dict(ledger_dict)), ensure_ascii=False)


def decision_rows(traj: dict, st: dict, action: Action, origin: str = "teacher", round_: int = 0) -> tuple[dict, dict]:
    """(sft row, rl_state row) for one recorded planner step labelled with `action` (already validated against the
    step's tools): SFT rows carry the step's `planner_input.messages` with tool-call arguments as mappings, RL rows
    the messages unchanged. `origin`/`round`: "teacher", 0 for the
    collected trajectories; "onpolicy", k for states a student planner reached in relabelling round k
    (collect.relabel)."""
    tools = st["planner_input"].get("tools") or []
    messages = st["planner_input"]["messages"]
    tools_json = json.dumps(tools, ensure_ascii=False)
    task_id = traj["task_id"]
    sft = {
        "prompt": template_messages(messages),  # tool-call arguments as mappings, as the chat templates expect
        "completion": decision_completion(action),
        "tools": tools_json,
        "task_id": task_id,
        "step": int(st["t"]),
        "kind": "decision",
        "origin": origin,
        "round": round_,
    }
    ledger = st.get("ledger_before") or {}
    rl = {
        # the recorded messages as they were (wire form): rl/train.py renders them itself (Arrow-inferred column,
        # see _features); only react-arm prompts carry tool calls
        "prompt": messages,
        "tools": tools_json,
        "tool_names": [t.get("function", t)["name"] for t in tools],
        "reference_action": json.dumps(action.to_dict(), ensure_ascii=False),
        "ledger": json.dumps(ledger, ensure_ascii=False),
        "digest": _digest_json(traj, st, ledger),
        "question": traj.get("question", ""),
        "gold_answer": str(traj.get("gold_answer", "")),
        "task_id": task_id,
        "step": int(st["t"]),
        "origin": origin,
        "round": round_,
    }
    return sft, rl


def rows_from_trajectory(traj: dict, stats: Counter) -> tuple[list[dict], list[dict]]:
    """(sft rows, rl_state rows) of one judged-correct trajectory; invalid / null-action steps are counted, skipped."""
    sft, rl = [], []
    task_id = traj["task_id"]
    np_ = traj.get("need_parse") or {}
    if np_.get("input", {}).get("messages") and np_.get("needs") is not None:
        sft.append(
            {
                "prompt": template_messages(np_["input"]["messages"]),
                "completion": [{"role": "assistant", "content": json.dumps(np_["needs"], ensure_ascii=False)}],
                "tools": "[]",
                "task_id": task_id,
                "step": -1,
                "kind": "need_parse",
                "origin": "teacher",
                "round": 0,
            }
        )
    for st in traj.get("steps", []):
        if st.get("action") is None:
            stats["steps_null_action"] += 1
            continue
        tools = st["planner_input"].get("tools") or []
        try:
            action = Action(st["action"]["name"], st["action"].get("arguments") or {})
            # as the tool got it: a window reference ("{window:0}") is a string where the schema wants a range
            validate_action(Action(action.name, st.get("resolved_arguments") or action.arguments), tools)
        except (ActionError, KeyError, TypeError) as e:
            stats["steps_invalid_action"] += 1
            print(f"harvest: task {task_id} step {st.get('t')}: skipped invalid action ({e})", file=sys.stderr)
            continue
        s_row, r_row = decision_rows(traj, st, action)
        sft.append(s_row)
        rl.append(r_row)
    return sft, rl


def message_features():
    """Arrow types of the message columns: each message is stored as JSON (datasets' `Json` feature) and decoded back
    to exactly the dict that was written. Why not Arrow structs: a struct column unifies the keys of every row, so a
    web_search call's arguments would come back with `code: None`, `asset_id: None`, ... from the other tools, and a
    template that iterates `arguments|items` would render those as parameters. JSON keeps each row's own keys (and
    their order, so the rendered call is byte-identical to `Action.to_text()` for hermes-style templates)."""
    from datasets import Json, List

    return List(Json())


def _features(name: str):
    """Explicit Arrow types of the SFT rows; RL states keep datasets' inferred types: rl/train.py replaces the
    `prompt` column by rendered text with `Dataset.map`, which keeps a column's declared type (a Json list would turn
    the text into a list of characters)."""
    from datasets import Features, Value

    if name != "sft":
        return None
    s = Value("string")
    cols = {"prompt": message_features(), "completion": message_features(), "tools": s, "task_id": s}
    return Features({**cols, "step": Value("int64"), "kind": s, "origin": s, "round": Value("int64")})


def _save(rows: dict[str, list[dict]], out: Path, name: str) -> None:
    from datasets import Dataset, DatasetDict

    for split, rs in rows.items():
        with open(out / f"{name}.{split}.jsonl", "w", encoding="utf-8") as f:
            for r in rs:
                f.write(jsonio.dumps(r, what=f"{name} row of task {r.get('task_id')}", ensure_ascii=False) + "\n")
    # an empty split (eval_share 0, or very few tasks) is left out: datasets cannot reload a saved empty Dataset
    features = _features(name)
    dd = DatasetDict({split: Dataset.from_list(rs, features=features) for split, rs in rows.items() if rs})
    dd.save_to_disk(str(out / name))


def harvest(
    trajectories_path: str | Path,
    out_dir: str | Path,
    eval_share: float = 0.1,
    seed: int = 0,
    allow_eval_tasks: bool = False,
) -> dict:
    """Read trajectory JSONL, write the SFT and RL-state datasets + stats; returns the stats dict. Trajectories of
    evaluation-split tasks are an EvalTaskError (nothing written) unless `allow_eval_tasks`."""
    if not 0.0 <= eval_share < 1.0:
        raise ValueError(f"eval_share must be in [0, 1), got {eval_share}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stats: Counter = Counter()
    sft = {"train": [], "eval": []}
    rl = {"train": [], "eval": []}
    tasks = {"train": set(), "eval": set()}
    actions: Counter = Counter()
    rows_per_task: dict[str, int] = {}
    if not Path(trajectories_path).is_file():
        raise FileNotFoundError(f"trajectory file not found: {trajectories_path}")
    skipped: list[int] = []  # broken lines: the same policy as every reader (collect.trajectory.iter_trajectories)
    eval_tasks: list[str] = []
    for lineno, traj in iter_trajectories(trajectories_path, skipped):
        stats["tasks_seen"] += 1
        if task_split(traj) in EVAL_SPLITS:
            eval_tasks.append(traj["task_id"])
        if traj.get("correct") is not True:
            stats["tasks_dropped_not_correct"] += 1
            continue
        s_rows, r_rows = rows_from_trajectory(traj, stats)
        if not r_rows:
            stats["tasks_dropped_no_valid_step"] += 1
            continue
        split = split_of(traj["task_id"], eval_share, seed)
        if traj["task_id"] in rows_per_task:
            raise ValueError(f"{trajectories_path}:{lineno}: task {traj['task_id']!r} appears twice")
        tasks[split].add(traj["task_id"])
        sft[split] += s_rows
        rl[split] += r_rows
        rows_per_task[traj["task_id"]] = len(s_rows)
        actions.update(json.loads(r["reference_action"])["name"] for r in r_rows)
    if eval_tasks and not allow_eval_tasks:
        raise EvalTaskError(
            f"{trajectories_path}: {len(eval_tasks)} trajectories are of evaluation-split tasks (e.g. "
            f"{eval_tasks[:3]}); training rows come only from train-split tasks: collect with --split train, or pass "
            "--allow-eval-tasks when the rows are held-out states for scoring, never for training"
        )
    # Rows in task-id order, not in the order concurrent tasks happened to finish: the datasets (and so SFT's
    # shuffled batches) are then a deterministic function of the trajectories.
    for rows in (*sft.values(), *rl.values()):
        rows.sort(key=lambda r: (r["task_id"], r.get("kind", "") != "need_parse", r["step"]))
    _save(sft, out, "sft")
    _save(rl, out, "rl_states")
    n_kept = len(rows_per_task)
    result = {
        "trajectories": str(trajectories_path),
        "eval_share": eval_share,
        "seed": seed,
        "tasks_seen": stats["tasks_seen"],
        "tasks_of_eval_splits": len(eval_tasks),  # > 0 only with allow_eval_tasks
        "lines_skipped_broken": len(skipped),
        "tasks_kept": n_kept,
        "tasks_dropped_not_correct": stats["tasks_dropped_not_correct"],
        "tasks_dropped_no_valid_step": stats["tasks_dropped_no_valid_step"],
        "tasks_train": len(tasks["train"]),
        "tasks_eval": len(tasks["eval"]),
        "steps_null_action": stats["steps_null_action"],
        "steps_invalid_action": stats["steps_invalid_action"],
        "sft_rows": {k: len(v) for k, v in sft.items()},
        "sft_rows_by_kind": dict(Counter(r["kind"] for v in sft.values() for r in v)),
        "rl_states": {k: len(v) for k, v in rl.items()},
        "rows_per_task_mean": round(sum(rows_per_task.values()) / n_kept, 3) if n_kept else 0.0,
        "rows_per_task_max": max(rows_per_task.values(), default=0),
        "action_distribution": dict(actions.most_common()),
    }
    jsonio.write_json(out / "harvest_stats.json", result)
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="harvest SFT rows and RL states from judged trajectories")
    ap.add_argument("trajectories", help="trajectory JSONL written by the collect stage")
    ap.add_argument("--out", required=True, help="output DATA dir (sft/, rl_states/, *.jsonl, harvest_stats.json)")
    ap.add_argument("--eval-share", type=float, default=0.1, help="share of task ids hashed into eval")
    ap.add_argument("--seed", type=int, default=0, help="salt of the task-id hash split")
    ap.add_argument(
        "--allow-eval-tasks",
        action="store_true",
        help="also harvest trajectories of dev/test tasks (held-out states for scoring; never train on them)",
    )
    a = ap.parse_args(argv)
    try:
        stats = harvest(a.trajectories, a.out, a.eval_share, a.seed, allow_eval_tasks=a.allow_eval_tasks)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(jsonio.dumps(stats, nonfinite="string", indent=1))


if __name__ == "__main__":
    run_cli(main, "rerun the same command: harvest rewrites its outputs whole")
