"""Runtime configuration: endpoints, which backend serves which role, and the loop's budget/arm.

Keys never live in these objects: an endpoint names the environment variable that holds its key (`api_key_env`),
and the chat client reads it at call time. `repr()` of every config is therefore safe to log.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from collect.bounds import Limits
from collect.ledger import Budget

if TYPE_CHECKING:  # pragma: no cover
    from collect.llm import ClientPool
    from collect.roles.base import Roles

ARMS = ("ledger", "react", "memory")
ROLE_NAMES = ("need_parser", "planner", "critic", "finalizer", "answer_critic", "summarizer")
OFFLINE = "offline"


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
    max_steps: int = field(default=15, metadata={"help": "T in Algorithm 1: planner calls per task"})
    max_revisions: int = field(default=2, metadata={"help": "blocked finishes before the answer is forced"})
    unfillable_after: int = field(default=3, metadata={"help": "failed attempts before a need is unfillable"})
    max_observation_chars: int = field(
        default=2000, metadata={"help": "raw observation shown to planner/critic and stored in trajectories"}
    )
    concurrency: int = field(default=8, metadata={"help": "tasks / concurrent chat calls in flight"})
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

    def budget(self) -> Budget:
        return Budget(self.max_steps, self.max_revisions, self.unfillable_after)


def build_roles(task, roles_cfg: RolesConfig, endpoints: dict[str, EndpointConfig], client_pool: ClientPool) -> Roles:
    """Roles for one task: each role is the offline teacher's or an OpenAI-compatible one, as configured.

    The teacher (collect.teacher.make_teacher_roles(task)) is imported only when some role is offline, so endpoint-only
    runs do not depend on it."""
    from collect.roles.base import Roles
    from collect.roles.openai_roles import make_openai_role

    roles_cfg.check_endpoints(endpoints)
    chosen = roles_cfg.as_dict()
    teacher = None
    if OFFLINE in chosen.values():
        from collect.teacher import make_teacher_roles  # written by another stage; imported lazily on purpose

        teacher = make_teacher_roles(task)
    built: dict = {}
    models: dict[str, str] = {}
    for role, backend in chosen.items():
        if backend == OFFLINE:
            built[role] = getattr(teacher, role)
            models[role] = (teacher.models or {}).get(role, OFFLINE)
        else:
            built[role] = make_openai_role(role, client_pool.client(backend))
            models[role] = endpoints[backend].model
    return Roles(**built, models=models)
