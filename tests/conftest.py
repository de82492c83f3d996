"""Session-wide fixtures: recorded teacher runs of the real runtime and the tiny model, each built once per session.

Nothing here is a test module's helper copied around: every test that needs planner states, trajectories or a tiny
checkpoint takes them from these fixtures (tests/fakes.py holds the scripted fake OpenAI-compatible server)."""

import os
import time

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    """A `gpu` test selected explicitly on a machine without CUDA is skipped, never silently passed."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover
        has_cuda = False
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs CUDA"))
        if "vllm" in item.keywords:
            try:
                import vllm  # noqa: F401
            except ImportError:
                item.add_marker(pytest.mark.skip(reason="needs vllm (GPU extra)"))


# ---- recorded teacher scenarios (collect.teacher_runs: the real collect engine, loop, teacher, tools, judge) -----

N_RECORDED = 24  # the first 24 train tasks: four of each of the six families


@pytest.fixture(scope="session")
def recorded_runs():
    """Judged trajectories of the first 24 train tasks; every 4th is the one-step-budget run, judged incorrect unless
    the task is unanswerable. Shared: copy before mutating."""
    from collect import teacher_runs

    return teacher_runs.trajectories(N_RECORDED, "train", wrong_share=0.25)


@pytest.fixture(scope="session")
def recorded_correct_runs():
    """The full-budget teacher trajectories of the same 24 tasks (all judged correct). Shared: copy before mutating."""
    from collect import teacher_runs

    return teacher_runs.trajectories(N_RECORDED, "train")


@pytest.fixture(scope="session")
def recorded_states(recorded_correct_runs):
    """rl_states rows (collect.harvest's format) of every decision step of recorded_correct_runs."""
    from collect import teacher_runs

    return teacher_runs.rl_rows(recorded_correct_runs)


# ---- scripted fake-server runs ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def closure_run():
    """The canonical scripted closure run of the real loop against the fake server (tests/helpers/loop_script.py),
    run once: test_loop checks its outcome, observation display and replay; test_trajectory writes and replays it.
    Shared: copy before mutating."""
    from tests.helpers.loop_script import closure_record

    return closure_record()


@pytest.fixture(scope="session")
def finish_planner_server():
    """A fake OpenAI-compatible endpoint whose planner always finishes with "unknown" (other roles: offline teacher),
    started once for the collect-engine tests that need nothing else from the endpoint."""
    from tests.fakes import FakeChatServer, tool_call

    with FakeChatServer() as srv:
        srv.default("planner", tool_call("finish", {"answer": "unknown"}))
        yield srv


# ---- the tiny model ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model_build(tmp_path_factory, recorded_correct_runs):
    """(path, build seconds) of sft.tiny.build_tiny_model with its default tokenizer text, built once per session.
    Its tokenizer text includes the 24 recorded teacher runs, recorded (and cached) before the clock starts.
    Read-only: a test that trains it copies it first."""
    from sft.tiny import build_tiny_model

    t0 = time.time()
    path = build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", seed=0)
    return path, time.time() - t0


@pytest.fixture(scope="session")
def tiny_model(tiny_model_build):
    return tiny_model_build[0]


@pytest.fixture(scope="session")
def finish_policy(tmp_path_factory, recorded_correct_runs):
    """The GRPO tests' start policy (tests/helpers/warm_start.py finish_policy), built once. Read-only."""
    from tests.helpers.warm_start import finish_policy

    return finish_policy(tmp_path_factory.mktemp("finish-policy"), recorded_correct_runs)
