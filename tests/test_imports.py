"""The import graph (tests/helpers/import_graph.py, `make imports`): no cycle anywhere, counting imports inside
functions; the orchestration package on top; the project's own modules imported at module level only."""

from __future__ import annotations

from tests.helpers.import_graph import PACKAGES, find_cycle, imports, package_edges


def test_no_import_cycle_between_any_modules_counting_every_import():
    edges = imports()
    assert len(edges) > 150  # the graph was read (every package, every import form)
    assert find_cycle(edges) is None, find_cycle(edges)
    assert ("pipeline.eval", "rl.score") in {(a, b) for a, b, _ in edges}


def test_the_cycle_finder_finds_a_cycle_a_lazy_import_would_close():
    edges = [("collect.a", "collect.b", False), ("collect.b", "collect.c", False), ("collect.c", "collect.a", True)]
    assert find_cycle(edges) == ["collect.a", "collect.b", "collect.c", "collect.a"]


def test_pipeline_is_the_top_layer_and_the_libraries_never_import_it():
    pk = package_edges(imports())
    assert {"collect", "rl", "serve"} <= pk["pipeline"]
    assert [p for p in PACKAGES if "pipeline" in pk[p]] == []
    assert pk["collect"] == set()  # the runtime is the ground floor
    for lib in ("rewards", "serve"):
        assert pk[lib] <= {"collect"}, (lib, pk[lib])


def test_the_projects_own_modules_are_imported_at_module_level_only():
    lazy = [f"{a} -> {b}" for a, b, inner in imports() if inner]
    assert lazy == [], lazy
