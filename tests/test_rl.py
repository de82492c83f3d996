"""rl.train / rl.score: recipes, prompt rendering with each row's tools, and a GRPO smoke run on the tiny model
(every reward component logged, the policy moves, the KL reference is and stays the SFT checkpoint)."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
import torch
import yaml
from trl import GRPOConfig, ModelConfig

from collect import teacher_runs
from collect.harvest import harvest
from rl.train import load_config, named_weights, parse_args, render_prompts
from tests.helpers.warm_start import SHORT_FAMILIES

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_recipes_load_and_carry_the_paper_objective():
    # GPU recipe on a CPU machine: GRPOConfig rejects bf16 without CUDA, so only that key is overridden here
    big_yaml = yaml.safe_load((ROOT / "configs/rl/qwen3_5_27b.yaml").read_text())
    assert big_yaml["bf16"] is True
    script, big, model = load_config(str(ROOT / "configs/rl/qwen3_5_27b.yaml"), {"bf16": False})
    assert isinstance(big, GRPOConfig) and isinstance(model, ModelConfig)
    assert (big.num_generations, big.learning_rate, big.num_train_epochs) == (8, 5e-6, 5)
    assert (big.beta, big.epsilon, big.loss_type, big.lr_scheduler_type) == (0.01, 0.2, "grpo", "cosine")
    # the recipe's mapping, in REWARD_FUNCS order for TRL; the execution check (not the paper's) is off
    assert big.reward_weights == [0.1, 0.1, 0.2, 0.6, 0.0]
    assert named_weights(big.reward_weights) == {"valid": 0.1, "gate": 0.1, "target": 0.2, "align": 0.6, "compute": 0}
    assert (
        big.use_vllm
        and big.vllm_mode == "server"
        and (big.vllm_server_host, big.vllm_server_port)
        == (
            "0.0.0.0",
            8000,
        )
    )
    assert big.chat_template_kwargs == {"enable_thinking": False} and big.gradient_checkpointing
    assert script.judge["kind"] == "openai" and script.judge["max_concurrency"] == 64
    assert model.dtype == "bfloat16" and not model.use_peft
    _, tiny, tiny_model = load_config(str(ROOT / "configs/rl/tiny.yaml"), {"max_steps": 2})
    assert tiny.use_cpu and not tiny.bf16 and tiny.beta == 0.01 and tiny.loss_type == "grpo" and tiny.max_steps == 2
    assert tiny_model.dtype == "float32" and not tiny.gradient_checkpointing


def test_every_trl_option_is_a_recipe_key_and_a_command_line_override(tmp_path):
    """The Makefile's arguments plus any GRPOConfig / ModelConfig field override the recipe."""
    script, training, model = parse_args(
        [
            "--config",
            str(ROOT / "configs/rl/tiny.yaml"),
            "--dataset_dir",
            "D",
            "--model_name_or_path",
            "M",
            "--output_dir",
            str(tmp_path / "o"),
            "--learning_rate",
            "1e-5",
            "--num_iterations",  # a GRPOConfig field no recipe sets
            "2",
            "--reward_weights",
            "0.25",
            "0.25",
            "0.25",
            "0.25",
            "--judge",
            '{"kind": "offline", "cache_path": "c.jsonl"}',
            "--lora_r",
            "4",
        ]
    )
    assert (script.dataset_dir, model.model_name_or_path, training.output_dir) == ("D", "M", str(tmp_path / "o"))
    assert training.learning_rate == 1e-5 and training.num_iterations == 2 and model.lora_r == 4
    assert training.reward_weights == [0.25] * 4 + [0.0] and script.judge == {
        "kind": "offline",
        "cache_path": "c.jsonl",
    }
    assert training.num_generations == 4  # untouched recipe values stay
    # a mapping by reward name on the command line (a recipe's YAML form; what pipeline.onpolicy's rl_args pass)
    from pipeline.onpolicy import _flags

    for flags in (["--reward_weights", '{"align": 0.3, "compute": 0.3}'], _flags({"reward_weights": [1, 0, 0, 0, 2]})):
        _, training, _ = parse_args(["--config", str(ROOT / "configs/rl/tiny.yaml"), *flags])
        assert training.reward_weights in ([0.1, 0.1, 0.2, 0.3, 0.3], [1.0, 0.0, 0.0, 0.0, 2.0])
    with pytest.raises(ValueError, match="unknown reward weight"):
        parse_args(["--config", str(ROOT / "configs/rl/tiny.yaml"), "--reward_weights", '{"exec": 1}'])
    p = tmp_path / "r.yaml"
    p.write_text("num_iterations: 3\nmax_train_samples: 5\nuse_peft: true\nlora_target_modules: [q_proj, v_proj]\n")
    script, training, model = parse_args(["--config", str(p), "--output_dir", str(tmp_path / "o")])
    assert training.num_iterations == 3 and script.max_train_samples == 5
    assert model.use_peft and model.lora_target_modules == ["q_proj", "v_proj"]


def test_config_rejects_unknown_keys_naming_the_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model_name_or_path: m\ndataset_dir: d\nlearning_rat: 1\n")
    with pytest.raises(ValueError, match=r"bad\.yaml.*learning_rat"):
        load_config(str(p), {})
    p.write_text("reward_weights: {valid: 1.0, gait: 0.0}\n")
    with pytest.raises(ValueError, match="gait"):
        load_config(str(p), {})


@pytest.mark.parametrize("path", sorted((ROOT / "configs/rl").glob("*.yaml")), ids=lambda p: p.name)
def test_each_recipes_report_to_integration_is_installed_by_an_extra(path):
    """A GPU recipe must start after `make setup EXTRAS=test,gpu`: its report_to backend is in an extra."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    installed = {re.split(r"[<>=!~\[ ]", d)[0].lower() for deps in extras.values() for d in deps}
    report_to = yaml.safe_load(path.read_text()).get("report_to", "none")
    for backend in [report_to] if isinstance(report_to, str) else report_to:
        assert backend in ("none", "all") or backend in installed, f"{path.name}: report_to {backend} not in an extra"
    assert "all" != report_to  # "all" would pick up whatever happens to be installed


@pytest.fixture(scope="module")
def short_runs(recorded_correct_runs):
    runs = [r for r in recorded_correct_runs if r["task_meta"]["family"] in SHORT_FAMILIES]
    assert len(runs) >= 4
    return runs


def test_prompts_are_prerendered_with_each_rows_own_tools(tiny_model, short_runs):
    from datasets import Dataset
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    rows = teacher_runs.rl_rows(short_runs)
    video = next(r for r in rows if '"clip_grounding"' in r["tools"])  # a video asset: every perception tool
    other = next(r for r in rows if '"clip_grounding"' not in r["tools"])  # image + audio: no clip grounding
    ds = render_prompts(Dataset.from_list([video, other]), tok, {})
    p_video, p_other = ds["prompt"]
    assert isinstance(p_video, str) and p_video.endswith("<|im_start|>assistant\n")
    assert '"clip_grounding"' in p_video and '"clip_grounding"' not in p_other
    assert '"audio_scout"' in p_other and video["question"] in p_video and other["question"] in p_other


def test_kl_reference_has_the_policys_class_even_when_config_architectures_names_another(
    tiny_model, rl_data, tmp_path
):
    """TRL builds the reference from config.architectures[0]; a vision-language checkpoint (Qwen3.5's SFT OUT/merged)
    names its ConditionalGeneration class there while the policy is loaded as a CausalLM; the reference must be that
    CausalLM, with the SFT weights."""
    from rl.train import build_trainer

    ckpt = tmp_path / "multimodal_named"
    shutil.copytree(tiny_model, ckpt)
    conf = json.loads((ckpt / "config.json").read_text())
    conf["architectures"] = ["Qwen3ForTokenClassification"]  # another head on the same backbone
    (ckpt / "config.json").write_text(json.dumps(conf))
    overrides = {"dataset_dir": str(rl_data / "rl_states"), "output_dir": str(tmp_path / "out"), "max_steps": 1}
    trainer, *_ = build_trainer(
        load_config(str(ROOT / "configs/rl/tiny.yaml"), {"model_name_or_path": str(ckpt), **overrides})
    )
    assert type(trainer.model).__name__ == "Qwen3ForCausalLM"
    assert type(trainer.ref_model) is type(trainer.model)
    ref, pol = trainer.ref_model.state_dict(), trainer.model.state_dict()
    assert ref.keys() == pol.keys() and all(torch.equal(ref[k], pol[k]) for k in pol)  # the same SFT weights


def test_trl_hooks_this_project_relies_on_are_there():
    """The three places this project reaches into TRL 1.16 beyond its public API (rl/train.py
    StateRecordingGRPOTrainer and reference_built_like, sft/lm_head.py): if TRL changes them, this fails before a run
    silently loses its scored-states log, builds its KL reference in another class, or loses its CPU speed-up."""
    import inspect

    from trl import GRPOTrainer
    from trl.trainer import utils as trl_utils

    init = inspect.getsource(GRPOTrainer.__init__)  # the reference is built here (rl.train.reference_built_like)
    assert "create_model_from_path(get_config_model_id(self.model.config), **model_init_kwargs)" in init
    assert "architecture" in inspect.signature(trl_utils.create_model_from_path).parameters
    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert list(inspect.signature(GRPOTrainer._generate_and_score_completions).parameters) == ["self", "inputs"]
    assert '"advantages": advantages' in src  # the returned dict holds this process's advantages
    assert "self._calculate_rewards(inputs, prompts, completions, completion_ids_list)" in src  # our reward funcs run
    assert callable(getattr(trl_utils, "_use_triton", None))  # the fused LM head's compact/full switch
    assert "_use_triton(" in inspect.getsource(trl_utils)


# ---- GRPO smoke run ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rl_data(short_runs, tmp_path_factory) -> Path:
    """The rl_states DatasetDict harvested (collect.harvest) from the short recorded runs."""
    d = tmp_path_factory.mktemp("rl")
    teacher_runs.write_trajectories(d / "trajectories.jsonl", short_runs)
    stats = harvest(d / "trajectories.jsonl", d, eval_share=0.34)
    assert stats["rl_states"]["train"] and stats["rl_states"]["eval"] >= 4
    return d


@pytest.fixture(scope="module")
def sft_policy(finish_policy, rl_data):
    """The warm-started policy (tests/helpers/warm_start.py finish_policy), the harvested rl_states and the work dir.
    GRPO runs on every harvested state; the group variance comes from valid vs. invalid samples."""
    return finish_policy, rl_data / "rl_states", rl_data


def _state_dict(path: Path) -> dict:
    from transformers import AutoModelForCausalLM

    return {
        k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict().items()
    }


@pytest.mark.slow
def test_grpo_smoke_logs_every_component_moves_the_policy_and_keeps_the_sft_reference(sft_policy, capsys):
    from rl.train import train

    sft, data, d = sft_policy
    recipe = load_config(
        str(ROOT / "configs/rl/tiny.yaml"),
        {
            "model_name_or_path": str(sft),
            "dataset_dir": str(data),
            "output_dir": str(d / "out"),
            "max_steps": 4,
            "max_completion_length": 48,
        },
    )
    t0 = time.time()
    trainer, summary = train(recipe)
    wall = time.time() - t0

    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logged) == 4
    for h in logged:  # each component separately, not only their sum
        for k in ("valid", "gate", "target", "align"):
            assert f"rewards/{k}/mean" in h
    assert min(h["frac_reward_zero_std"] for h in logged) < 1.0  # some group had signal

    # trainable parameters changed
    before, after = _state_dict(sft), _state_dict(d / "out")
    assert any(not torch.equal(before[k], after[k]) for k in before)

    # the KL reference is the SFT checkpoint, a separate frozen module, unchanged by training
    assert trainer.beta == 0.01 and trainer.ref_model is not None and trainer.ref_model is not trainer.model
    ref = trainer.ref_model.state_dict()
    assert Path(trainer.ref_model.config._name_or_path).resolve() == sft.resolve()
    assert all(torch.equal(ref[k], before[k]) for k in before)

    s = json.loads((d / "out" / "rl_summary.json").read_text())
    assert s["steps"] == 4 and set(k for k in s["metrics"] if k.startswith("rewards/")) == {
        f"rewards/{k}/mean" for k in ("valid", "gate", "target", "align")
    }
    # every logged step is kept (the trend, not one noisy first/last step), matching the trainer's log
    assert [h["step"] for h in s["history"]] == [h["step"] for h in logged]
    assert [h["reward"] for h in s["history"]] == [h["reward"] for h in logged]
    assert s["metrics"]["reward"]["last_quarter_mean"] == logged[-1]["reward"]  # 4 steps: a quarter is one step
    assert (d / "out" / "tokenizer_config.json").exists()

    # every group GRPO drew is logged with its state, G weighted rewards and the advantages the loss used
    scored = [json.loads(x) for x in (d / "out" / "scored_states.jsonl").read_text().splitlines()]
    g = trainer.num_generations
    assert len(scored) == 4 * trainer.args.per_device_train_batch_size // g
    pool = {(r["task_id"], r["step"], r["origin"], r["round"]) for r in trainer.train_dataset}
    assert all((x["task_id"], x["step"], x["origin"], x["round"]) in pool for x in scored)
    for h in logged:  # the step's logged mean reward is the mean over the groups recorded at that step
        rewards = [r for x in scored if x["global_step"] == h["step"] - 1 for r in x["rewards"]]
        assert len(rewards) == trainer.args.per_device_train_batch_size
        assert sum(rewards) / len(rewards) == pytest.approx(h["reward"], abs=1e-4)
    for x in scored:  # group-centred and std-scaled (TRL: unbiased std + 1e-4)
        r, a = torch.tensor(x["rewards"]), torch.tensor(x["advantages"])
        assert a.tolist() == pytest.approx(((r - r.mean()) / (r.std() + 1e-4)).tolist(), abs=1e-4)
    assert any(len(set(x["rewards"])) > 1 for x in scored)
    with capsys.disabled():
        print(
            f"\n[grpo smoke] {s['steps']} steps, {s['s_per_step']} s/step (wall incl. init {wall:.1f}s), "
            f"reward means { {k: round(v['mean'], 3) for k, v in s['metrics'].items() if 'reward' in k} }"
        )


@pytest.mark.slow
def test_score_reports_total_and_every_component_on_held_out_states(sft_policy):
    from rl.score import score

    sft, data, _ = sft_policy
    res = score(str(data), str(sft), split="eval", n=4, max_new_tokens=40)
    assert res["n"] == 4
    for k in ("total", "valid", "gate", "target", "align"):
        assert res[k] is not None and 0.0 <= res[k] <= 1.0
    expected = 0.1 * res["valid"] + 0.1 * res["gate"] + 0.2 * res["target"] + 0.6 * res["align"]
    assert res["total"] == pytest.approx(expected, abs=1e-6)  # no judge skips with the offline judge


@pytest.mark.slow
def test_score_splits_the_states_a_grpo_run_scored_from_the_others(sft_policy, tmp_path):
    """rl.score --scored RL_OUT [--which out]: the greedy reward on the states a GRPO run drew groups for, or on the
    others, read from its scored_states.jsonl (here written by hand for 2 of the eval states)."""
    from datasets import load_from_disk

    from rl.score import main

    sft, data, _ = sft_policy
    ev = load_from_disk(str(data))["eval"]
    picked = [ev[i] for i in (1, 3)]
    lines = [{"global_step": 0} | {k: r[k] for k in ("task_id", "step", "origin", "round")} for r in picked]
    (tmp_path / "scored_states.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    args = ["--dataset_dir", str(data), "--model", str(sft), "--n", "64", "--max_new_tokens", "8"]
    inside = main(args + ["--scored", str(tmp_path)])
    outside = main(args + ["--scored", str(tmp_path), "--which", "out"])
    assert inside["n"] == 2 and outside["n"] == len(ev) - 2 and inside["which"] == "in"
    # --reference_tools: only the states whose teacher decision calls that tool (here the first eval state's)
    tools = [json.loads(r)["name"] for r in ev["reference_action"]]
    only = main(args + ["--reference_tools", tools[0]])
    assert only["n"] == tools.count(tools[0]) < len(ev) and only["reference_tools"] == tools[0]


def test_select_states_keeps_the_states_whose_reference_calls_the_named_tools():
    from datasets import Dataset

    from rl.score import select_states

    names = ["web_search", "code_executor", "finish", "code_executor", "audio_scout", "code_executor"]
    ds = Dataset.from_list(
        [{"reference_action": json.dumps({"name": t, "arguments": {}}), "x": i} for i, t in enumerate(names)]
    )
    assert select_states(ds, 100, reference_tools="code_executor")["x"] == [1, 3, 5]
    assert select_states(ds, 2, reference_tools="code_executor")["x"] == [1, 3]  # n counts the kept states
    assert select_states(ds, 100, reference_tools="finish, audio_scout")["x"] == [2, 4]
    drawn = select_states(ds, 3, reference_tools="code_executor", shuffle=0)["x"]
    assert sorted(drawn) == [1, 3, 5]  # drawn among the kept states only
    with pytest.raises(ValueError, match="no state's reference decision calls them"):
        select_states(ds, 100, reference_tools="clip_grounding")


def test_select_states_keeps_the_scored_states_or_the_others_matched_by_their_keys(tmp_path):
    from datasets import Dataset

    from rl.score import select_states

    rows = [{"task_id": f"t{i // 3}", "step": i % 3 + 1, "origin": "onpolicy", "round": 1, "x": i} for i in range(12)]
    ds = Dataset.from_list(rows)
    log = [
        {"global_step": s, "task_id": r["task_id"], "step": r["step"], "origin": r["origin"], "round": r["round"]}
        for s, r in enumerate(rows[2:12:3])
    ]  # the third state of each task, as rl.train writes them
    (tmp_path / "scored_states.jsonl").write_text("".join(json.dumps(x) + "\n" for x in log))
    assert select_states(ds, 100, str(tmp_path))["x"] == [2, 5, 8, 11]
    assert select_states(ds, 100, str(tmp_path), "out")["x"] == [0, 1, 3, 4, 6, 7, 9, 10]
    assert select_states(ds, 2, str(tmp_path), "out")["x"] == [0, 1]
    drawn = select_states(ds, 5, str(tmp_path), "out", shuffle=0)["x"]
    assert len(set(drawn)) == 5 and set(drawn) <= {0, 1, 3, 4, 6, 7, 9, 10} and drawn != [0, 1, 3, 4, 6]
    assert drawn == select_states(ds, 5, str(tmp_path), "out", shuffle=0)["x"]  # seeded
    # the same task and step from another round is another state
    other = Dataset.from_list([r | {"round": 2} for r in rows])
    with pytest.raises(ValueError, match="no state of this split is among"):
        select_states(other, 100, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="scored_states.jsonl"):
        select_states(ds, 100, str(tmp_path / "missing"))


@pytest.mark.slow
def test_lora_sft_adapter_is_copied_to_a_frozen_ref_adapter_and_only_the_policy_adapter_trains(sft_policy):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl.train import train

    sft, data, d = sft_policy
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(sft, dtype=torch.float32),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"),
    )
    torch.manual_seed(1)
    for n, p in model.named_parameters():
        if "lora_B" in n:  # a non-trivial "trained" SFT adapter (fresh LoRA B is zero = the base model)
            p.data.normal_(0, 0.02)
    adapter = d / "sft_lora"
    model.save_pretrained(adapter)
    AutoTokenizer.from_pretrained(sft).save_pretrained(adapter)
    sft_lora = {n.replace(".default", ""): p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}

    recipe = load_config(
        str(ROOT / "configs/rl/tiny.yaml"),
        {
            "model_name_or_path": str(adapter),
            "dataset_dir": str(data),
            "output_dir": str(d / "out_lora"),
            "max_steps": 2,
            "max_completion_length": 48,
            "learning_rate": 1e-2,
        },
    )
    trainer, summary = train(recipe)
    assert summary["reference_policy"] == "sft_adapter_copied_to_ref_adapter"
    params = dict(trainer.model.named_parameters())
    ref = {n.replace(".ref", ""): p for n, p in params.items() if ".ref." in n}
    pol = {n.replace(".default", ""): p for n, p in params.items() if ".default." in n}
    assert ref and set(ref) == set(sft_lora)
    assert all(torch.equal(ref[k], sft_lora[k]) and not ref[k].requires_grad for k in ref)  # frozen SFT copy
    assert any(not torch.equal(pol[k], sft_lora[k]) for k in pol)  # the policy adapter moved
    saved = json.loads((d / "out_lora" / "adapter_config.json").read_text())
    assert saved["r"] == 4 and not (d / "out_lora" / "ref").exists()


def test_reference_matches_tells_a_copied_query_from_a_right_tool_with_a_made_up_query():
    """The held-out figure that showed the tiny planner's failure: the right tool, but not the teacher's query."""
    from rl.score import reference_matches

    args = {"asset_id": "video_1", "query": "name of the band", "need_index": 0}
    ref = {"name": "subtitle_grounding", "arguments": args}

    def call(args: dict, name: str = "subtitle_grounding") -> str:
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"

    exact = call({"need_index": 0, "query": "name of the band", "asset_id": "video_1"})  # key order does not matter
    other_query = call({"asset_id": "video_1", "query": "name of the museum", "need_index": 0})
    same_query_other_need = call({"asset_id": "video_1", "query": "name of the band", "need_index": 1})
    finish_ref = {"name": "finish", "arguments": {"answer": "Elm"}}
    refs = [json.dumps(r) for r in (ref, ref, ref, ref, finish_ref)]
    finish = call({"answer": "Elm"}, "finish")
    got = reference_matches([exact, other_query, same_query_other_need, "not a call", finish], refs)
    assert got["reference_tool_match"] == pytest.approx(4 / 5)
    assert got["reference_action_match"] == pytest.approx(2 / 5)  # exact, and the finish
    assert got["n_with_query"] == 4  # the finish reference has no query
    assert got["reference_query_match"] == pytest.approx(2 / 4)


def test_reward_sensitivity_ranks_the_recorded_call_above_its_near_misses(rl_data):
    """`rl.score --sensitivity`: with the offline judge, the teacher's own query scores above another state's query
    and above a truncated one, on the harvested states (the reward is not flat in the query); --model is required
    otherwise."""
    from rl.score import main, reward_sensitivity

    res = reward_sensitivity(str(rl_data / "rl_states"), split="train", n=50)
    assert res["n"] >= 2
    ref, other, cut = res["reference"], res["query_of_another_state"], res["query_first_3_words_dropped"]
    assert ref["valid"] == other["valid"] == cut["valid"] == 1.0  # same tool, same schema: only the query differs
    assert ref["total"] > other["total"] and ref["total"] > cut["total"]
    assert ref["align"] > other["align"]
    with pytest.raises(SystemExit):
        main(["--dataset_dir", str(rl_data / "rl_states")])


@pytest.mark.slow
def test_group_reach_counts_the_groups_that_hold_the_teachers_query_and_its_advantage(sft_policy, monkeypatch):
    """`rl.score --samples K`: what a GRPO group sees. Real sampling on the warm-started policy gives k samples per
    state; with the sampler scripted so that one sample per group is the teacher's call and the others another
    state's call, every group holds the teacher's query, it is the best-rewarded sample with a positive advantage,
    and 1 in k samples matches."""
    import rl.score
    from rl.score import group_reach, main

    sft, data, _ = sft_policy
    real = group_reach(str(data), str(sft), k=2, split="eval", n=3, max_new_tokens=40)
    assert real["n"] == 3 and real["k"] == 2 and 0.0 <= real["zero_std_groups"] <= 1.0
    assert 0.0 <= real["sample_total"] <= 1.0 and 0.0 <= real["sample_tool_match"] <= 1.0

    from datasets import load_from_disk

    refs = load_from_disk(str(data))["train"]["reference_action"]
    keep = [i for i, r in enumerate(refs) if "query" in (json.loads(r).get("arguments") or {})][:4]
    assert len(keep) >= 2

    def call(ref: str, query: str) -> str:
        from collect.actions import Action

        a = json.loads(ref)
        return Action(a["name"], {**a["arguments"], "query": query}).to_text()

    queries = [json.loads(refs[i])["arguments"]["query"] for i in keep]
    k = 3

    def scripted(policy, tok, texts, max_new, batch_size, k_, temperature):
        assert k_ == k and temperature == 1.0
        out = []
        for j in range(len(texts)):
            ref = refs[keep[j]]
            wrong = "completely unrelated words " + queries[(j + 1) % len(queries)]
            out += [call(ref, wrong), call(ref, queries[j]), "not a call"]
        return out

    from datasets import DatasetDict

    sub = Path(sft).parent / "reach_states"  # the states with a query only
    DatasetDict({"train": load_from_disk(str(data))["train"].select(keep)}).save_to_disk(str(sub))
    monkeypatch.setattr(rl.score, "_decode", scripted)
    got = group_reach(str(sub), str(sft), k=k, split="train", n=len(keep))
    assert got["n_with_query"] == len(keep)
    assert got["sample_query_match"] == pytest.approx(1 / k)
    assert got["any_query_match"] == 1.0 and got["best_sample_is_teacher_query"] == 1.0
    assert got["teacher_query_advantage"] > 0.5
    assert got["zero_std_groups"] == 0.0
    with pytest.raises(ValueError, match="k >= 2"):
        group_reach(str(sub), str(sft), k=1, split="train")
    res = main(["--dataset_dir", str(sub), "--model", str(sft), "--samples", str(k), "--split", "train"])
    assert res["k"] == k and res["any_query_match"] == 1.0  # the command line reaches the same function


def test_group_spread_shows_std_scaling_gives_near_ties_the_weight_of_real_gaps():
    """Two groups of 4: one whose rewards differ by 0.001 (noise), one by 0.9 (a right and a wrong decision), one tie.
    Divided by the group std (TRL's scale_rewards="group") the noise group carries as much |advantage| as the real
    gap; centred only (scale_rewards="none") it carries ~0.1% of it."""
    from rl.score import group_spread

    noise, gap, tie = [1.0, 1.0, 1.0, 0.999], [1.0, 0.1, 0.1, 0.1], [0.5] * 4
    got = group_spread(noise + gap + tie, k=4)
    assert got["near_tie_groups"] == pytest.approx(1 / 3)
    assert got["median_varied_reward_range"] == pytest.approx((0.001 + 0.9) / 2)
    assert 0.4 < got["near_tie_advantage_share"] < 0.5  # the epsilon in std + 1e-4 keeps it just under a half
    assert got["near_tie_centered_share"] == pytest.approx(0.0015 / (0.0015 + 1.35))
    assert group_spread(gap, k=4)["near_tie_advantage_share"] == 0.0
    assert group_spread(tie, k=4)["near_tie_advantage_share"] is None  # no advantage at all
    with pytest.raises(ValueError, match="groups of k"):
        group_spread([1.0, 0.5, 0.2], k=2)


@pytest.mark.slow
def test_grpo_passes_its_columns_to_the_execution_check_and_weighs_it_only_when_the_recipe_does(
    sft_policy, recorded_states, tmp_path
):
    """On the teacher's program states (anchor_compute), TRL's own reward step (GRPOTrainer._calculate_rewards with
    the dataset columns it forwards) runs each candidate program: the reference program earns compute 1, a program
    with another formula 0, and the weighted reward differs by the recipe's compute weight. With the default weight
    (0) the check is not run at all; a one-step GRPO run with it on runs programs and records how many."""
    from datasets import Dataset, DatasetDict

    from collect.actions import Action
    from rl.train import build_trainer, train

    sft, _, d = sft_policy
    rows = [r for r in recorded_states if json.loads(r["reference_action"])["name"] == "code_executor"]
    assert len(rows) >= 2
    pool = tmp_path / "code_states"
    DatasetDict({"train": Dataset.from_list(rows)}).save_to_disk(str(pool))
    ref = json.loads(rows[0]["reference_action"])
    head, last = ref["arguments"]["code"].rstrip("\n").rsplit("\n", 1)
    assert last.startswith("print(") and "-" in last
    other = dict(ref["arguments"], code=head + "\n" + last.replace("-", "+", 1) + "\n")
    completions = [Action("code_executor", ref["arguments"]).to_text(), Action("code_executor", other).to_text()]

    def rewards_of(weights: dict | None):
        overrides = {"model_name_or_path": str(sft), "dataset_dir": str(pool), "output_dir": str(tmp_path / "o")}
        if weights is not None:
            overrides["reward_weights"] = weights
        trainer, *_ = build_trainer(load_config(str(ROOT / "configs/rl/tiny.yaml"), overrides))
        ds = trainer.train_dataset
        inputs = [ds[0], ds[0]]
        per_func = trainer._calculate_rewards(inputs, [ds[0]["prompt"]] * 2, completions, [[1], [1]])
        return trainer, per_func

    weights = {"valid": 0.1, "gate": 0.1, "target": 0.2, "align": 0.6, "compute": 0.5}
    trainer, per_func = rewards_of(weights)
    names = trainer.reward_func_names
    assert names == ["valid", "gate", "target", "align", "compute"]
    assert per_func[:, names.index("compute")].tolist() == [1.0, 0.0]
    assert per_func[0, :4].tolist() == [1.0, 1.0, 1.0, 1.0]  # the reference itself: full marks on the paper's four
    w = trainer.reward_weights
    total = (per_func * w.unsqueeze(0)).nansum(dim=1)
    assert float(total[0] - total[1]) == pytest.approx(
        0.5 + float(((per_func[0, :4] - per_func[1, :4]) * w[:4]).sum()), abs=1e-6
    )
    _, off = rewards_of(None)  # configs/rl/tiny.yaml's own weights: the paper's four, compute 0
    assert torch.isnan(off[:, names.index("compute")]).all()

    _, summary = train(
        load_config(
            str(ROOT / "configs/rl/tiny.yaml"),
            {
                "model_name_or_path": str(sft),
                "dataset_dir": str(pool),
                "output_dir": str(tmp_path / "out"),
                "max_steps": 1,
                "max_completion_length": 32,
                "reward_weights": weights,
            },
        )
    )
    assert summary["reward_weights"]["compute"] == 0.5
    assert summary["compute_check"]["runs"] >= 1  # at least the reference programs of the drawn states
    assert summary["metrics"]["rewards/compute/mean"]["mean"] == 0.0  # 32 sampled tokens never write a program


def test_reference_tools_keeps_the_states_whose_teacher_decision_calls_them(recorded_states):
    from datasets import Dataset

    from rl.train import states_calling

    ds = Dataset.from_list(recorded_states)
    names = [json.loads(r["reference_action"])["name"] for r in recorded_states]
    programs = states_calling(ds, "code_executor")
    assert len(programs) == names.count("code_executor") > 0
    both = states_calling(ds, " code_executor, finish ")
    assert len(both) == names.count("code_executor") + names.count("finish")
    assert {json.loads(r)["name"] for r in both["reference_action"]} == {"code_executor", "finish"}
    with pytest.raises(ValueError, match="no state's reference decision calls them"):
        states_calling(ds, "no_such_tool")
