"""Runtime overhead: microseconds per step spent in reduce + digest + bookkeeping (no LLM, no tool)."""

from __future__ import annotations

import random
import statistics
import time

from collect.ledger import (
    Asset,
    Budget,
    Ledger,
    NeedsDeclared,
    NeedSpec,
    NeedUpdate,
    NormalizedObservation,
    ObservationCommitted,
    TaskContext,
    Verdict,
    any_action_can_advance,
    canonical_args,
    digest,
    reduce,
    render_digest,
    state_hash,
)


def _episode(n_needs: int, rng: random.Random) -> tuple[TaskContext, list]:
    specs = []
    for i in range(n_needs):
        deps = tuple(sorted(rng.sample(range(i), k=min(i, rng.randint(0, 2))))) if i else ()
        src = rng.choice(["visual", "subtitle", "audio", "web", "computation"])
        specs.append(NeedSpec(f"need {i}: attribute of entity", src, "blocking", "external_fact", deps, f"focus {i}"))
    r0 = TaskContext("bench", "q", (Asset("v1", "video", 600.0),), budget=Budget(max_steps=40))
    events = [NeedsDeclared(tuple(specs))]
    for step in range(30):
        i = rng.randrange(n_needs)
        value = rng.choice(["alpha", "beta", "1999", "2001"])
        status = rng.choice(["filled", "filled", "partial", "unfilled"])
        obs = NormalizedObservation("web_search", True, "snippet " * 60, items=("a", "b", "c"))
        v = Verdict(
            "INSUFFICIENT", "insufficient", "gap", (NeedUpdate(i, status, value if status == "filled" else None),)
        )
        events.append(ObservationCommitted("web_search", canonical_args({"query": f"q{step}"}), obs, v, i))
    return r0, events


def run(repeats: int = 30, seed: int = 0) -> dict:
    rng = random.Random(seed)
    per_step_us: list[float] = []
    sizes = {}
    for n in (5, 10, 20):
        for _ in range(repeats):
            r0, events = _episode(n, rng)
            s = reduce(Ledger(), events[0])
            for ev in events[1:]:
                t0 = time.perf_counter()
                s = reduce(s, ev)
                render_digest(r0, s)  # what the planner reads
                any_action_can_advance(r0, s)  # stopping check
                state_hash(s)  # trajectory bookkeeping
                per_step_us.append((time.perf_counter() - t0) * 1e6)
            sizes[n] = len(render_digest(r0, s))
    return {
        "name": "runtime_overhead",
        "figure": round(statistics.median(per_step_us), 1),
        "unit": "us/step (median)",
        "target": "<= 1000 us",
        "met": statistics.median(per_step_us) <= 1000,
        "inputs": {"needs": [5, 10, 20], "steps_per_episode": 30, "episodes_per_size": repeats},
        "extra": {
            "p90_us": round(sorted(per_step_us)[int(0.9 * len(per_step_us))], 1),
            "digest_chars_by_needs": sizes,
            "digest_keys": sorted(digest(*_episode(5, rng)[:1], Ledger())),
        },
    }


def reducer_scaling(sizes: tuple[int, ...] = (250, 1000, 4000), repeats: int = 3) -> dict:
    """One hostile critic verdict with k mutually conflicting updates on one need: seconds per reduce at each k.
    Linear work gives a 4x time ratio per 4x updates; the old reducer grew about k^2.5 (issue 16)."""
    obs = NormalizedObservation("web_search", True, "s")
    base = reduce(Ledger(), NeedsDeclared((NeedSpec("x"),)))
    secs = {}
    for k in sizes:
        v = Verdict("INSUFFICIENT", updates=tuple(NeedUpdate(0, "filled", f"v{i}") for i in range(k)))
        ev = ObservationCommitted("web_search", "{}", obs, v)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            reduce(base, ev)
            best = min(best, time.perf_counter() - t0)
        secs[k] = best
    ratio = secs[sizes[-1]] / secs[sizes[-2]]
    return {
        "name": "reducer_verdict_scaling",
        "figure": round(ratio, 2),
        "unit": f"time ratio, {sizes[-1]} vs {sizes[-2]} conflicting updates in one verdict",
        "target": "<= 6 (linear: 4)",
        "met": ratio <= 6,
        "inputs": {"updates": list(sizes), "repeats": repeats},
        "extra": {"seconds_by_updates": {k: round(s, 5) for k, s in secs.items()}},
    }
