"""`make eval CONFIG=configs/eval/embedded.yaml [PLANNER=...] [OUT=runs/eval] [SPLIT=] [LIMIT=]`: the ledger runtime
over a split with the planner swapped, critic and finalizer fixed by the base collect config.

One config describes a matrix of cells, planner x arm x perception backend; each cell is an ordinary (resumable)
collect run in OUT/cells/<planner>__<arm>__<perception>/. Then OUT/summary.json gathers every cell's summary and
OUT/report.html renders them. Per planner (seeds pooled): accuracy with its Wilson interval, per-seed accuracies,
outcomes, answerable-task accuracy, unanswerable -> insufficient rate, valid own-step actions and, with `heldout`, the
greedy decision scores (rl.score) of each checkpoint on held-out teacher states. A planner is a pipeline.planners
spec (offline | {checkpoint: DIR} | {endpoint: {...}}); {checkpoint: [DIR_seed0, DIR_seed1, ...]} is one planner
trained with several seeds, a cell per seed (NAME@0, NAME@1, ...) and the seeds pooled in summary.json "planners". A
checkpoint or endpoint planner may add `runtime: {...}`, RuntimeConfig overrides for its cells only (e.g.
{references: []}); two planner names with the same checkpoints then compare runtimes on one model.

`python -m pipeline.eval --merge OUT_A OUT_B ... --out OUT` pools finished evals run apart (one per seed or per node)
into one summary.json and report.html, as if one config had listed them all (`merge_evals`).
"""

from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import json
import logging
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from collect import jsonio
from collect.cli import run_cli
from collect.config import EndpointConfig, RuntimeConfig, from_mapping, load_config, load_recipe
from collect.ledger import INSUFFICIENT, OUTCOMES
from collect.processes import parse_processes, raise_first, resolve_processes, run_spawned, threads_per_process
from collect.run import RunDirError, run_collection, setup_logging
from collect.summary import _acc, planner_step_stats, wilson, window_stats
from collect.trajectory import read_trajectories
from pipeline.planners import (
    PLANNER_ENDPOINT,
    parse_planner_arg,
    planner_endpoint,
    planner_name,
    require_checkpoint,
    trained_task_ids,
)
from pipeline.report import write_report
from rl.score import score

log = logging.getLogger("eval")


@dataclass
class EvalConfig:
    base: str = field(default="configs/collect/embedded.yaml", metadata={"help": "collect recipe for everything else"})
    name: str = field(default="eval", metadata={"help": "report title"})
    split: str = field(default="test", metadata={"help": "split to evaluate on"})
    limit: int | None = field(default=None, metadata={"help": "first N tasks of the split (same for every cell)"})
    planners: dict = field(default_factory=lambda: {"teacher": "offline"}, metadata={"help": "name -> planner"})
    arms: list = field(default_factory=lambda: ["ledger"], metadata={"help": "ledger | react | memory"})
    perception: dict = field(
        default_factory=lambda: {"annotations": {}}, metadata={"help": "name -> ToolsConfig overrides"}
    )
    planner_endpoint: dict = field(
        default_factory=lambda: dict(PLANNER_ENDPOINT),
        metadata={"help": "endpoint settings of checkpoint and URL planners (pipeline.planners.PLANNER_ENDPOINT)"},
    )
    concurrency: int | None = field(default=None, metadata={"help": "override runtime.concurrency"})
    workers: int | str | None = field(default=None, metadata={"help": "override the collect `workers` (N | auto)"})
    allow_missing_media: bool = field(
        default=False, metadata={"help": "run tasks whose media files are missing (the collect key of that name)"}
    )
    planner_processes: int | str = field(
        default=1,
        metadata={
            "help": "planners evaluated at once, each in its own process with usable cores / N torch threads "
            "(N | auto: min(planners, usable cores)); cells, records and the summary are the same as with 1"
        },
    )
    heldout: dict | None = field(
        default=None,
        metadata={"help": "rl.score of every checkpoint on held-out states: {dataset_dir, split, n, config}"},
    )

    def __post_init__(self):
        if not self.planners:
            raise ValueError("eval config: `planners` is empty")
        self.planners = expand_seeds(self.planners)
        self.planner_processes = parse_processes(self.planner_processes, "planner_processes")
        runtime_fields = {f.name for f in dataclasses.fields(RuntimeConfig)} - {"arm", "concurrency"}
        for name, spec in self.planners.items():
            keys = set(spec) - {"runtime"} if isinstance(spec, dict) else None
            ok = spec == "offline" or keys in ({"checkpoint"}, {"endpoint"}, {"checkpoint", "endpoint"})
            if not ok:
                raise ValueError(
                    f"planners.{name}: expected 'offline', {{checkpoint: DIR}} or {{endpoint: {{...}}}}, got {spec!r}"
                )
            rt = spec.get("runtime") if isinstance(spec, dict) else None
            if rt is not None and (not isinstance(rt, dict) or set(rt) - runtime_fields):
                bad = sorted(set(rt) - runtime_fields) if isinstance(rt, dict) else rt
                raise ValueError(
                    f"planners.{name}.runtime: expected a mapping of runtime fields ({sorted(runtime_fields)}; arm "
                    f"and concurrency come from `arms` / `concurrency`), got {bad!r}"
                )
            if keys == {"checkpoint", "endpoint"} and {"base_url", "model"} & set(spec["endpoint"]):
                raise ValueError(f"planners.{name}: a served checkpoint gets its base_url/model from serve.local")
            if isinstance(spec, dict):  # the endpoint it will get, checked now rather than when its cells start
                ep = {**self.planner_endpoint, **(spec.get("endpoint") or {})}
                if "checkpoint" in spec:
                    ep |= {"base_url": "http://127.0.0.1:1/v1", "model": "served"}  # what serve.local sets
                from_mapping(EndpointConfig, ep, f"planners.{name}.endpoint")


def expand_seeds(planners: dict) -> dict:
    """{checkpoint: [DIR, ...]} -> one planner per checkpoint, NAME@0, NAME@1, ... (a single-item list: NAME)."""
    out = {}
    for name, spec in planners.items():
        ckpt = spec.get("checkpoint") if isinstance(spec, dict) else None
        if isinstance(ckpt, list | tuple):
            if "@" in name or not ckpt:
                raise ValueError(f"planners.{name}: a seed list needs a name without '@' and at least one checkpoint")
            for i, c in enumerate(ckpt):
                out[name if len(ckpt) == 1 else f"{name}@{i}"] = {**spec, "checkpoint": str(c)}
        else:
            out[name] = spec
    return out


def planner_family(pname: str) -> str:
    return pname.split("@", 1)[0]


def task_type_stats(records: list[dict]) -> dict:
    """Answerable-task accuracy and the share of unanswerable tasks answered 'insufficient' (embedded world)."""

    def kind(r):
        return (r.get("task_meta") or {}).get("answer_type")

    ans = [r for r in records if kind(r) != "unanswerable" and r.get("correct") is not None]
    una = [r for r in records if kind(r) == "unanswerable"]
    k_ans = sum(bool(r["correct"]) for r in ans)
    k_una = sum(str(r.get("answer") or "").strip().lower().rstrip(".") == INSUFFICIENT for r in una)
    # the runtime also answers "insufficient" when the step budget runs out: count the planner's own stops apart
    declared = sum(r.get("outcome") == "insufficient" for r in una)
    return {
        "answerable": {
            "n": len(ans),
            "correct": k_ans,
            "accuracy": k_ans / len(ans) if ans else None,
            "ci95": [round(x, 4) for x in wilson(k_ans, len(ans))],
        },
        "unanswerable": {
            "n": len(una),
            "insufficient": k_una,
            "rate": k_una / len(una) if una else None,
            "declared_insufficient": declared,
            "ci95": [round(x, 4) for x in wilson(k_una, len(una))],
        },
    }


def pool_planners(cells: dict[str, dict], records: dict[str, list[dict]]) -> dict:
    """Cells of the same planner family, arm and perception (the seeds of one planner) pooled: every task run counts
    once in the Wilson interval; per-seed accuracies and held-out scores are listed beside it."""
    groups: dict[str, list[str]] = {}
    for cell, s in cells.items():
        key = f"{planner_family(s['planner'])}__{s.get('arm', 'ledger')}__{s['perception']}"
        groups.setdefault(key, []).append(cell)
    pooled = {}
    for key, names in groups.items():
        recs = [r for n in names for r in records[n]]
        acc = _acc(recs)
        steps = planner_step_stats(recs)
        heldout = [cells[n]["heldout"] for n in names if cells[n].get("heldout")]
        pooled[key] = {
            "planner": planner_family(cells[names[0]]["planner"]),
            "seeds": names,
            "n_seeds": len(names),
            "n_task_runs": len(recs),
            "accuracy": acc["accuracy"],
            "correct": acc["correct"],
            "ci95": acc["ci95"],
            "seed_accuracies": [cells[n].get("accuracy") for n in names],
            "outcomes": {o: sum(cells[n]["outcomes"].get(o, 0) for n in names) for o in OUTCOMES},
            "valid_action_rate": steps["valid_action_rate"],
            "planner_calls": steps["planner_calls"],
            "tasks_with_rejected_reply": steps["tasks_with_rejected_reply"],
            "most_rejected_in_one_task": steps["most_rejected_in_one_task"],
            "time_windows": window_stats(recs),
            **task_type_stats(recs),
            "heldout": {
                k: sum(h[k] for h in heldout) / len(heldout)
                for k in (
                    "valid",
                    "reference_tool_match",
                    "reference_action_match",
                    "reference_query_match",
                    "compute",  # the greedy program prints the teacher program's value (rewards.execution)
                    "total",
                )
                if heldout and all(h.get(k) is not None for h in heldout)
            }
            or None,
        }
    return pooled


def score_heldout(spec, heldout: dict) -> dict | None:
    """rl.score of a checkpoint planner on held-out teacher states (None for the teacher and URL planners)."""
    if not isinstance(spec, dict) or "checkpoint" not in spec:
        return None
    res = score(
        heldout["dataset_dir"],
        spec["checkpoint"],
        split=heldout.get("split", "train"),
        n=int(heldout.get("n", 100000)),
        config=heldout.get("config"),
    )
    keys = (
        "n",
        "valid",
        "gate",
        "target",
        "align",
        "compute",
        "total",
        "reference_tool_match",
        "reference_action_match",
    )
    return {k: res.get(k) for k in (*keys, "reference_query_match", "n_with_query")}


def load_eval_config(path: str, planner: str | None = None, overrides: dict | None = None) -> EvalConfig:
    """An eval recipe (collect.config.load_recipe); `planner` (PLANNER=) replaces its planners, `overrides` (split,
    limit, ...) its keys."""
    cfg = load_recipe(EvalConfig, path, overrides, "eval config")
    if planner:
        cfg.planners = {planner_name(planner): parse_planner_arg(planner)}
    return cfg


def _base_config(cfg: EvalConfig):
    overrides = {"split": cfg.split, "limit": cfg.limit, "workers": cfg.workers}
    if cfg.allow_missing_media:
        overrides["allow_missing_media"] = True
    return load_config(cfg.base, overrides)


def _eval_planner(
    cfg: EvalConfig, base, pname: str, out: Path, run_kw: dict, heldout_scores: dict, progress: bool | None = None
) -> tuple[dict[str, dict], dict[str, list[dict]]]:
    """Every cell of one planner (arm x perception), each an ordinary collect run in OUT/cells/<cell>/ from the base
    collect config `base`; with `heldout`, the planner's held-out decision scores (cached per checkpoint)."""
    spec = cfg.planners[pname]
    cells: dict[str, dict] = {}
    records: dict[str, list[dict]] = {}
    with planner_endpoint(spec, cfg.planner_endpoint) as endpoint:
        for arm in cfg.arms:
            for perc_name, perc in cfg.perception.items():
                cell = f"{pname}__{arm}__{perc_name}"
                c = copy.deepcopy(base)
                c.name = cell
                if progress is not None:
                    c.progress = progress
                c.runtime = dataclasses.replace(
                    c.runtime,
                    **(spec.get("runtime") or {} if isinstance(spec, dict) else {}),
                    arm=arm,
                    concurrency=cfg.concurrency or c.runtime.concurrency,
                )
                c.tools = {**c.tools, **perc}
                if endpoint is not None:
                    c.endpoints = {**c.endpoints, "planner": endpoint}
                    c.roles = dataclasses.replace(c.roles, planner="planner")
                cell_out = out / "cells" / cell
                log.info("cell %s -> %s", cell, cell_out)
                cells[cell] = run_collection(c, cell_out, **run_kw)
                cells[cell]["planner"] = pname
                cells[cell]["perception"] = perc_name
                records[cell] = list(read_trajectories(cell_out / "trajectories.jsonl"))
                cells[cell].update(task_type_stats(records[cell]))
                cells[cell]["trained_on_scored_tasks"] = _trained_on_scored(pname, spec, records[cell])
    if cfg.heldout:  # greedy decisions on fixed states: one score per checkpoint, whatever the runtime
        key = spec.get("checkpoint") if isinstance(spec, dict) else None
        if key not in heldout_scores:
            heldout_scores[key] = score_heldout(spec, cfg.heldout)
        for cell in cells:
            cells[cell]["heldout"] = heldout_scores[key]
    return cells, records


def _trained_on_scored(pname: str, spec, records: list[dict]) -> int | None:
    """How many of the scored tasks a checkpoint planner was trained on (pipeline.planners.trained_task_ids; None
    when unknown); a warning names them. A planner trained on what it is scored on reports a contaminated figure."""
    if not (isinstance(spec, dict) and "checkpoint" in spec):
        return None
    trained = trained_task_ids(spec["checkpoint"])
    if trained is None:
        return None
    both = sorted({r["task_id"] for r in records} & trained)
    if both:
        log.warning(
            "planner %s was trained on %d of the %d tasks it is scored on (e.g. %s): its accuracy there is not "
            "held out",
            pname,
            len(both),
            len(records),
            both[:3],
        )
    return len(both)


def _planner_process(cfg: EvalConfig, pname: str, out: Path, run_kw: dict, threads: int) -> dict[str, dict]:
    """One planner's cells in a spawned process with `threads` torch threads (records are re-read by the parent)."""
    import torch

    torch.set_num_threads(threads)
    setup_logging()
    cells, _ = _eval_planner(cfg, _base_config(cfg), pname, out, run_kw, {}, progress=False)
    return cells


def _run_planners_in_processes(cfg: EvalConfig, out: Path, run_kw: dict, n: int) -> dict[str, dict]:
    """The planners N at a time, in config order, in N spawned processes (each takes the next planner). A planner that
    fails does not stop the others (their cells stay on disk, resumable); the first failure is raised once all end."""
    threads = threads_per_process(n)
    log.info("%d planners, %d at a time, %d torch thread(s) each", len(cfg.planners), n, threads)

    def report(pname: str, cells: dict, finished: int, total: int) -> None:
        accs = ", ".join(f"{c} accuracy {s.get('accuracy')}" for c, s in cells.items())
        log.info("planner %s done (%d/%d): %s", pname, finished, total, accs)

    jobs = {p: (cfg, p, out, run_kw, threads) for p in cfg.planners}
    done, errors = run_spawned(_planner_process, jobs, n, "planner", report)
    raise_first(errors, "planner", (RunDirError,))  # main() reports these types as a clear error
    return {cell: s for p in cfg.planners for cell, s in done[p].items()}  # config order, as one process writes it


def run_eval(cfg: EvalConfig, out: Path, overwrite: bool = False, rerun_changed: bool = False) -> dict:
    """Every cell of the recipe into OUT/cells/ (each resumable; `overwrite` / `rerun_changed` as collect's), then
    OUT/summary.json and OUT/report.html."""
    run_kw = {"overwrite": overwrite, "rerun_changed": rerun_changed}
    out.mkdir(parents=True, exist_ok=True)
    base = _base_config(cfg)  # a broken base config fails here, before any cell or process starts
    n = resolve_processes(cfg.planner_processes, len(cfg.planners))
    cells: dict[str, dict] = {}
    records: dict[str, list[dict]] = {}
    if n > 1:
        for pname, spec in cfg.planners.items():  # fail before any process starts, as one process fails at its turn
            if isinstance(spec, dict) and "checkpoint" in spec:
                require_checkpoint(spec, f"planner {pname}")
        cells = _run_planners_in_processes(cfg, out, run_kw, n)
        records = {cell: list(read_trajectories(out / "cells" / cell / "trajectories.jsonl")) for cell in cells}
    else:
        heldout_scores: dict[str | None, dict | None] = {}
        for pname in cfg.planners:
            c, r = _eval_planner(cfg, base, pname, out, run_kw, heldout_scores)
            cells.update(c)
            records.update(r)
    return write_summary(out, {"name": cfg.name, "split": cfg.split, "limit": cfg.limit}, cells, records)


def write_summary(out: Path, head: dict, cells: dict[str, dict], records: dict[str, list[dict]]) -> dict:
    """OUT/summary.json (head, the seeds pooled per planner, every cell) and OUT/report.html."""
    planners = pool_planners(cells, records)
    summary = {**head, "planners": planners, "cells": cells}
    jsonio.write_json(out / "summary.json", summary)  # strict JSON (a figure that is not finite: as text)
    write_report(out / "report.html", head["name"], cells, records, planners)
    return summary


def merge_evals(inputs: list[str | Path], out: str | Path, name: str | None = None) -> dict:
    """Several finished eval OUTs (e.g. one per training seed, run on different nodes) -> one OUT whose summary pools
    them as if one config had listed every planner: each input cell is copied to OUT/cells/ (an ordinary collect run,
    its `source` recorded); a cell name found in more than one input gets the planner name NAME@inK (NAME-inK where
    NAME already has a seed suffix), K the input's position, so its seeds pool under NAME's family. The inputs must
    share split and limit; their held-out scores travel with their cells."""
    inputs, out = [Path(d) for d in inputs], Path(out)
    if len(inputs) < 2:
        raise ValueError("--merge needs at least two eval OUT directories")
    heads = []
    for d in inputs:
        f = d / "summary.json"
        if not f.is_file():
            raise FileNotFoundError(f"{f} not found: merge finished evals (a stopped one resumes with the same --out)")
        heads.append(json.loads(f.read_text()))
        if not isinstance(heads[-1].get("cells"), dict):
            raise ValueError(f"{f} is not a pipeline.eval summary (no `cells`): pass eval OUT directories")
        if out.resolve() == d.resolve():
            raise ValueError(f"--out {out} is one of the inputs; merge into a new directory")
    for key in ("split", "limit"):
        vals = {json.dumps(h.get(key)) for h in heads}
        if len(vals) > 1:
            got = ", ".join(f"{d}: {h.get(key)!r}" for d, h in zip(inputs, heads, strict=True))
            raise ValueError(f"the evals differ in {key} ({got}); only runs over the same tasks pool")
    if (out / "cells").exists() and any((out / "cells").iterdir()):
        raise RunDirError(f"{out}/cells is not empty; merge into a new directory")
    out.mkdir(parents=True, exist_ok=True)
    seen = collections.Counter(cell for h in heads for cell in h["cells"])
    cells: dict[str, dict] = {}
    records: dict[str, list[dict]] = {}
    for k, (d, h) in enumerate(zip(inputs, heads, strict=True)):
        for cell, s in h["cells"].items():
            planner, rest = s["planner"], cell[len(s["planner"]) :]
            if not cell.startswith(planner):
                raise ValueError(f"{d}/summary.json: cell {cell!r} does not start with its planner {planner!r}")
            if seen[cell] > 1:
                planner = f"{planner}{'-' if '@' in planner else '@'}in{k}"
            new = planner + rest
            src = d / "cells" / cell
            if not (src / "trajectories.jsonl").is_file():
                raise FileNotFoundError(f"{src}/trajectories.jsonl not found (summary.json names cell {cell})")
            shutil.copytree(src, out / "cells" / new)
            cells[new] = {**s, "planner": planner, "source": str(src)}
            records[new] = list(read_trajectories(out / "cells" / new / "trajectories.jsonl"))
    head = {
        "name": name or " + ".join(str(h.get("name")) for h in heads),
        "split": heads[0].get("split"),
        "limit": heads[0].get("limit"),
        "merged_from": [str(d) for d in inputs],
    }
    return write_summary(out, head, cells, records)


HELDOUT_SHOWN = ("valid", "reference_tool_match", "reference_query_match")


def format_planners(summary: dict) -> str:
    w = max([36, *(len(k) for k in summary.get("planners", {}))])
    head = (
        f"{'planner (seeds pooled)':{w}s} {'seeds':>5s} {'runs':>5s} {'acc':>7s} {'95% CI':>15s} {'answerable':>10s} "
    )
    head += f"{'unans->ins':>10s} {'valid':>7s} {'rej.runs':>8s} {'window':>7s} {'heldout valid/tool/query':>25s}"
    lines = [head, "-" * len(head)]
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    for key, p in summary.get("planners", {}).items():
        ci, h = p["ci95"], p.get("heldout") or {}
        lines.append(
            f"{key:{w}s} {p['n_seeds']:5d} {p['n_task_runs']:5d} {pct(p['accuracy']):>7s} "
            f"{ci[0] * 100:6.1f}-{ci[1] * 100:5.1f}% {pct(p['answerable']['accuracy']):>10s} "
            f"{pct(p['unanswerable']['rate']):>10s} {pct(p['valid_action_rate']):>7s} "
            f"{p.get('tasks_with_rejected_reply', 0):8d} "
            f"{pct((p.get('time_windows') or {}).get('window_match_rate')):>7s} "
            f"{'/'.join(pct(h.get(k)) for k in HELDOUT_SHOWN) if h else '-':>25s}"
        )
    return "\n".join(lines)


def format_table(summary: dict) -> str:
    head = f"{'cell':44s} {'n':>4s} {'acc':>7s} {'95% CI':>15s} {'valid':>7s}  outcomes (acc/rep/forced/insuff/budget)"
    lines = [head, "-" * len(head)]
    for name, s in summary["cells"].items():
        oc = s["outcomes"]
        ci = s.get("ci95") or [0, 0]
        acc = s.get("accuracy")
        valid = s.get("valid_action_rate")
        lines.append(
            f"{name:44s} {s['n_tasks']:4d} {(acc or 0) * 100:6.1f}% {ci[0] * 100:6.1f}-{ci[1] * 100:5.1f}% "
            f"{(valid or 0) * 100:6.1f}%  {oc['accepted']}/{oc['repaired']}/{oc['forced']}/{oc['insufficient']}/"
            f"{oc['budget_exhausted']}"
        )
    for name, s in summary["cells"].items():  # a figure over fewer tasks than it says must not pass unnoticed
        if s.get("n_unjudged"):
            lines.append(
                f"warning: {name}: {s['n_unjudged']} of {s['n_tasks']} task(s) unjudged, not in its accuracy "
                f"(first: {s.get('first_unjudged_detail') or 'no detail'})"
            )
        if s.get("trained_on_scored_tasks"):
            lines.append(f"warning: {name}: trained on {s['trained_on_scored_tasks']} of the tasks it is scored on")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.eval", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/eval/embedded.yaml")
    ap.add_argument("--planner", default=None, help="offline | checkpoint dir | URL#model (replaces `planners`)")
    ap.add_argument("--split", default=None, help="the split to evaluate on (replaces the recipe's `split`)")
    ap.add_argument("--limit", type=int, default=None, help="the first N tasks of the split (replaces `limit`)")
    ap.add_argument("--out", default="runs/eval")
    ap.add_argument("--overwrite", action="store_true", help="discard the cells' earlier runs")
    ap.add_argument("--rerun-changed", action="store_true", help="run again the tasks whose content changed since")
    ap.add_argument("--workers", default=None, help="worker processes per cell: N or 'auto' (docs/scale.md)")
    ap.add_argument(
        "--planner-processes", default=None, help="planners evaluated at once, each in its own process: N or 'auto'"
    )
    ap.add_argument(
        "--allow-missing-media",
        action="store_true",
        default=None,
        help="run tasks whose media files are missing (perception sees none; counted in the summary)",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        metavar="EVAL_OUT",
        default=None,
        help="pool finished eval OUTs (e.g. one per seed) into --out instead of running a config",
    )
    args = ap.parse_args(argv)
    setup_logging()
    try:
        if args.merge:
            summary = merge_evals(args.merge, args.out)
        else:
            overrides = {
                "split": args.split,
                "limit": args.limit,
                "workers": args.workers,
                "planner_processes": args.planner_processes,
                "allow_missing_media": args.allow_missing_media,
            }
            cfg = load_eval_config(args.config, args.planner, overrides)
            summary = run_eval(cfg, Path(args.out), overwrite=args.overwrite, rerun_changed=args.rerun_changed)
    except (ValueError, FileNotFoundError, RunDirError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table(summary))
    print()
    print(format_planners(summary))
    print(f"\nwrote {args.out}/summary.json and {args.out}/report.html")
    return 0


if __name__ == "__main__":
    run_cli(main)
