"""Roles for one task from the recipe: each role the offline teacher's or an OpenAI-compatible one."""

from __future__ import annotations

from collect.config import OFFLINE, EndpointConfig, RolesConfig
from collect.llm import ClientPool
from collect.roles.base import Roles
from collect.roles.openai_roles import make_openai_role
from collect.teacher import make_teacher_roles


def build_roles(task, roles_cfg: RolesConfig, endpoints: dict[str, EndpointConfig], client_pool: ClientPool) -> Roles:
    """Roles for one task: each role is the offline teacher's or an OpenAI-compatible one, as configured.

    The offline roles are the teacher's (collect.teacher.make_teacher_roles(task)), built only when some role is
    offline."""
    roles_cfg.check_endpoints(endpoints)
    chosen = roles_cfg.as_dict()
    teacher = None
    if OFFLINE in chosen.values():
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
