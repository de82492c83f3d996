# Omni-Decision pipeline. Every target installs what it needs on first use (.venv + a stamp file).
SHELL := /bin/bash
PY_BOOT ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# CPU default. GPU node: make setup EXTRAS=test,gpu TORCH_CONSTRAINT=   (vLLM brings its own CUDA torch)
EXTRAS ?= test
TORCH_CONSTRAINT ?= -c constraints/cpu.txt
WARM_IMPORTS := collect.__main__ sft.train sft.onpolicy rl.train serve.local serve.eval
export PYTHONPATH := $(CURDIR)
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup test test-fast lint format clean collect merge harvest sft rl heldout serve serve-local eval bench demo \
	gpu-check wheels gpu-setup-offline relabel onpolicy measure

setup: $(STAMP)

$(STAMP): pyproject.toml constraints/cpu.txt
	@command -v $(PY_BOOT) >/dev/null || { echo "error: $(PY_BOOT) not found (Python 3.11 is required)"; exit 1; }
	test -x $(PY) || $(PY_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile $(TORCH_CONSTRAINT) -e ".[$(EXTRAS)]"
	@# pip's byte-compiling of all of site-packages was ~80 s of the 2-core machine's ~110 s install; compile only what
	@# the pipeline imports (~28 s), and do it even where PYTHONDONTWRITEBYTECODE is set (else every process recompiles)
	env -u PYTHONDONTWRITEBYTECODE $(PY) -c "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]" \
		$(WARM_IMPORTS) $(if $(findstring test,$(EXTRAS)),pytest hypothesis)
	@touch $(STAMP)

test: $(STAMP)  ## the CPU suite CI runs (gpu/vllm deselected; includes `slow`)
	$(PY) -m pytest -q

test-fast: $(STAMP)  ## the CPU suite without `slow` tests, for quick local iterations
	$(PY) -m pytest -q -m "not slow and not gpu and not vllm"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# ---- pipeline stages. Defaults chain: collect -> runs/collect, sft -> runs/sft, rl -> runs/rl. ----------------------
# GPU nodes: LAUNCH="accelerate launch --config_file configs/accelerate/zero3.yaml" make sft CONFIG=configs/sft/...
LAUNCH ?= $(PY)
COLLECT_OUT := runs/collect
SFT_OUT := runs/sft
RL_OUT := runs/rl

collect: $(STAMP)  ## CONFIG= OUT= SPLIT= LIMIT= TASKS= WORKERS= (N|auto) SHARD= (K/N)
	$(PY) -m collect --config $(or $(CONFIG),configs/collect/embedded.yaml) --out $(or $(OUT),$(COLLECT_OUT)) \
		$(if $(SPLIT),--split $(SPLIT)) $(if $(LIMIT),--limit $(LIMIT)) $(if $(TASKS),--tasks $(TASKS)) \
		$(if $(WORKERS),--workers $(WORKERS)) $(if $(SHARD),--shard $(SHARD))

merge: $(STAMP)  ## SHARDS="runs/shards/0 runs/shards/1 ..." OUT=: shard OUTs -> one OUT + harvest (docs/scale.md)
	$(PY) -m collect.merge $(or $(SHARDS),$(error set SHARDS="runs/shards/0 runs/shards/1 ...")) \
		--out $(or $(OUT),$(COLLECT_OUT))

harvest: $(STAMP)  ## DATA= (a collect OUT): rebuild the SFT / RL datasets from its trajectories
	$(PY) -m collect.harvest $(or $(DATA),$(COLLECT_OUT))/trajectories.jsonl --out $(or $(DATA),$(COLLECT_OUT))

sft: $(STAMP)  ## CONFIG= DATA= OUT=
	$(LAUNCH) -m sft.train --config $(or $(CONFIG),configs/sft/tiny.yaml) \
		--dataset_dir $(or $(DATA),$(COLLECT_OUT))/sft --output_dir $(or $(OUT),$(SFT_OUT))

rl: $(STAMP)  ## CONFIG= DATA= MODEL= OUT=
	$(LAUNCH) -m rl.train --config $(or $(CONFIG),configs/rl/tiny.yaml) \
		--dataset_dir $(or $(DATA),$(COLLECT_OUT))/rl_states \
		--model_name_or_path $(or $(MODEL),$(SFT_OUT)/merged) --output_dir $(or $(OUT),$(RL_OUT))

heldout: $(STAMP)  ## MODEL=: greedy decisions on every teacher state of the embedded test split (valid, same tool, rewards)
	$(PY) -m collect --config configs/collect/embedded.yaml --out runs/heldout/collect --split test --no-harvest \
		--no-progress
	$(PY) -m collect.harvest runs/heldout/collect/trajectories.jsonl --out runs/heldout/states --eval-share 0.0
	$(PY) -m rl.score --dataset_dir runs/heldout/states/rl_states --split train --n 100000 \
		--model $(or $(MODEL),$(SFT_OUT)/merged) --config configs/rl/tiny.yaml

serve: $(STAMP)  ## CONFIG=configs/serve/<recipe>.yaml (vLLM; GPU nodes with `pip install -e ".[gpu]"`)
	$(PY) -m serve.vllm --config $(CONFIG)

serve-local: $(STAMP)  ## MODEL= PORT=: a transformers checkpoint as an OpenAI-compatible server on CPU
	$(PY) -m serve.local --model $(or $(MODEL),$(RL_OUT)) --port $(or $(PORT),8008)

eval: $(STAMP)  ## CONFIG= PLANNER= OUT= WORKERS= PROCS= (planners at once) | MERGE="OUT_A OUT_B ..." OUT=: pool evals
	$(PY) -m serve.eval --config $(or $(CONFIG),configs/eval/embedded.yaml) $(if $(PLANNER),--planner $(PLANNER)) \
		--out $(or $(OUT),runs/eval) $(if $(WORKERS),--workers $(WORKERS)) $(if $(PROCS),--planner-processes $(PROCS)) \
		$(if $(MERGE),--merge $(MERGE))

bench: $(STAMP)  ## figures -> bench/results.json (see README "Benchmarks")
	$(PY) -m bench

# make demo (goal <= 20 min on 2 cores from a fresh clone; the host varies, README "Two commands": 708 s at fa66ea1 on
# 2026-12-06 19:48 UTC and 735 s at e7be915 at 23:10 UTC on an AVX-512 host; 1,122 s at df39fd9 on 2026-12-04
# 02:54 UTC, another host;
# 1,688 s at 5a18ba3 on 2026-12-05 21:27 UTC and 1,624 s at 82e2302 on 2026-12-06 08:56 UTC on a host whose SFT steps
# are 1.63x slower, over the goal;
# 930 s at 6d92ad1 on 2026-12-03 19:31 UTC; the machine's speed varies by the hour, the slowest hour seen took 1,255 s
# before the relabel's 2 processes, docs/training.md "Fitting the demo"): set-up 40-85 s -> the
# teacher's runs with value and window references (1,080 train tasks, ~30 s) -> state-SFT of the tiny planner (1000
# steps, 7-17 min by host) -> one on-policy round (its own states on 60 train tasks, labelled by the teacher; SFT 150 steps;
# GRPO 10 steps; 2.5-5.5 min) -> the five planners on the first 36 test tasks, two at a time (1.5-3.5 min). The full-size
# measurement is `make measure` below.
demo: $(STAMP)  ## the whole pipeline on the embedded world, CPU only, no key or network
	$(PY) -m collect --config configs/collect/embedded_1800_windows.yaml --out runs/demo/collect --split train --no-progress
	$(PY) -m sft.train --config configs/sft/tiny.yaml --dataset_dir runs/demo/collect/sft --output_dir runs/demo/sft \
		--max_steps 1000 --dataset_num_proc 2
	$(PY) -m sft.onpolicy --config configs/onpolicy/demo.yaml --model runs/demo/sft/merged --out runs/demo/onpolicy
	$(PY) -m serve.eval --config configs/eval/demo.yaml --out runs/demo

# ---- GPU check (docs/gpu_check.md) ------------------------------------------------------------------------------------
# make gpu-check                 SFT + GRPO recipes on a random Qwen3.5 at the 27B layer dims, one GPU, ~5-8 min, no
#                                network -> $(or $(OUT),runs/gpu_check)/gpu_check.json; without CUDA: the CPU mode
# make gpu-check DEVICE=cpu      the same code path at tiny dims (what CI runs, tests/test_gpu_check.py)
# make wheels                    on a NETWORKED x86-64 Linux machine with Python 3.11: every wheel of .[test,gpu] -> wheels/
# make gpu-setup-offline         on the offline GPU node, with wheels/ copied beside the repo: install from it only
WHEELS ?= wheels

gpu-check: $(STAMP)  ## DEVICE=auto|cuda|cpu OUT= GPU_CHECK_ARGS= (e.g. "--vllm colocate --sft-steps 20")
	$(PY) -m bench.gpu_check --device $(or $(DEVICE),auto) --out $(or $(OUT),runs/gpu_check) $(GPU_CHECK_ARGS)

wheels:  ## networked machine: wheels for .[test,gpu] (+ build backend) into $(WHEELS)/ for an offline node
	@command -v $(PY_BOOT) >/dev/null || { echo "error: $(PY_BOOT) not found (the node's Python, 3.11)"; exit 1; }
	$(PY_BOOT) -m pip wheel --wheel-dir $(WHEELS) ".[test,gpu]" "setuptools>=77" wheel
	@echo "optional CUDA build of causal-conv1d (needs nvcc + the CUDA torch installed in $(PY_BOOT)):"
	@echo "  CAUSAL_CONV1D_FORCE_BUILD=TRUE $(PY_BOOT) -m pip wheel --no-deps --no-build-isolation -w $(WHEELS) causal-conv1d==1.7.0"

gpu-setup-offline:  ## offline GPU node: .venv with .[test,gpu] from $(WHEELS)/ only (no index)
	test -x $(PY) || $(PY_BOOT) -m venv $(VENV)
	$(PY) -m pip install --no-index --find-links $(WHEELS) -e ".[test,gpu]"
	@touch $(STAMP)

# ---- on-policy relabelling (docs/training.md "On-policy relabelling") -----------------------------------------------
relabel: $(STAMP)  ## MODEL= OUT= ROUND= SPLIT= LIMIT= DATA=: one round: MODEL's own states labelled by the teacher (no training)
	$(PY) -m collect.relabel --planner $(or $(MODEL),$(SFT_OUT)/merged) --out $(or $(OUT),runs/relabel/round$(or $(ROUND),1)) \
		--round $(or $(ROUND),1) --split $(or $(SPLIT),train) $(if $(LIMIT),--limit $(LIMIT)) \
		--teacher-data $(or $(DATA),$(COLLECT_OUT))

onpolicy: $(STAMP)  ## MODEL= ROUNDS= CONFIG= OUT= LIMIT=: relabel + aggregate + SFT for ROUNDS rounds (+ GRPO, per recipe)
	$(PY) -m sft.onpolicy --config $(or $(CONFIG),configs/onpolicy/tiny.yaml) --model $(or $(MODEL),$(SFT_OUT)/merged) \
		$(if $(ROUNDS),--rounds $(ROUNDS)) $(if $(LIMIT),--limit $(LIMIT)) --out $(or $(OUT),runs/onpolicy)

# The long measurement (not part of `make demo`): teacher data, then per seed state-SFT -> on-policy rounds -> GRPO,
# held-out teacher states of the test split, and the eval of every planner x seed on the full 72-task test split.
# Value and window references with the copying recipe (the default until 2026-12-04; now focus references, below)
# (docs/training.md "Where the tuned planner fails: the time window", "Window references, seed 0, and the two seeds
# pooled": SFT 139/144, + round 137/144, + GRPO 136/144): per seed SFT ~3,300 s, one on-policy round ~1,200-1,320 s
# (relabel 236-275 s, SFT 596-649 s, GRPO 364-386 s), eval of the four planners ~24-25 min for one seed (2026-12-03,
# seeds 1, 0; 2 cores). Measured with padded SFT batches of 4; the SFT recipes now run the same 4 rows as unpadded
# micro-batches (same losses to ~1e-6 per step, ~1.3x faster steps: docs/training.md "Fitting the demo"), so its SFT
# times should be shorter and its table equal up to rounding: not re-measured end to end.
MEASURE := runs/measure
SEEDS ?= 0 1
MEASURE_COLLECT ?= configs/collect/embedded_1800_focus.yaml
MEASURE_SFT ?= configs/sft/tiny_copy.yaml
MEASURE_ONPOLICY ?= configs/onpolicy/tiny_focus.yaml
MEASURE_HELDOUT ?= configs/collect/embedded_focus.yaml
MEASURE_EVAL ?= configs/eval/onpolicy_focus.yaml
# The default since 2026-12-04 (docs/training.md "Focus references", 2 seeds): value, window and focus references; test
# SFT 134, + round 143, + GRPO 141 of 144 (dev 132 / 143 / 142); per seed SFT ~2,960-3,030 s (two side by side, one
# thread each), round ~11:45 wall with GRPO, eval of the four planners x 2 seeds ~12 min test / ~3.5 min dev.
# Earlier recipes, each measured in docs/training.md:
# - value + window references (the default 2026-12-03/04): MEASURE_COLLECT=configs/collect/embedded_1800_windows.yaml
#   MEASURE_ONPOLICY=configs/onpolicy/tiny_windows.yaml MEASURE_HELDOUT=configs/collect/embedded_windows.yaml
#   MEASURE_EVAL=configs/eval/onpolicy_windows.yaml (the figures below).
# - the on-policy round over all 1,080 train tasks (docs/training.md "On-policy rounds on all 1,080 train tasks",
#   2026-12-04): MEASURE_ONPOLICY=configs/onpolicy/tiny_windows_1800.yaml, ~17-19 min per seed (216 tasks: ~12-13 min).
# - action-only, no references (the default until 2026-12-03; "make measure on the full test split", 2026-11-30,
#   ~1 h 35 min of training with other jobs): MEASURE_COLLECT=configs/collect/embedded.yaml
#   MEASURE_SFT=configs/sft/tiny.yaml MEASURE_ONPOLICY=configs/onpolicy/tiny.yaml
#   MEASURE_HELDOUT=configs/collect/embedded.yaml MEASURE_EVAL=configs/eval/onpolicy.yaml
# - the copying recipe ("A planner that copies"): MEASURE_COLLECT=configs/collect/embedded_1800.yaml
#   MEASURE_SFT=configs/sft/tiny_copy.yaml MEASURE_ONPOLICY=configs/onpolicy/tiny_copy.yaml: per seed SFT
#   2,140-2,300 s, one on-policy round ~640 s, GRPO ~260 s; the final eval of 9 cells 36 min (2026-12-01).
# - value references only ("Value references"): MEASURE_COLLECT=configs/collect/embedded_1800_refs.yaml
#   MEASURE_SFT=configs/sft/tiny_copy.yaml MEASURE_ONPOLICY=configs/onpolicy/tiny_refs.yaml
#   MEASURE_HELDOUT=configs/collect/embedded_refs.yaml MEASURE_EVAL=configs/eval/onpolicy_refs.yaml: per seed SFT
#   ~2,700-2,900 s, one on-policy round ~760-1,350 s, GRPO ~235 s, eval of the five planners ~17 min for one seed.
measure: $(STAMP)  ## SEEDS="0 1" MEASURE_SFT= ...: untrained / SFT / SFT+on-policy / +RL on the 72 test tasks
	$(PY) -m collect --config $(MEASURE_COLLECT) --out $(MEASURE)/collect --split train --no-progress
	for s in $(SEEDS); do \
		$(PY) -m sft.train --config $(MEASURE_SFT) --dataset_dir $(MEASURE)/collect/sft \
			--output_dir $(MEASURE)/sft-s$$s --seed $$s --tiny_seed $$s && \
		$(PY) -m sft.onpolicy --config $(MEASURE_ONPOLICY) --model $(MEASURE)/sft-s$$s/merged \
			--teacher-data $(MEASURE)/collect --seed $$s --out $(MEASURE)/onpolicy-s$$s || exit 1; \
	done
	$(PY) -m collect --config $(MEASURE_HELDOUT) --out $(MEASURE)/heldout/collect --split test --no-harvest \
		--no-progress
	$(PY) -m collect.harvest $(MEASURE)/heldout/collect/trajectories.jsonl --out $(MEASURE)/heldout/states --eval-share 0.0
	$(PY) -m serve.eval --config $(MEASURE_EVAL) --out $(MEASURE)/eval

# ---- GPU stack resolution (issue 54) ----------------------------------------------------------------------------------
# make gpu-resolve   needs PyPI, no CUDA: pip resolves .[test,gpu] from the packages' metadata alone (--dry-run, in a
#                    throwaway venv, nothing installed) under constraints/gpu.txt, then constraints/gpu_resolution.py
#                    checks that the result is exactly the pinned set and that vLLM is inside TRL's window, torch is
#                    the one vLLM pins, transformers inside vLLM's range, triton >= 3.7.1. --isolated: this machine's
#                    pip configuration (extra indexes, find-links, global constraints) stays out of the answer.
# make gpu-setup     a GPU node: the pinned set (make setup EXTRAS=test,gpu with constraints/gpu.txt instead of cpu.txt)
GPU_RESOLVE_VENV ?= /tmp/omni-decision-gpu-resolve
GPU_RESOLVE_CONSTRAINTS ?= -c constraints/gpu.txt
GPU_RESOLVE_PIP ?= --isolated

.PHONY: gpu-resolve gpu-setup
gpu-resolve:  ## GPU_RESOLVE_CONSTRAINTS= (unset: what PyPI resolves today, to regenerate constraints/gpu.txt)
	@command -v $(PY_BOOT) >/dev/null || { echo "error: $(PY_BOOT) not found (the GPU node's Python, 3.11)"; exit 1; }
	rm -rf $(GPU_RESOLVE_VENV) && $(PY_BOOT) -m venv $(GPU_RESOLVE_VENV)
	$(GPU_RESOLVE_VENV)/bin/python -m pip $(GPU_RESOLVE_PIP) install --quiet --upgrade pip packaging
	$(GPU_RESOLVE_VENV)/bin/python -m pip $(GPU_RESOLVE_PIP) install --dry-run --ignore-installed --quiet \
		--report $(GPU_RESOLVE_VENV)/report.json $(GPU_RESOLVE_CONSTRAINTS) ".[test,gpu]"
	$(GPU_RESOLVE_VENV)/bin/python -m constraints.gpu_resolution $(GPU_RESOLVE_VENV)/report.json constraints/gpu.txt

gpu-setup:  ## a GPU node: .venv with .[test,gpu] pinned by constraints/gpu.txt (vLLM's CUDA torch, not the CPU one)
	$(MAKE) setup EXTRAS=test,gpu TORCH_CONSTRAINT="-c constraints/gpu.txt"
