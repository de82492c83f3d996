"""python -m collect.replay FILE: re-reduce every task's recorded events and check the recorded hashes.

For each record: initial_events, each step's events (checking the step's ledger_hash after it) and final_events are
reduced from an empty ledger; the result must equal final_ledger_hash and the hash of the recorded final_ledger.
Exit status 1 and the offending task ids on stdout when any differ; 0 otherwise.
"""

from __future__ import annotations

import argparse
import sys

from collect.cli import run_cli
from collect.ledger import event_from_dict, initial_ledger, ledger_from_dict, reduce, state_hash
from collect.trajectory import read_trajectories


def replay_record(rec: dict) -> list[str]:
    """Problems found replaying one record (empty when it reproduces)."""
    problems = []
    s = initial_ledger()
    try:
        for e in rec.get("initial_events", []):
            s = reduce(s, event_from_dict(e))
        for step in rec.get("steps", []):
            for e in step.get("events", []):
                s = reduce(s, event_from_dict(e))
            if step.get("ledger_hash") != state_hash(s):
                problems.append(f"step {step.get('t')}: hash {state_hash(s)} != recorded {step.get('ledger_hash')}")
        for e in rec.get("final_events", []):
            s = reduce(s, event_from_dict(e))
    except (ValueError, TypeError, KeyError) as e:
        return [f"events do not replay: {e}"]
    h = state_hash(s)
    if h != rec.get("final_ledger_hash"):
        problems.append(f"final hash {h} != recorded final_ledger_hash {rec.get('final_ledger_hash')}")
    try:
        recorded = state_hash(ledger_from_dict(rec.get("final_ledger") or {}))
    except (TypeError, KeyError) as e:
        recorded = f"unreadable ({e})"
    if h != recorded:
        problems.append(f"final hash {h} != hash of recorded final_ledger {recorded}")
    if s.outcome != rec.get("outcome"):
        problems.append(f"replayed outcome {s.outcome!r} != recorded {rec.get('outcome')!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m collect.replay", description=__doc__.splitlines()[0])
    ap.add_argument("file", help="trajectories JSONL written by collect")
    args = ap.parse_args(argv)
    records = read_trajectories(args.file)
    bad = []
    for rec in records:
        problems = replay_record(rec)
        if problems:
            bad.append(rec["task_id"])
            for p in problems:
                print(f"{rec['task_id']}: {p}", file=sys.stderr)
    if bad:
        print("\n".join(bad))
        print(f"replay: {len(bad)}/{len(records)} task(s) differ in {args.file}", file=sys.stderr)
        return 1
    print(f"replay: {len(records)} task(s) reproduce their final ledger hash", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_cli(main, "nothing was changed")
