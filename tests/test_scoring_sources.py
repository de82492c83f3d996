"""Scoring exactly as docs/world.md says, for each task source (issue 52, class 3).

The table in "Scoring modes" is read from the doc and every row is run through the run's own judge call site
(collect.run.judge_answer) on tasks built the way that source builds them, so the doc and the code cannot drift apart.
Also: the OmniGAIA judge never raises (a plain client's own exception is an unjudged task), and a task file's date
answer written another way is right."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from collect.config import CollectConfig, TaskSource
from collect.judges import omnigaia_judge
from collect.run import judge_answer, load_task_list
from collect.tasks import load_tasks

ROOT = Path(__file__).resolve().parents[1]
SPOKEN = ROOT / "tests/data/spoken/tasks.jsonl"


def doc_rows() -> list[dict]:
    """The rows of the source table of docs/world.md ("Scoring modes")."""
    text = (ROOT / "docs/world.md").read_text()
    head = "| tasks | `source` | scorer (trajectory `judge.method`) | mode when unset |"
    assert head in text, "docs/world.md lost its scoring table"
    rows = []
    for line in text[text.index(head) :].splitlines()[2:]:
        if not line.startswith("|"):
            break
        tasks, source, scorer, mode = (c.strip() for c in line.strip("|").split("|"))
        methods = re.findall(r"`([a-z_]+)`", scorer)
        rows.append({"tasks": tasks, "source": source.split()[0], "methods": methods, "mode": mode})
    return rows


def _file(tmp_path: Path, **task) -> list:
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"id": "t1", "question": "q?", **task}) + "\n")
    return load_task_list(CollectConfig(tasks=TaskSource(kind="file", path=str(p)), split="all"))


def _tasks_for(row: dict, tmp_path: Path) -> tuple[list, str]:
    """(tasks as that source builds them, an answer to score)."""
    kind = row["tasks"]
    if kind.startswith("embedded world"):
        return load_task_list(CollectConfig(split="test", limit=1)), "insufficient"
    if kind.startswith("task file (") or kind == "task file":
        cfg = CollectConfig(tasks=TaskSource(kind="file", path=str(SPOKEN)), split="all")
        return [t for t in load_task_list(cfg) if t.id == "sp-15-launch"], "the 3rd of May, 1921"
    if "source: worldsense" in kind:
        opts = ["A. a rope", "B. a cello"]
        return _file(tmp_path, answer="B", answer_type="multiple_choice", options=opts, source="worldsense"), "B"
    if "source: omnigaia" in kind:
        return _file(tmp_path, answer="1962", source="omnigaia"), "<answer>1962</answer>"
    if kind.startswith("OmniGAIA"):
        src = TaskSource(kind="omnigaia", path=str(ROOT / "data/omnigaia/test_metadata.json"))
        return load_task_list(CollectConfig(tasks=src, split="all", limit=1)), "<answer>no idea</answer>"
    if kind.startswith("WorldSense"):
        qa = {"vidX": {"duration": 30, "task0": {"question": "q?", "candidates": ["A. x", "B. y"], "answer": "B"}}}
        (tmp_path / "qa.json").write_text(json.dumps(qa))
        src = TaskSource(kind="worldsense", path=str(tmp_path / "qa.json"))
        return load_task_list(CollectConfig(tasks=src, split="all")), "B"
    raise AssertionError(f"docs/world.md names a source this test does not know: {kind!r}")


def test_the_doc_table_covers_every_source():
    rows = doc_rows()
    assert {r["source"] for r in rows} == {"embedded", "omnigaia", "worldsense"}
    assert any(r["tasks"].startswith("task file (") for r in rows) and len(rows) == 6


@pytest.mark.parametrize("row", doc_rows(), ids=[r["tasks"] for r in doc_rows()])
def test_each_source_is_scored_as_the_doc_says(row, tmp_path):
    tasks, answer = _tasks_for(row, tmp_path)
    assert tasks and all(t.source == row["source"] for t in tasks)
    correct, info = asyncio.run(judge_answer(CollectConfig(), tasks[0], answer, None))
    assert info["mode"] == row["mode"] and info["method"] in row["methods"], (row, info)
    # an explicit scoring mode always wins
    _, forced = asyncio.run(judge_answer(CollectConfig(judge={"scoring": "official"}), tasks[0], answer, None))
    assert forced["mode"] == "official"


def test_a_task_file_date_written_another_way_is_right():
    (task,) = [t for t in load_tasks(SPOKEN) if t.id == "sp-15-launch"]
    assert task.answer == "3 May 1921"
    for answer in ("the 3rd of May, 1921", "May 3rd, 1921", "1921-05-03", "3 May 1921"):
        assert asyncio.run(judge_answer(CollectConfig(), task, answer, None)) == (
            True,
            {"method": "embedded", "mode": "robust"},
        )
    assert asyncio.run(judge_answer(CollectConfig(), task, "4 May 1921", None))[0] is False
    assert asyncio.run(judge_answer(CollectConfig(), task, "1920 or 1921", None))[0] is False


class _PlainClient:
    """Shaped like openai.AsyncOpenAI (client.chat.completions.create) and failing like one: its own exception."""

    def __init__(self, exc: Exception):
        self.calls = 0
        outer = self

        class _Completions:
            async def create(self, **kw):
                outer.calls += 1
                raise exc

        class _Chat:
            completions = _Completions()

        self.chat = _Chat()


@pytest.mark.parametrize(
    "exc", [ConnectionError("connection refused"), TimeoutError(), ValueError("bad json"), KeyError("x")]
)
def test_the_omnigaia_judge_never_raises_on_a_plain_client_error(exc):
    client = _PlainClient(exc)
    res = asyncio.run(omnigaia_judge("q?", "<answer>MCMLXII</answer>", "1962", client=client, model="judge"))
    assert res.correct is None and res.method == "unjudged" and type(exc).__name__ in res.detail
    assert client.calls == 3  # retried like any judge failure, then unjudged
