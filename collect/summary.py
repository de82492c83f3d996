"""Summaries of a run (collect or eval): accuracy with Wilson intervals, outcomes, tools, tokens, closure audit, cost.

Input is the list of trajectory records (see docs/trajectory.md). Pure functions; no I/O."""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from collect.ledger import ALL_TOOLS, GLOBAL_TOOLS, OUTCOMES, need_window


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score 95% interval for k successes out of n."""
    if n == 0:
        return (0.0, 0.0)
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


def _acc(records: list[dict]) -> dict:
    judged = [r for r in records if r.get("correct") is not None]
    k = sum(1 for r in judged if r["correct"])
    n = len(judged)
    lo, hi = wilson(k, n)
    return {"n": n, "correct": k, "accuracy": (k / n) if n else None, "ci95": [round(lo, 4), round(hi, 4)]}


def _group(records: list[dict], key: str) -> dict:
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        groups[str(r.get("task_meta", {}).get(key) or "unknown")].append(r)
    return {g: _acc(rs) for g, rs in sorted(groups.items())}


def planner_step_stats(records: list[dict]) -> dict:
    """Planner decisions, and the share of them that were a parseable, schema-valid action. The step share can be
    dominated by a few runs where a greedy planner repeats one rejected reply until the budget ends, so the runs with
    at least one rejected reply, and the most rejections in one run, are counted too."""
    total = valid = tasks_rejected = most = 0
    for r in records:
        rejected = 0
        for s in r.get("steps", []):
            if "planner_input" not in s:
                continue
            total += 1
            if s.get("action") is not None:
                valid += 1
            else:
                rejected += 1
        tasks_rejected += rejected > 0
        most = max(most, rejected)
    return {
        "planner_calls": total,
        "valid_actions": valid,
        "valid_action_rate": (valid / total) if total else None,
        "tasks_with_rejected_reply": tasks_rejected,
        "most_rejected_in_one_task": most,
    }


def window_stats(records: list[dict]) -> dict:
    """Time windows copied into perception calls. A windowed call is a perception call aimed (need_index) at a need
    whose query_focus (or need text) names a window, e.g. "between 35 s and 50 s" (collect.ledger.need_window); it
    matches when its time_range is that window, else it searches another part of the asset than the need names.
    Counted from each step's recorded ledger_before, so any run's records serve."""
    perception = set(ALL_TOOLS) - set(GLOBAL_TOOLS)
    calls = matches = tasks_wrong = 0
    for r in records:
        wrong = False
        for s in r.get("steps", []):
            a, needs = s.get("action"), (s.get("ledger_before") or {}).get("needs") or []
            if not isinstance(a, dict) or a.get("name") not in perception:
                continue
            args = s.get("resolved_arguments") or a.get("arguments") or {}  # what the tool got (references resolved)
            i = args.get("need_index")
            if type(i) is not int or not 0 <= i < len(needs):
                continue
            window = need_window(needs[i].get("query_focus"), needs[i].get("need"))
            if window is None:
                continue
            calls += 1
            tr = args.get("time_range")
            try:
                ok = tr is not None and len(tr) == 2 and (float(tr[0]), float(tr[1])) == window
            except (TypeError, ValueError):
                ok = False
            matches += ok
            wrong |= not ok
        tasks_wrong += wrong
    return {
        "windowed_calls": calls,
        "window_matches": matches,
        "window_match_rate": (matches / calls) if calls else None,
        "tasks_with_wrong_window": tasks_wrong,
    }


def closure_audit(records: list[dict]) -> dict:
    """Share of declared needs closed (filled) at the end, for correct and incorrect runs (paper §4.6)."""
    out = {}
    for label, want in (("correct", True), ("incorrect", False)):
        declared = filled = unfillable = 0
        for r in records:
            if r.get("correct") is not want:
                continue
            for nd in r.get("final_ledger", {}).get("needs", []):
                declared += 1
                filled += nd["status"] == "filled"
                unfillable += nd["status"] == "unfillable"
        out[label] = {
            "declared_needs": declared,
            "filled_share": (filled / declared) if declared else None,
            "unfillable_share": (unfillable / declared) if declared else None,
        }
    return out


def scoring_stats(records: list[dict]) -> dict:
    """Which scoring mode judged the records ("official" | "robust", "mixed" when they differ, None when unrecorded),
    and the tasks left unjudged (correct is None: the LLM judge gave no usable verdict; not in the accuracy)."""
    judges = [r["judge"] for r in records if isinstance(r.get("judge"), dict)]
    modes = sorted({str(j["mode"]) for j in judges if j.get("mode")})
    unjudged = [r for r in records if r.get("correct") is None]
    details = [str((r.get("judge") or {}).get("detail") or "") for r in unjudged]
    return {
        "scoring_mode": modes[0] if len(modes) == 1 else ("mixed" if modes else None),
        "n_unjudged": len(unjudged),
        "unjudged_tasks": [str(r.get("task_id")) for r in unjudged],
        "first_unjudged_detail": next((d for d in details if d), None),  # e.g. the judge endpoint's error message
    }


def missing_media_stats(records: list[dict]) -> dict:
    """Tasks that ran with missing media files (allow_missing_media; task_meta.missing_media): count and ids."""
    ids = [str(r.get("task_id")) for r in records if (r.get("task_meta") or {}).get("missing_media")]
    return {"n_missing_media": len(ids), "missing_media_tasks": ids}


def summarize(records: list[dict], prices_configured: bool = False) -> dict:
    outcomes = Counter(r.get("outcome") for r in records)
    by_outcome = {o: _acc([r for r in records if r.get("outcome") == o]) for o in OUTCOMES}
    tool_counts: Counter = Counter()
    n_tool_calls = []
    tokens_by_step: dict[int, list[int]] = defaultdict(list)
    chars_by_step: dict[int, list[int]] = defaultdict(list)
    faults: Counter = Counter()
    model_errors: Counter = Counter()
    tool_errors = 0
    cost = 0.0
    prompt_tokens = completion_tokens = 0
    by_role: dict[str, Counter] = defaultdict(Counter)  # role (incl. perception, judge) -> calls/tokens/retries/cost
    for r in records:
        calls = 0
        for s in r.get("steps", []):
            a = s.get("action")
            if a and a.get("name") != "finish":
                tool_counts[a["name"]] += 1
                calls += 1
            if "planner_input" in s:
                tokens_by_step[int(s["t"])].append(int(s.get("prompt_tokens") or 0))
                chars_by_step[int(s["t"])].append(
                    sum(len(m.get("content") or "") for m in s["planner_input"].get("messages", []))
                )
            for ev in s.get("events", []):
                if ev.get("kind") == "model_error":
                    model_errors[f"{ev.get('role', 'planner')}:{ev.get('error')}"] += 1
                elif ev.get("kind") == "tool_error":
                    tool_errors += 1
        n_tool_calls.append(calls)
        for k, v in (r.get("faults") or {}).items():
            faults[k] += v
        for role, u in (r.get("usage") or {}).items():
            if isinstance(u, dict):
                cost += float(u.get("cost_usd") or 0.0)
                prompt_tokens += int(u.get("prompt_tokens") or 0)
                completion_tokens += int(u.get("completion_tokens") or 0)
                for k in ("calls", "prompt_tokens", "completion_tokens", "retries"):
                    by_role[role][k] += int(u.get(k) or 0)
                by_role[role]["cost_usd"] += float(u.get("cost_usd") or 0.0)
    overall = _acc(records)
    mean = lambda xs: (sum(xs) / len(xs)) if xs else None  # noqa: E731
    summary = {
        "n_tasks": len(records),
        **{k: v for k, v in overall.items() if k != "n"},
        "n_judged": overall["n"],
        **scoring_stats(records),
        **missing_media_stats(records),
        "by_difficulty": _group(records, "difficulty"),
        "by_category": _group(records, "category"),
        "by_family": _group(records, "family"),
        "outcomes": {o: outcomes.get(o, 0) for o in OUTCOMES},
        "accuracy_by_outcome": by_outcome,
        "avg_tool_calls": mean(n_tool_calls),
        "tool_distribution": dict(sorted(tool_counts.items())),
        "planner_prompt_tokens_by_step": {str(k): round(mean(v), 1) for k, v in sorted(tokens_by_step.items())},
        "planner_prompt_chars_by_step": {str(k): round(mean(v), 1) for k, v in sorted(chars_by_step.items())},
        **planner_step_stats(records),
        "time_windows": window_stats(records),
        "closure_audit": closure_audit(records),
        "faults": dict(sorted(faults.items())),  # endpoint faults seen by the chat client (retried or not)
        "model_errors": dict(sorted(model_errors.items())),  # role:kind -> count (unusable model output)
        "tool_errors": tool_errors,
        "tokens": {"prompt": prompt_tokens, "completion": completion_tokens},
        # every chat call of the run by role: the loop's roles, media perception ("perception"), answer judge ("judge")
        "usage_by_role": {
            role: {k: c[k] for k in ("calls", "prompt_tokens", "completion_tokens", "retries")}
            | ({"cost_usd": round(c["cost_usd"], 6)} if prices_configured else {})
            for role, c in sorted(by_role.items())
        },
    }
    if prices_configured:
        summary["cost_usd"] = {"total": round(cost, 6), "per_task": round(cost / len(records), 6) if records else None}
    return summary
