"""rl.online: online GRPO in the ledger runtime through TRL's rollout_func (docs/training.md, "Online GRPO").

The rows TRL gets (prompt_ids = the state's SFT render under the real chat templates, completion_ids = the generated
ids), a scripted group whose four candidates are each executed and ranked, the TRL facts the design rests on, and a
3-step training smoke from a tiny SFT checkpoint whose output loads like every checkpoint planner."""

from __future__ import annotations

import ast
import inspect
import json
import math
from pathlib import Path

import pytest
import torch

from collect.actions import Action, offered_refs, parse_action
from collect.harvest import decision_rows
from collect.teacher import TeacherPlanner
from pipeline.eval import load_eval_config, run_eval
from pipeline.planners import require_checkpoint, trained_task_ids
from rl.online import (
    ONLINE_REWARDS,
    GenerationQueue,
    OnlineRunError,
    Request,
    Sample,
    TransformersGenerator,
    VLLMToolParser,
    build_trainer,
    check_recipe,
    load_config,
    online_weights,
    parse_args,
    train,
)
from serve.checks import checkpoint_problem

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs/rl/online_tiny.yaml"
TEMPLATES = ROOT / "tests" / "fixtures" / "chat_templates"
TASK = "w0-0000-anchor_web"  # teacher: subtitle_grounding (need 0) -> web_search (need 1) -> finish
G = 4


class Scripted:
    """A generator in place of the policy's: at a group's anchor (n = G) it emits `candidates(context)`; every other
    planner call (the scout, the forks' continuations) gets the offline teacher's decision for that state, so the
    episodes are deterministic. It records every text it emitted."""

    def __init__(self, tok, candidates):
        self.tok, self.candidates, self.emitted = tok, candidates, []

    def ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.convert_tokens_to_ids("<|im_end|>")]

    def __call__(self, requests: list[Request]) -> list[list[Sample]]:
        out = []
        for r in requests:
            c = r.context
            if r.n == G:
                texts = self.candidates(c, self)
            else:
                offered = [t["function"]["name"] for t in c["tools"]]
                texts = [TeacherPlanner().choose(c["r0"], c["ledger"], offered, offered_refs(c["messages"])).to_text()]
            self.emitted.append((r.n, texts))
            out.append([Sample(list(r.prompt_ids), self.ids(t), [-0.5] * len(self.ids(t)), t) for t in texts])
        return out


def four_candidates(c: dict, gen: Scripted) -> list[str]:
    """The teacher's call, a futile repeat of the scout's first call, a finish the gate blocks, an unparseable
    reply."""
    offered = [t["function"]["name"] for t in c["tools"]]
    teacher = TeacherPlanner().choose(c["r0"], c["ledger"], offered, offered_refs(c["messages"])).to_text()
    first = gen.emitted[0][1][0]  # the scout's first decision (already executed once)
    return [teacher, first, Action("finish", {"answer": "Harbour Bridge"}).to_text(), "I would search the web now."]


def _recipe(model, out: Path, **more):
    overrides = {
        "model_name_or_path": str(model),
        "output_dir": str(out),
        "anchor_step": 1,
        "runtime": {"max_steps": 8},
    }
    return load_config(str(RECIPE), overrides | more)


@pytest.fixture(scope="module")
def scripted(tiny_model, tmp_path_factory):
    """(trainer, rollout, generator) for the tiny model with the scripted generator."""
    d = tmp_path_factory.mktemp("online-scripted")
    trainer, rollout, *_ = build_trainer(_recipe(tiny_model, d / "out"), generator=None)
    gen = Scripted(trainer.processing_class, four_candidates)
    rollout.generator = gen
    rollout.keep_episodes = True
    return trainer, rollout, gen


def test_the_recipe_names_its_rewards_and_refuses_evaluation_splits(tmp_path):
    script, training, model = load_config(str(RECIPE), {"output_dir": str(tmp_path)})
    assert training.reward_weights == [0.1, 0.1, 0.2, 0.6, 0.0, 0.5, 1.0]  # ONLINE_REWARDS order for TRL
    assert list(online_weights(training.reward_weights)) == list(ONLINE_REWARDS)
    assert (training.num_generations, training.per_device_train_batch_size, training.beta) == (4, 8, 0.01)
    assert script.split == "train" and script.runtime == {"max_steps": 8} and training.save_strategy == "steps"
    assert online_weights({"outcome": 2})["outcome"] == 2.0 and online_weights({"outcome": 2})["align"] == 0.6
    flags = ["--config", str(RECIPE), "--output_dir", str(tmp_path), "--reward_weights", '{"closed": 1.0}']
    assert parse_args(flags).training.reward_weights[ONLINE_REWARDS.index("closed")] == 1.0
    with pytest.raises(ValueError, match="unknown reward weight.*'finished'"):
        online_weights({"finished": 1.0})
    for split in ("test", "dev", "all"):
        with pytest.raises(OnlineRunError, match="trains only on train tasks"):
            load_config(str(RECIPE), {"output_dir": str(tmp_path), "split": split})


def test_a_group_executes_each_candidate_and_ranks_the_teachers_call_first(scripted):
    """Four known candidates at the anchor after the teacher's first call: each is executed in its own fork (the
    tool-call counter, the events of its step), then the fork plays on to the end; the teacher-like one gets the
    largest advantage, and the rows are exactly TRL's contract."""
    trainer, rollout, gen = scripted
    gen.emitted.clear()
    rollout.episodes.clear()
    n_lines = len(rollout.groups)
    out = rollout([TASK] * G, trainer)

    assert {k: len(v) for k, v in out.items()} == {k: G for k in out}  # exactly len(prompts) rows, every key
    line = rollout.groups[n_lines]
    assert line["task_id"] == TASK and line["anchor"]["k"] == 1 and line["anchor"]["t"] == 1
    cands = line["candidates"]
    # every candidate was executed: two tool calls went to the tool, the finish through the gate, the reply refused
    assert [c["candidate_tool_calls"] for c in cands] == [1, 1, 0, 0]
    assert "observation_committed" in cands[0]["executed"] and "observation_committed" in cands[1]["executed"]
    assert cands[2]["executed"] == ["finish_blocked"] and cands[3]["executed"] == ["model_error"]
    assert line["tool_calls"] == line["scout"]["tool_calls"] + sum(c["tool_calls"] for c in cands)
    assert line["episodes"] == 1 + G and all(c["steps"] >= 2 for c in cands)  # each fork played on after it

    r = line["rewards"]
    assert r["valid"] == [1.0, 1.0, 1.0, 0.0] and r["gate"] == [1.0, 1.0, 0.0, 1.0]
    assert r["closed"][0] > 0 and r["closed"][1:] == [0.0, 0.0, 0.0]  # only the teacher's call filled a need
    assert r["outcome"][0] == 1.0 and line["scout"]["correct"] is True
    adv = line["advantages"]
    assert adv[0] == max(adv) and all(adv[0] > a for a in adv[1:])
    # the advantages are TRL's formula on the weighted totals (group mean, unbiased std + 1e-4)
    t = torch.tensor(line["total"])
    assert adv == pytest.approx(((t - t.mean()) / (t.std() + 1e-4)).tolist(), abs=1e-5)
    w = online_weights(trainer.args.reward_weights)
    assert line["total"][0] == pytest.approx(sum(w[k] * r[k][0] for k in r))
    # the reward columns TRL hands to the reward functions are these values, row by row
    for k in r:
        assert out[f"reward_{k}"] == r[k]
    assert out["reward_compute"] == [None] * G  # unweighted: not computed (TRL logs it as NaN)


@pytest.mark.parametrize("template", [None, *sorted(p.name for p in TEMPLATES.glob("*.jinja"))])
def test_rows_are_the_anchor_states_sft_render_and_the_generated_ids(scripted, template):
    """prompt_ids of every row = the ids state-SFT renders for the anchor state (harvest's row of the scout's step
    at the anchor, the chat template with that task's tools), under the tiny template and each real one;
    completion_ids = the ids the generator produced, untouched. Two tasks: two groups, in prompt order."""
    trainer, rollout, gen = scripted
    tok = trainer.processing_class
    saved = tok.chat_template
    kwargs = {} if template is None else {"enable_thinking": False}
    tasks = [TASK, "w0-0010-media_mc"]
    rollout.chat_template_kwargs = kwargs
    gen.emitted.clear()
    rollout.episodes.clear()
    try:
        if template is not None:
            tok.chat_template = (TEMPLATES / template).read_text()
        out = rollout([tasks[0]] * G + [tasks[1]] * G, trainer)
        # what state-SFT renders for the same states: harvest's row of the scout's step at the anchor
        want = []
        for ep in rollout.episodes:
            st = ep["scout"]["steps"][ep["k"]]
            sft, _ = decision_rows(ep["scout"], st, Action(**st["action"]))
            text = tok.apply_chat_template(
                sft["prompt"], tools=json.loads(sft["tools"]), add_generation_prompt=True, tokenize=False, **kwargs
            )
            want.append(tok(text, add_special_tokens=False)["input_ids"])
    finally:
        tok.chat_template = saved
        rollout.chat_template_kwargs = {}
    assert len(out["prompt_ids"]) == len(out["completion_ids"]) == len(out["logprobs"]) == 2 * G
    assert [ep["task_id"] for ep in rollout.episodes] == tasks
    anchors = [texts for n, texts in gen.emitted if n == G]
    for gi in range(2):
        rows = range(gi * G, (gi + 1) * G)
        assert all(out["prompt_ids"][i] == want[gi] for i in rows), (template, gi)
        assert [out["completion_ids"][i] for i in rows] == [gen.ids(x) for x in anchors[gi]]
        assert all(out["logprobs"][i] == [-0.5] * len(out["completion_ids"][i]) for i in rows)


def test_the_policys_log_probs_are_trls_own_at_step_zero(tiny_model, tmp_path):
    """The CPU generator samples with TRL's generation config and records the log-probs it sampled from: TRL's own
    per-token log-probs of the same ids under the same weights agree (importance ratio 1 at step 0), and the ids
    stop at the first end of turn."""
    trainer, rollout, *_ = build_trainer(_recipe(tiny_model, tmp_path / "out", max_completion_length=24))
    tok = trainer.processing_class
    prompt = tok("<|im_start|>user\nWhat is the height of the bridge?<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    torch.manual_seed(0)
    [samples] = TransformersGenerator(trainer)([Request(prompt, 3)])
    assert len(samples) == 3 and all(s.prompt_ids == prompt for s in samples)
    eos = set(trainer.eos_token_ids)
    for s in samples:
        assert 1 <= len(s.completion_ids) <= 24 and not eos & set(s.completion_ids[:-1])
        ids = torch.tensor([prompt + s.completion_ids])
        mask = torch.ones_like(ids)
        with torch.no_grad():
            trl_logps, _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, ids, mask, len(s.completion_ids)
            )
        assert s.logprobs == pytest.approx(trl_logps[0].tolist(), abs=1e-4)
        assert s.text == tok.decode(s.completion_ids, skip_special_tokens=True)


def test_concurrent_planner_calls_are_served_by_one_generation():
    import asyncio

    calls = []

    def generate(requests):
        calls.append([r.n for r in requests])
        return [[Sample(r.prompt_ids, [1], [0.0], "x")] * r.n for r in requests]

    async def go():
        q = GenerationQueue(generate)
        res = await asyncio.gather(*(q.sample(Request([i], n)) for i, n in ((1, 1), (2, 4), (3, 1))))
        return [len(x) for x in res], q.stats

    sizes, stats = asyncio.run(go())
    assert sizes == [1, 4, 1] and calls == [[1, 4, 1]] and stats["generate_calls"] == 1 and stats["samples"] == 6


def test_this_path_overrides_nothing_of_trl_and_trls_hook_is_as_the_design_assumes(scripted):
    """No subclass of TRL's trainer, no replaced method on the instance, no assignment into TRL's modules; and the
    facts read from TRL 1.16's grpo_trainer.py that rl/online.py depends on still hold."""
    from trl import GRPOTrainer

    trainer, rollout, _ = scripted
    assert type(trainer) is GRPOTrainer and trainer.rollout_func is rollout
    shadowed = [k for k in vars(trainer) if callable(getattr(GRPOTrainer, k, None)) and not k.startswith("__")]
    assert shadowed == [], shadowed
    tree = ast.parse((ROOT / "rl/online.py").read_text())
    bases = [ast.unparse(b) for n in ast.walk(tree) if isinstance(n, ast.ClassDef) for b in n.bases]
    assert not any("Trainer" in b for b in bases), bases
    targets = [
        ast.unparse(t)
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign | ast.AugAssign | ast.AnnAssign)
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
    ]
    assert not [t for t in targets if t.startswith(("trainer.", "t.", "trl", "GRPOTrainer"))], targets
    assert "lm_head" not in (ROOT / "rl/online.py").read_text()  # sft.lm_head patches a TRL function: not here

    gen = inspect.getsource(GRPOTrainer._generate)
    assert "output = self.rollout_func(prompts, self)" in gen  # called with this process's prompts and the trainer
    assert 'required_keys = {"prompt_ids", "completion_ids", "logprobs"}' in gen
    assert "extra_fields = {k: v for k, v in output.items() if k not in required_keys}" in gen
    score = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "inp[key] = values[i]" in score  # extra fields reach each row, then the reward functions
    rewards = inspect.getsource(GRPOTrainer._calculate_rewards)
    assert 'keys = [key for key in inputs[0] if key not in ["prompt", "completion", "completion_ids"]]' in rewards
    sampler = inspect.getsource(GRPOTrainer._get_train_sampler)
    assert "mini_repeat_count=self.num_generations" in sampler  # G consecutive copies of each prompt
    assert "advantages = advantages / (std_rewards + 1e-4)" in score  # rl.online.group_advantages's formula


# ---- training smoke ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smoke(finish_policy, tmp_path_factory):
    """3 steps of rl.online from the tiny SFT checkpoint: G=4, 2 groups per step, short replies and episodes. The
    finish-only start policy's samples are finishes the gate blocks (valid 1, gate 0) or invalid replies (valid 0,
    gate 1), equal under the paper's valid/gate weights; valid weighs 1 here so the groups carry signal."""
    out = tmp_path_factory.mktemp("online-smoke") / "out"
    recipe = load_config(
        str(RECIPE),
        {
            "model_name_or_path": str(finish_policy),
            "output_dir": str(out),
            "max_steps": 3,
            "save_steps": 3,
            "max_completion_length": 32,
            "runtime": {"max_steps": 4},
            "reward_weights": {"valid": 1.0},
        },
    )
    trainer, summary = train(recipe)
    return trainer, summary, out, recipe


@pytest.mark.slow
def test_three_online_steps_train_log_kl_and_write_the_summary(smoke, capsys):
    trainer, summary, out, _ = smoke
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert trainer.state.global_step == 3 and len(logged) == 3
    for h in logged:
        assert "kl" in h and math.isfinite(h["kl"]) and math.isfinite(h["loss"]) and math.isfinite(h["reward"])
        for k in ("valid", "gate", "target", "align", "closed", "outcome"):
            assert math.isfinite(h[f"rewards/{k}/mean"])
    # the policy moved: some group had signal, a gradient flowed, the KL to the SFT reference became positive
    assert min(h["frac_reward_zero_std"] for h in logged) < 1.0 and max(h["grad_norm"] for h in logged) > 0
    assert logged[-1]["kl"] > 0 and logged[0]["kl"] == 0  # identical weights at the first step
    lines = [json.loads(x) for x in (out / "online_groups.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 0, 1, 1, 2, 2] and all(x["episodes"] == 1 + G for x in lines)
    for h in logged:  # TRL's per-component means are the means of the logged group rewards of that step
        step = [x for x in lines if x["step"] == h["step"] - 1]
        for k in ("valid", "gate", "closed", "outcome"):
            vals = [v for x in step for v in x["rewards"][k]]
            assert sum(vals) / len(vals) == pytest.approx(h[f"rewards/{k}/mean"], abs=1e-5)
    last = [a for x in lines if x["step"] == 2 for a in x["advantages"]]
    assert last == pytest.approx(list(trainer._logs["advantages"]), abs=1e-4)  # the advantages TRL used
    s = json.loads((out / "rl_summary.json").read_text())
    assert s["steps"] == 3 and s["online"]["groups"] == 6 and s["online"]["episodes"] == 30
    assert set(s["online"]["component_means"]) >= {"valid", "gate", "target", "align", "closed", "outcome", "total"}
    assert "kl" in s["metrics"] and s["trained_task_ids"] and s["recipe_hash"]
    with capsys.disabled():
        print(
            f"\n[online smoke] {s['steps']} steps, {s['s_per_step']} s/step, {s['online']['episodes']} episodes "
            f"({s['online']['episodes_per_hour']}/h), {s['online']['tool_calls']} tool calls"
        )


@pytest.mark.slow
def test_the_online_checkpoint_resumes_and_loads_like_every_checkpoint_planner(smoke, tmp_path):
    from transformers import AutoModelForCausalLM

    trainer, summary, out, recipe = smoke
    assert checkpoint_problem(out) is None and require_checkpoint({"checkpoint": str(out)}) == str(out)
    AutoModelForCausalLM.from_pretrained(out)
    # the tasks it trained on, followed back through the SFT checkpoint it started from (pipeline.eval's warning)
    assert set(summary["trained_task_ids"]) <= trained_task_ids(out)
    # a rerun finds it finished; a longer one resumes from checkpoint-3 and keeps the earlier group lines
    again, same = train(recipe)
    assert again is None and same["steps"] == 3
    more = load_config(str(RECIPE), {**_smoke_overrides(recipe), "max_steps": 4})
    t4, s4 = train(more)
    assert t4.state.global_step == 4 and s4["resumed_from"].endswith("checkpoint-3")
    lines = [json.loads(x) for x in (out / "online_groups.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(OnlineRunError, match="another recipe"):
        train(load_config(str(RECIPE), {**_smoke_overrides(recipe), "temperature": 0.5}))


def _smoke_overrides(recipe) -> dict:
    s, t, m = recipe
    return {
        "model_name_or_path": m.model_name_or_path,
        "output_dir": t.output_dir,
        "max_steps": t.max_steps,
        "save_steps": t.save_steps,
        "max_completion_length": t.max_completion_length,
        "runtime": s.runtime,
        "reward_weights": dict(zip(ONLINE_REWARDS, t.reward_weights, strict=True)),
    }


@pytest.mark.slow
def test_the_online_checkpoint_is_evaluated_by_pipeline_eval(smoke, tmp_path):
    import yaml

    _, _, out, _ = smoke
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "base": "configs/collect/embedded.yaml",
                "split": "test",
                "limit": 1,
                "planners": {"online": {"checkpoint": str(out)}},
                "planner_endpoint": {"max_tokens": 16, "timeout_s": 60.0, "max_retries": 1},
            }
        )
    )
    s = run_eval(load_eval_config(str(cfg)), tmp_path / "eval")
    cell = s["cells"]["online__ledger__annotations"]
    assert cell["n_tasks"] == 1 and cell["planner_calls"] > 0


def test_the_gpu_recipe_parses_with_vllm_colocate_lora_and_the_qwen3_5_parser(tmp_path):
    script, training, model = load_config(
        str(ROOT / "configs/rl/online_qwen3_5_27b.yaml"), {"bf16": False, "output_dir": str(tmp_path)}
    )
    assert training.use_vllm and training.vllm_mode == "colocate" and training.vllm_importance_sampling_correction
    assert model.use_peft and model.lora_target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert script.tool_call_parser == "qwen3_coder" and training.chat_template_kwargs == {"enable_thinking": False}
    assert training.per_device_train_batch_size % training.num_generations == 0  # whole groups per process
    # 2 processes x 6 rows is 3 whole groups for TRL, but each process's rollout would get 1.5 groups: refused
    recipe = load_config(str(RECIPE), {"output_dir": str(tmp_path)})
    recipe.training.per_device_train_batch_size = 6
    with pytest.raises(OnlineRunError, match="whole groups"):
        check_recipe(recipe)


# ---- GPU node (deselected on CPU; `pytest -m "gpu or vllm" tests/test_rl_online.py` after `make gpu-setup`) -------


@pytest.mark.vllm
def test_vllms_qwen3_coder_parser_turns_a_qwen3_5_call_into_the_runtimes_action(tiny_model):
    """The Qwen3.5 XML call a policy writes reaches the runtime as the same action as its hermes form."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    props = {"query": {"type": "string"}, "need_index": {"type": "integer"}}
    tools = [
        {"type": "function", "function": {"name": "web_search", "parameters": {"type": "object", "properties": props}}}
    ]
    xml = "<tool_call>\n<function=web_search>\n<parameter=query>\nharbour bridge\n</parameter>\n"
    xml += "<parameter=need_index>\n1\n</parameter>\n</function>\n</tool_call>"
    content, calls = VLLMToolParser("qwen3_coder", tok)(xml, tools)
    assert parse_action(content, calls) == Action("web_search", {"query": "harbour bridge", "need_index": 1})


@pytest.mark.gpu
@pytest.mark.vllm
def test_online_grpo_runs_with_vllm_colocated_and_reports_an_importance_ratio_near_one(finish_policy, tmp_path):
    """The GPU path: the same entry point with TRL's colocated vLLM generating by token ids; TRL's importance ratio
    between vLLM's sampling log-probs and the trainer's is ~1 at step 0 (the rows' ids and log-probs are vLLM's)."""
    recipe = load_config(
        str(RECIPE),
        {
            "model_name_or_path": str(finish_policy),
            "output_dir": str(tmp_path / "out"),
            "max_steps": 2,
            "max_completion_length": 32,
            "runtime": {"max_steps": 4},
            "use_cpu": False,
            "bf16": True,
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": 0.2,
            "vllm_max_model_length": 4096,
        },
    )
    trainer, summary = train(recipe)
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logged) == 2 and summary["online"]["generator"] == "vllm"
    ratio = logged[0]["sampling/importance_sampling_ratio/mean"]
    assert 0.9 < ratio < 1.1, ratio
    assert summary["online"]["episodes"] == 20
