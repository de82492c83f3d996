"""Runtime configuration: the collect recipe (task source, split, runtime, roles, endpoints, tools, judge, harvest),
endpoints, which backend serves which role, and the loop's budget/arm. `load_config` reads a recipe YAML.

Keys never live in these objects: an endpoint names the environment variable that holds its key (`api_key_env`),
and the chat client reads it at call time. `repr()` of every config is therefore safe to log.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from collect.actions import reference_kinds
from collect.bounds import Limits
from collect.ledger import Budget
from collect.tasks import TASK_LIMIT_KEYS, TaskLimits
from collect.world import DEFAULT_N_TASKS

ARMS = ("ledger", "react", "memory")
ROLE_NAMES = ("need_parser", "planner", "critic", "finalizer", "answer_critic", "summarizer")
OFFLINE = "offline"
# Characters of one raw observation the planner, critic and summarizer are shown (collect.roles.render truncates to
# it and says how much was cut); the tools' own cap (collect.tools.ToolsConfig) is derived from it.
MAX_OBSERVATION_CHARS = 2000


@dataclass
class EndpointConfig:
    """One OpenAI-compatible chat endpoint (vLLM, the local CPU server, a hosted API)."""

    base_url: str = field(metadata={"help": "e.g. http://127.0.0.1:8000/v1"})
    model: str = field(metadata={"help": "model name sent in each request"})
    api_key_env: str | None = field(
        default=None, metadata={"help": "name of the env var holding the API key (the key itself is never stored)"}
    )
    timeout_s: float = field(default=60.0, metadata={"help": "per-call wall-clock timeout"})
    max_retries: int = field(default=4, metadata={"help": "retries on 429/5xx/timeout/connection/malformed"})
    temperature: float = field(default=0.0, metadata={"help": "sampling temperature"})
    max_tokens: int = field(default=1024, metadata={"help": "completion token cap per call"})
    price_in_per_mtok: float = field(default=0.0, metadata={"help": "USD per million prompt tokens (cost report)"})
    price_out_per_mtok: float = field(default=0.0, metadata={"help": "USD per million completion tokens"})
    backoff_base_s: float = field(default=0.5, metadata={"help": "first retry delay; doubles per retry, +-50% jitter"})
    backoff_max_s: float = field(default=30.0, metadata={"help": "cap on one backoff delay (Retry-After may exceed)"})
    served_from: str | None = field(
        default=None,
        metadata={
            "help": "set by pipeline.eval and pipeline.relabel when they serve a checkpoint themselves: its "
            "fingerprint (pipeline.planners.checkpoint_fingerprint), which the run's config hash uses instead of the "
            "server's per-run port, so a rerun resumes the OUT; not for hand-written configs"
        },
    )

    def __post_init__(self):
        if not self.base_url or not self.model:
            raise ValueError(
                f"EndpointConfig.base_url and .model are required (got {self.base_url!r}, {self.model!r})"
            )
        if self.timeout_s <= 0:
            raise ValueError(f"EndpointConfig.timeout_s must be > 0, got {self.timeout_s}")
        if self.max_retries < 0:
            raise ValueError(f"EndpointConfig.max_retries must be >= 0, got {self.max_retries}")


@dataclass
class RolesConfig:
    """Role name -> "offline" (the privileged teacher, collect.teacher) or the name of an endpoint."""

    need_parser: str = field(default=OFFLINE, metadata={"help": "'offline' or an endpoint name"})
    planner: str = field(default=OFFLINE, metadata={"help": "'offline' or an endpoint name"})
    critic: str = field(default=OFFLINE, metadata={"help": "'offline' or an endpoint name"})
    finalizer: str = field(default=OFFLINE, metadata={"help": "'offline' or an endpoint name"})
    answer_critic: str = field(default=OFFLINE, metadata={"help": "'offline' or an endpoint name"})
    summarizer: str = field(default=OFFLINE, metadata={"help": "'offline' or an endpoint name (memory arm only)"})

    @classmethod
    def from_dict(cls, d: dict) -> RolesConfig:
        unknown = sorted(set(d) - set(ROLE_NAMES))
        if unknown:
            raise ValueError(f"RolesConfig: unknown role name(s) {unknown}; expected a subset of {ROLE_NAMES}")
        return cls(**d)

    def as_dict(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def check_endpoints(self, endpoints: dict[str, EndpointConfig]) -> None:
        for role, backend in self.as_dict().items():
            if backend != OFFLINE and backend not in endpoints:
                raise ValueError(
                    f"RolesConfig.{role} = {backend!r} is neither 'offline' nor a configured endpoint "
                    f"({sorted(endpoints)})"
                )


@dataclass
class RuntimeConfig:
    """The loop: which arm, the budget (T, revisions, failed attempts per need), observation truncation."""

    arm: str = field(default="ledger", metadata={"help": "ledger | react | memory"})
    # the budget's defaults are collect.ledger.Budget's; budget() is the one place a run's Budget is built
    max_steps: int = field(default=Budget.max_steps, metadata={"help": "T in Algorithm 1: planner calls per task"})
    max_revisions: int = field(
        default=Budget.max_revisions, metadata={"help": "blocked finishes before the answer is forced"}
    )
    unfillable_after: int = field(
        default=Budget.unfillable_after, metadata={"help": "failed attempts before a need is unfillable"}
    )
    max_observation_chars: int = field(
        default=MAX_OBSERVATION_CHARS,
        metadata={"help": "raw observation shown to planner/critic and stored in trajectories"},
    )
    concurrency: int = field(default=8, metadata={"help": "tasks / concurrent chat calls in flight"})
    references: tuple[str, ...] = field(
        default=("need", "window", "focus"),
        metadata={
            "help": "the references the ledger arm's planner prompt offers (collect.actions.REFERENCE_KINDS), each "
            "substituted by the runtime before validation and the tool: need ({need:K} in a query is need K's "
            "filled value, in code its Python literal), window (a time_range of {window:K} is the window need K "
            "names), focus ({focus:K} in a query is need K's query_focus, in code a computation need's formula). A "
            "reference the "
            "ledger cannot fill is a rejected reply; the offline teacher writes every kind offered. [] = the paper's "
            "runtime. Default: all three, chosen on the embedded dev split (docs/runtime.md)"
        },
    )
    limits: Limits = field(default_factory=Limits, metadata={"help": "size/depth bounds on role output (bounds.py)"})

    def __post_init__(self):
        if isinstance(self.limits, dict):
            self.limits = Limits(**self.limits)
        if self.arm not in ARMS:
            raise ValueError(f"RuntimeConfig.arm = {self.arm!r}; expected one of {ARMS}")
        for name in ("max_steps", "unfillable_after", "max_observation_chars", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"RuntimeConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_revisions < 0:
            raise ValueError(f"RuntimeConfig.max_revisions must be >= 0, got {self.max_revisions}")
        self.references = reference_kinds(self.references, "RuntimeConfig.references")

    def budget(self) -> Budget:
        return Budget(self.max_steps, self.max_revisions, self.unfillable_after)


# The benchmarks' own hosting: searching them would leak gold answers.
DEFAULT_BLOCKED_DOMAINS = (
    "huggingface.co/datasets/RUC-NLPIR/OmniGAIA",
    "huggingface.co/datasets/OmniGAIA",
    "huggingface.co/datasets/honglyhly/WorldSense",
    "huggingface.co/datasets/WorldSense",
    "github.com/RUC-NLPIR/OmniGAIA",
    "github.com/OmniGAIA",
    "jaaackhong.github.io/WorldSense",
    "omnigaia.github.io",
)


@dataclass
class ToolsConfig:
    perception_backend: str = field(default="annotations", metadata={"help": "annotations | media"})
    media_base_url: str = field(default="", metadata={"help": "OpenAI-compatible multimodal endpoint base URL"})
    media_model: str = field(default="", metadata={"help": "model name at the multimodal endpoint"})
    media_api_key_env: str = field(default="MEDIA_API_KEY", metadata={"help": "env var holding the endpoint key"})
    media_root: str | None = field(default=None, metadata={"help": "directory that relative asset paths are under"})
    media_timeout_s: float = field(default=120.0, metadata={"help": "per-request timeout of the perception call"})
    frames_per_range: int = field(default=8, metadata={"help": "frames sampled from a requested time range"})
    perception_top_k: int = field(default=4, metadata={"help": "annotation entries returned per perception call"})
    web_backend: str = field(default="bm25", metadata={"help": "bm25 (local corpus) | http (search provider)"})
    web_provider_url: str = field(default="", metadata={"help": "Serper-style search endpoint (POST JSON)"})
    web_api_key_env: str = field(default="SEARCH_API_KEY", metadata={"help": "env var holding the provider key"})
    web_fetch_pages: int = field(default=0, metadata={"help": "http backend: fetch the text of the top N pages"})
    blocked_domains: tuple[str, ...] = field(
        default=DEFAULT_BLOCKED_DOMAINS, metadata={"help": "hosts or host/path prefixes dropped from web results"}
    )
    top_k: int = field(default=5, metadata={"help": "web results per search"})
    web_stemmer: str = field(default="english", metadata={"help": "bm25: PyStemmer algorithm, '' for no stemming"})
    code_timeout_s: float = field(default=10.0, metadata={"help": "code_executor wall-clock limit"})
    code_memory_mb: int = field(default=512, metadata={"help": "code_executor memory limit"})
    max_observation_chars: int = field(default=2 * MAX_OBSERVATION_CHARS, metadata={"help": "cap on raw tool output"})

    def __post_init__(self):
        if self.perception_backend not in ("annotations", "media"):
            raise ValueError(f"ToolsConfig.perception_backend: {self.perception_backend!r} is not annotations|media")
        if self.web_backend not in ("bm25", "http"):
            raise ValueError(f"ToolsConfig.web_backend: {self.web_backend!r} is not bm25|http")
        if self.perception_backend == "media" and not (self.media_base_url and self.media_model):
            raise ValueError("ToolsConfig.media_base_url and media_model are required for perception_backend=media")
        if self.web_stemmer:
            import Stemmer  # PyStemmer: the stemmers the bm25 search can use

            if self.web_stemmer not in Stemmer.algorithms():
                raise ValueError(f"ToolsConfig.web_stemmer: {self.web_stemmer!r} is not one of {Stemmer.algorithms()}")
        if self.web_backend == "http" and not self.web_provider_url:
            raise ValueError("ToolsConfig.web_provider_url is required for web_backend=http")
        if self.frames_per_range < 1 or self.top_k < 1 or self.max_observation_chars < 100:
            raise ValueError(
                f"ToolsConfig: frames_per_range/top_k must be >= 1 and max_observation_chars >= 100 "
                f"(got {self.frames_per_range}, {self.top_k}, {self.max_observation_chars})"
            )
        if self.code_timeout_s <= 0 or self.code_memory_mb < 16 or self.media_timeout_s <= 0:
            raise ValueError(
                f"ToolsConfig: code_timeout_s and media_timeout_s must be > 0 and code_memory_mb >= 16 "
                f"(got {self.code_timeout_s}, {self.media_timeout_s}, {self.code_memory_mb})"
            )
        self.blocked_domains = tuple(self.blocked_domains)


@dataclass
class TaskSource:
    """Where tasks come from: the embedded world (default), a task file in the schema, or a benchmark loader."""

    kind: str = field(default="embedded", metadata={"help": "embedded | file | omnigaia | worldsense"})
    seed: int = field(default=0, metadata={"help": "embedded world seed"})
    n_tasks: int = field(
        default=DEFAULT_N_TASKS,
        metadata={
            "help": "embedded world size: tasks i = 0..n-1, split train/train/train/dev/test by i mod 5. Tasks are "
            "generated in order from one RNG, so the first 360 (the 72-task test split of the default world) are the "
            "same for every n >= 360: a larger world only adds tasks (docs/world.md)"
        },
    )
    path: str | None = field(default=None, metadata={"help": "task file / OmniGAIA metadata / worldsense_qa.json"})
    media_root: str | None = field(default=None, metadata={"help": "media root for OmniGAIA / WorldSense"})
    subtitles_root: str | None = field(default=None, metadata={"help": "WorldSense subtitles root"})
    corpus: str | None = field(
        default=None, metadata={"help": "web corpus JSONL for bm25 search (file: default <stem>.corpus.jsonl)"}
    )
    # size limits of what is read (collect.tasks.TaskLimits checks them; they stay out of CollectConfig.hash())
    max_file_bytes: int = field(
        default=TaskLimits.max_file_bytes, metadata={"help": "largest task, benchmark or corpus file (bytes)"}
    )
    max_record_bytes: int = field(
        default=TaskLimits.max_record_bytes, metadata={"help": "longest JSONL line of a task or corpus file (bytes)"}
    )
    max_question_chars: int = field(default=TaskLimits.max_question_chars, metadata={"help": "longest question"})
    max_document_chars: int = field(
        default=TaskLimits.max_document_chars, metadata={"help": "longest corpus/task document (title + text)"}
    )

    def __post_init__(self):
        if self.kind not in ("embedded", "file", "omnigaia", "worldsense"):
            raise ValueError(f"tasks.kind: unknown task source {self.kind!r}")
        if self.kind != "embedded" and not self.path:
            raise ValueError(f"tasks.path is required for tasks.kind={self.kind!r}")
        if self.n_tasks < 1:
            raise ValueError(f"tasks.n_tasks must be a positive integer, got {self.n_tasks!r}")
        if self.kind != "embedded" and self.n_tasks != DEFAULT_N_TASKS:
            raise ValueError(f"tasks.n_tasks sizes the embedded world; it has no meaning for tasks.kind={self.kind!r}")
        if self.kind == "embedded" and self.corpus:
            raise ValueError("tasks.corpus: the embedded world brings its own corpus; corpus is for other sources")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one), at least 1."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


@dataclass
class CollectConfig:
    name: str = field(default="collect", metadata={"help": "run name (recorded in trajectories)"})
    tasks: TaskSource = field(default_factory=TaskSource)
    split: str | None = field(default="train", metadata={"help": "train | dev | test | all (embedded world)"})
    limit: int | None = field(default=None, metadata={"help": "first N tasks of the split (deterministic order)"})
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    roles: RolesConfig = field(default_factory=RolesConfig)
    endpoints: dict[str, EndpointConfig] = field(default_factory=dict)
    tools: dict = field(default_factory=dict, metadata={"help": "collect.tools.ToolsConfig fields"})
    judge: dict = field(default_factory=dict, metadata={"help": "{endpoint: name} enables the OmniGAIA LLM judge"})
    harvest: dict = field(default_factory=lambda: {"enabled": True, "eval_share": 0.1})
    progress: bool = True
    allow_missing_media: bool = field(
        default=False, metadata={"help": "run tasks whose media files are missing (else the pre-flight refuses)"}
    )
    workers: int | str = field(
        default=1, metadata={"help": "worker processes on this machine: an integer >= 1 or 'auto' (the usable cores)"}
    )
    shard: str | None = field(
        default=None, metadata={"help": "'K/N': run only shard K of N (stable hash of the task id; docs/scale.md)"}
    )

    def __post_init__(self):
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit: must be >= 1 (omit it to run every task), got {self.limit}")
        self.roles.check_endpoints(self.endpoints)
        if isinstance(self.workers, str) and self.workers.strip().isdigit():
            self.workers = int(self.workers)
        if self.workers != "auto" and (isinstance(self.workers, bool) or not isinstance(self.workers, int)):
            raise ValueError(f"workers: expected an integer >= 1 or 'auto', got {self.workers!r}")
        if self.workers != "auto" and self.workers < 1:
            raise ValueError(f"workers: expected an integer >= 1 or 'auto', got {self.workers!r}")
        if self.shard is not None:
            parse_shard(self.shard)
        if self.judge.get("endpoint") and self.judge["endpoint"] not in self.endpoints:
            raise ValueError(f"judge.endpoint: {self.judge['endpoint']!r} is not defined under `endpoints`")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def n_workers(self) -> int:
        """`workers` as a number: 'auto' is the cores this process may run on."""
        return usable_cores() if self.workers == "auto" else int(self.workers)

    def hash(self) -> str:
        """Hash of everything that changes what a trajectory means (not limit/progress/harvest, nor how the tasks are
        spread: workers, shard; shards of one run share the hash, which is what `collect.merge` checks)."""
        d = self.to_dict()
        for k in ("limit", "progress", "harvest", "name", "workers", "shard"):
            d.pop(k, None)
        # the default world size stays out: hashes (and resumable OUTs) from before the key are unchanged
        if d["tasks"].get("n_tasks") == DEFAULT_N_TASKS:
            d["tasks"].pop("n_tasks")
        for k in TASK_LIMIT_KEYS:  # whether a task loads, not what its trajectory means
            d["tasks"].pop(k, None)
        if d["tools"].get("web_backend", "bm25") == "bm25":  # the search the trajectories were made with: an OUT of
            d["tools"].setdefault("web_stemmer", ToolsConfig.web_stemmer)  # words as written does not resume stemmed
        for ep in (d.get("endpoints") or {}).values():
            # a checkpoint served for this run only (pipeline.eval, pipeline.relabel) listens on a fresh port each run:
            # what the trajectories mean is the checkpoint, so its fingerprint stands in for the URL
            served = ep.pop("served_from", None) if isinstance(ep, dict) else None
            if served is not None:
                ep["base_url"] = f"served checkpoint {served}"
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]


class ConfigError(ValueError):
    """A recipe that cannot be used; the message names the file and the field (the CLI exits 2)."""


def _describe(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _coerce(value, hint, where: str):
    """`value` checked against the type hint `hint` (ints stay ints: YAML's "5" is not a limit of 5); nested
    dataclasses are built from mappings. Raises ConfigError naming `where`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], where) if len(inner) == 1 else value
    if dataclasses.is_dataclass(hint):
        return from_mapping(hint, value, where)
    if hint is bool and not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {_describe(value)}")
    if hint is int and (not isinstance(value, int) or isinstance(value, bool)):
        raise ConfigError(f"{where}: expected an integer, got {_describe(value)}")
    if hint is float:
        if not isinstance(value, int | float) or isinstance(value, bool) or value != value:
            raise ConfigError(f"{where}: expected a number, got {_describe(value)}")
        return float(value)
    if hint is str and not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string, got {_describe(value)}")
    if origin is tuple:
        if not isinstance(value, list | tuple) or not all(isinstance(x, str) for x in value):
            raise ConfigError(f"{where}: expected a list of strings, got {_describe(value)}")
        return tuple(value)
    if hint is list or origin is list:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {_describe(value)}")
        return list(value)
    if hint is dict or origin is dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {_describe(value)}")
        if args and dataclasses.is_dataclass(args[1]):
            return {str(k): from_mapping(args[1], v, f"{where}.{k}") for k, v in value.items()}
    return value


def from_mapping(cls, raw, where: str):
    """Build dataclass `cls` from a YAML mapping: unknown keys (with the closest known one), missing required keys,
    wrong types and out-of-range values are ConfigErrors that name the field (`where.key`)."""
    if raw is None:
        raw = {}
    if isinstance(raw, cls):
        return raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of {cls.__name__} fields, got {_describe(raw)}")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in fields(cls) if f.init]
    prefix = f"{where}." if where else ""
    for k in raw:
        if k not in known:
            near = difflib.get_close_matches(str(k), known, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ConfigError(f"{prefix}{k}: unknown key; expected one of {known}{hint}")
    required = [
        f.name
        for f in fields(cls)
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [k for k in required if k not in raw]
    if missing:
        raise ConfigError(f"{where or cls.__name__}: missing required key(s) {missing}")
    kwargs = {k: _coerce(v, hints[k], f"{prefix}{k}") for k, v in raw.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{where or cls.__name__}: {e}") from None


def load_recipe(cls, path: str | os.PathLike, overrides: dict | None = None, what: str = "recipe"):
    """The one loader of the YAML recipes that are not trainer configs (runtime/collect, eval, on-policy, serve):
    dataclass `cls` built from the file's mapping plus `overrides` (None values ignored). Every problem has one error
    style: a ConfigError naming the file, then the field, then what was expected (the allowed values, the closest
    known key). A missing file is a FileNotFoundError naming `what`."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} not found: {p}")
    raw = read_yaml_mapping(p)
    raw.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return from_mapping(cls, raw, "")
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None


def parse_shard(spec: str) -> tuple[int, int]:
    """'K/N' -> (K, N) with 0 <= K < N."""
    try:
        k, n = (int(x) for x in str(spec).split("/"))
    except ValueError:
        raise ValueError(f"shard: expected 'K/N' (e.g. 0/4), got {spec!r}") from None
    if n < 1 or not 0 <= k < n:
        raise ValueError(f"shard: expected 'K/N' with 0 <= K < N, got {spec!r}")
    return k, n


def shard_of(task_id: str, n: int) -> int:
    """The shard (0..n-1) a task belongs to: a stable hash of its id, the same in every process, order and run."""
    return int.from_bytes(hashlib.sha256(f"shard:{task_id}".encode()).digest()[:8], "big") % n


def read_yaml_mapping(p: Path) -> dict:
    """A YAML file's top-level mapping ({} for an empty file); text that is not UTF-8, a syntax error or a top level
    that is not a mapping is a ConfigError naming the file (and the line)."""
    try:
        raw = yaml.safe_load(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text ({e})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{p}: YAML syntax error{at}: {getattr(e, 'problem', None) or e}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: expected a mapping of config keys at the top level, got {type(raw).__name__}")
    return raw


def load_config(path: str | os.PathLike, overrides: dict | None = None) -> CollectConfig:
    """Read a collect recipe (load_recipe); its `tools` block is checked against ToolsConfig here too."""
    cfg = load_recipe(CollectConfig, path, overrides, "config file")
    try:
        from_mapping(ToolsConfig, cfg.tools, "tools")  # validated here; the engine builds it again per run
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return cfg
