"""The embedded world: determinism, sizes, families, vocabulary, distractors, cache."""

from __future__ import annotations

import collections
import difflib
import hashlib
import json
import time

import pytest

from collect.ledger import NeedSpec
from collect.teacher import value_in_text
from collect.world import FAMILIES, build_world, load_world


@pytest.fixture(scope="module")
def world():
    return build_world(0)


def test_same_seed_gives_identical_bytes_and_other_seed_differs(world):
    assert build_world(0).to_json() == world.to_json()
    assert build_world(1).to_json() != world.to_json()


# sha256 of build_world(0).to_json() for WORLD_VERSION 1. A change here changes every cached world, trajectory and
# dataset built from seed 0: make it on purpose (and bump WORLD_VERSION), never as a refactor's side effect.
SEED0_SHA256 = "8be8ae5fb206bf562ddbf19ed6736a68ae20b6b38848e765b3b8d3453cf3e7ec"


def test_seed0_bytes_are_pinned(world):
    assert hashlib.sha256(world.to_json().encode("utf-8")).hexdigest() == SEED0_SHA256


def test_a_larger_world_only_adds_tasks_and_keeps_the_default_hash():
    """`tasks.n_tasks` (more training tasks): the first 360 tasks, so the 72-task test split, stay the same; new train
    tasks bring new entities (none of a test task's); the default size leaves config_hash as before the key."""
    from collect.config import CollectConfig, TaskSource
    from collect.tasks import TASK_LIMIT_KEYS

    small, big = build_world(0), build_world(0, n_tasks=720)
    assert [t.model_dump() for t in big.tasks[:360]] == [t.model_dump() for t in small.tasks]
    assert collections.Counter(t.split for t in big.tasks[360:]) == {"train": 216, "dev": 72, "test": 72}
    test_entities = {t.meta["entity"] for t in small.tasks if t.split == "test"}
    assert not test_entities & {t.meta["entity"] for t in big.tasks[360:] if t.split == "train"}
    default = CollectConfig(tasks=TaskSource(kind="embedded", seed=0))
    d = default.to_dict()
    for k in ("limit", "progress", "harvest", "name", "workers", "shard"):
        d.pop(k)
    assert d["tasks"].pop("n_tasks") == 360  # the hash of a default-size recipe is the hash without the key
    for k in TASK_LIMIT_KEYS:  # the task source's size limits are never in it (test_tasks_strict)
        d["tasks"].pop(k)
    d["tools"]["web_stemmer"] = "english"  # the bm25 search the trajectories were made with
    assert default.hash() == hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]
    assert CollectConfig(tasks=TaskSource(n_tasks=720)).hash() != default.hash()


def test_sizes_splits_families_categories_difficulties(world):
    assert len(world.tasks) >= 300
    assert len({t.id for t in world.tasks}) == len(world.tasks)
    splits = collections.Counter(t.split for t in world.tasks)
    assert splits == {"train": 216, "dev": 72, "test": 72}
    assert collections.Counter(t.family for t in world.tasks) == {f: 60 for f in FAMILIES}
    for s in ("train", "dev", "test"):
        assert {t.family for t in world.split(s)} == set(FAMILIES)
    assert len({t.category for t in world.tasks}) >= 6
    assert {t.difficulty for t in world.tasks} == {"Easy", "Medium", "Hard"}
    with pytest.raises(ValueError, match="unknown split"):
        world.split("validation")


def test_gold_chains_use_ledger_vocabulary_and_point_backwards(world):
    for t in world.tasks:
        assert t.gold_chain, t.id
        for i, g in enumerate(t.gold_chain):
            NeedSpec(g.need, g.preferred_source, g.closure_level, g.need_role, tuple(g.depends_on), g.query_focus)
            assert all(0 <= d < i for d in g.depends_on), (t.id, i)
        if t.family == "unanswerable":
            assert t.answer == "insufficient" and any(g.gold_value is None for g in t.gold_chain)
        else:
            assert all(g.gold_value for g in t.gold_chain), t.id
    roles = {g.need_role for t in world.tasks for g in t.gold_chain}
    assert roles == {"anchor", "external_fact", "applicability", "compute"}


def test_media_mc_has_four_options_and_no_web(world):
    for t in world.tasks:
        if t.family == "media_mc":
            assert len(t.options) == 4 and t.answer in "ABCD"
            assert "web_search" not in t.allowed_tools and "web_search" not in t.to_context().tools()


def test_multi_asset_tasks_have_two_assets(world):
    kinds = collections.Counter()
    for t in world.tasks:
        if t.family == "multi_asset":
            assert len(t.assets) == 2
            kinds[tuple(sorted(a.type for a in t.assets))] += 1
    assert set(kinds) == {("video", "video"), ("audio", "image")}


def test_each_needed_web_fact_has_at_least_five_distractors(world):
    for t in world.tasks:
        if t.family != "anchor_web":
            continue
        name, gold = t.meta["entity"], t.gold_chain[1].gold_value
        profile = [d for d in world.corpus if d["title"] == f"About {name}"]
        assert len(profile) == 1 and value_in_text(gold, profile[0]["text"]), t.id
        same_entity = [d for d in world.corpus if name in d["text"] and d is not profile[0]]
        similar = [
            d
            for d in world.corpus
            if d["title"].endswith(" directory entry")
            and d["title"].removesuffix(" directory entry") != name
            and difflib.SequenceMatcher(None, d["title"].removesuffix(" directory entry"), name).ratio() > 0.8
        ]
        outdated = [d for d in same_entity if d["title"].startswith("Archived")]
        assert outdated and not value_in_text(gold, outdated[0]["text"]), t.id
        assert len(similar) >= 2 and len(same_entity) + len(similar) >= 5, (t.id, len(same_entity), len(similar))


def test_entity_names_are_unique_per_task(world):
    names = [t.meta["entity"] for t in world.tasks]
    assert len(set(names)) == len(names)


def test_texts_cover_questions_docs_and_tracks(world):
    texts = list(world.texts())
    assert world.tasks[0].question in texts
    assert any(world.corpus[5]["text"] in x for x in texts)
    sub = world.tasks[0].assets[0].tracks.subtitles[0].text
    assert sub in texts
    assert sum(len(x.split()) for x in texts) > 50_000


def test_load_world_cache_roundtrip(tmp_path):
    t0 = time.perf_counter()
    w1 = load_world(3, cache_dir=tmp_path)
    assert time.perf_counter() - t0 < 10
    assert list(tmp_path.glob("world_v*_seed3_*.json"))
    w2 = load_world(3, cache_dir=tmp_path)
    assert w2.to_json() == w1.to_json() == build_world(3).to_json()
