"""sft.augment: renamed copies of harvested teacher rows keep the decision and change every invented name."""

import json
import random

import pytest

from collect import teacher_runs
from collect.harvest import harvest
from collect.world import build_world
from sft.augment import NAME_WORD, name_words, rename_row, renamed_copies
from sft.train import SFTScriptArguments, load_sft_dataset


@pytest.fixture(scope="module")
def data(tmp_path_factory, recorded_correct_runs):
    d = tmp_path_factory.mktemp("augment")
    teacher_runs.write_trajectories(d / "traj.jsonl", recorded_correct_runs[:8])
    harvest(d / "traj.jsonl", d / "data", eval_share=0.0)
    return d / "data" / "sft"


def _calls(row):
    return [c["function"] for m in row["completion"] for c in m.get("tool_calls") or []]


def test_every_entity_name_of_the_world_is_an_invented_word_and_no_template_word_is():
    world = build_world(0)
    for t in world.tasks[:60]:
        word = t.meta["entity"].removeprefix("The ").split(" ")[0]
        assert NAME_WORD.fullmatch(word), t.meta["entity"]
    prompt = json.dumps(teacher_runs.trajectories(2, "train")[0]["steps"][0]["planner_input"])
    entity_words = {t.meta["entity"].removeprefix("The ").split(" ")[0] for t in world.tasks}
    assert set(name_words(prompt)) <= entity_words | {w for d in world.corpus for w in name_words(d["text"])}


def test_a_renamed_row_keeps_the_call_and_renames_the_copied_name_consistently(data):
    ds = load_sft_dataset(SFTScriptArguments(dataset_dir=str(data), kinds="decision"))["train"]
    rows = [r for r in ds if name_words(json.dumps(r))]
    # the teacher's web searches copy an upstream name from the prompt: the cases the augmentation is for
    searches = [r for r in rows if any(c["name"] == "web_search" for c in _calls(r))]
    assert searches
    rng = random.Random(0)
    for row in searches:
        new = rename_row(row, rng)
        old_words, new_words = name_words(json.dumps(row)), name_words(json.dumps(new))
        assert len(new_words) == len(old_words) and not set(new_words) & set(old_words)
        mapping = dict(zip(old_words, new_words, strict=True))
        (call,), (new_call,) = _calls(row), _calls(new)
        assert new_call["name"] == call["name"] and new_call["arguments"].keys() == call["arguments"].keys()
        q = call["arguments"]["query"]
        (w,) = [w for w in name_words(q)]  # the query names the entity, found in the prompt
        assert w in json.dumps(row["prompt"])
        assert new_call["arguments"]["query"] == q.replace(w, mapping[w])
        assert mapping[w] in json.dumps(new["prompt"]) and w not in json.dumps(new)
        # everything but the names is unchanged
        strip = NAME_WORD.sub("NAME", json.dumps(row))
        assert NAME_WORD.sub("NAME", json.dumps(new)) == strip


def test_load_sft_dataset_adds_seeded_renamed_copies_of_train_rows_only(data):
    args = SFTScriptArguments(dataset_dir=str(data), kinds="decision")
    plain = load_sft_dataset(args)["train"]
    with_names = sum(bool(name_words(json.dumps(r))) for r in plain)
    aug = load_sft_dataset(SFTScriptArguments(dataset_dir=str(data), kinds="decision", rename_copies=2), seed=3)
    assert len(aug["train"]) == len(plain) + 2 * with_names
    assert aug["train"].select(range(len(plain))).to_list() == plain.to_list()  # originals first, unchanged
    again = load_sft_dataset(SFTScriptArguments(dataset_dir=str(data), kinds="decision", rename_copies=2), seed=3)
    assert again["train"].to_list() == aug["train"].to_list()
    other = load_sft_dataset(SFTScriptArguments(dataset_dir=str(data), kinds="decision", rename_copies=2), seed=4)
    assert other["train"].to_list() != aug["train"].to_list()
    with pytest.raises(ValueError, match=">= 0"):
        renamed_copies(plain.to_list(), -1, 0)
