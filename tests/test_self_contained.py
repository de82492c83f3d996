"""The repository is self-contained: no tracked file names a path outside it.

Code, tests, configs, docs and the Makefile must not point at a sibling checkout (the reference shelf beside the
clone), the machine this was developed on (its work folder, home directories) or absolute data mounts (`/data/...`,
`/mnt/...`): everything a run or a test reads lives in the repository (the OmniGAIA metadata is vendored under
data/omnigaia/) or is passed in by the user. Exempt: .gitignore (its leading `/` anchors a pattern at the repository
root) and vendored third-party data under data/ (upstream annotations, never read as paths).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(
    r"\.\./shared"  # a sibling checkout
    r"|\bshared/(?:data|notes)/"
    r"|ROOT\.parent\b"  # code that climbs out of the repository
    r"|/work/"
    r"|/home/[A-Za-z]|/Users/[A-Za-z]|/root/|(?<![\w$])~/"  # home directories
    r"|(?<![\w./-])/(?:data|mnt|scratch|srv|opt)/"  # absolute data mounts
)
EXEMPT_PREFIXES = ("data/",)
EXEMPT = {".gitignore", "tests/test_self_contained.py"}


def _tracked_text_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout: {e}")
    return [p for p in out.stdout.decode().split("\0") if p]


def offenders(root: Path, paths: list[str]) -> list[str]:
    found = []
    for rel in paths:
        if rel in EXEMPT or rel.startswith(EXEMPT_PREFIXES):
            continue
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary, or deleted in the work tree
        for n, line in enumerate(text.splitlines(), 1):
            m = OUTSIDE.search(line)
            if m:
                found.append(f"{rel}:{n}: {m.group(0)!r} in {line.strip()[:120]!r}")
    return found


def test_no_tracked_file_names_a_path_outside_the_repository():
    paths = _tracked_text_files()
    assert "Makefile" in paths and "configs/collect/omnigaia_api.yaml" in paths
    assert offenders(ROOT, paths) == []


# The offending examples are assembled from pieces so that this file itself names no outside path either.
_DEV, _SIBLING = "/" + "work", ".." + "/shared"


@pytest.mark.parametrize(
    "line",
    [
        f'OMNIGAIA = Path("{_DEV}/shared/data/omnigaia/test_metadata.json")',
        'load_omnigaia(ROOT.parent / "shared/data/omnigaia/test_metadata.json")',
        f"tasks: {{kind: omnigaia, path: {_SIBLING}/data/omnigaia/test_metadata.json}}",
        f"Verified gotchas (see {_DEV}/shared/notes/stack.md):",
        "tasks: {kind: worldsense, path: /data/worldsense/worldsense_qa.json}",
        "cache_dir: /home/alice/.cache/od",
        "see ~/notes.md",
    ],
)
def test_the_scan_catches_each_kind_of_outside_path(tmp_path, line):
    (tmp_path / "f.txt").write_text(f"ok line\n{line}\n")
    assert len(offenders(tmp_path, ["f.txt"])) == 1


@pytest.mark.parametrize(
    "line",
    [
        "tasks: {kind: omnigaia, path: data/omnigaia/test_metadata.json, media_root: data/omnigaia/media}",
        "dataset_dir: runs/data/sft",
        'PROMPT_PATH = Path(__file__).parent / "prompts" / "judge.md"',
        "os.mkdir('/tmp/omni-sbx-evil-dir')",
    ],
)
def test_in_repository_paths_pass(tmp_path, line):
    (tmp_path / "f.txt").write_text(line + "\n")
    assert offenders(tmp_path, ["f.txt"]) == []


def test_the_vendored_omnigaia_file_is_tracked_with_its_license():
    paths = _tracked_text_files()
    assert {"data/omnigaia/test_metadata.json", "data/omnigaia/LICENSE"} <= set(paths)
    assert "MIT License" in (ROOT / "data/omnigaia/LICENSE").read_text(encoding="utf-8")


# a path into the repository as the text names it: a known top-level folder, then a file with an extension
CITED = re.compile(
    r"(?<![\w/.-])((?:configs|docs|collect|sft|rl|rewards|serve|pipeline|bench|tests|data|constraints|\.ci)/"
    r"[\w./-]*\.(?:py|md|yaml|yml|json|jsonl|jinja|txt|sh|sbatch|toml))\b"
)


def cited_but_missing(root: Path, paths: list[str]) -> list[str]:
    """`file: path` for each repository path a text file cites that is neither in the repository nor git-ignored (a
    user's data or a run's output). The experiment log is exempt: it names recipes at the commits that had them."""
    found = []
    for rel in paths:
        skip = rel.startswith(("docs/experiments/", "tests/fixtures/")) or rel in EXEMPT
        if skip or rel.endswith((".json", ".jsonl")):
            continue
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for m in CITED.finditer(text):
            p = m.group(1)
            if (root / p).exists() or (root / rel).parent.joinpath(p).exists():  # from the root or the citing file
                continue
            ignored = subprocess.run(["git", "check-ignore", "-q", p], cwd=root, timeout=60).returncode == 0
            if not ignored:
                found.append(f"{rel}: {p}")
    return found


def test_no_tracked_file_cites_a_repository_file_that_is_not_there():
    missing = cited_but_missing(ROOT, _tracked_text_files())
    assert missing == [], missing


def test_the_citation_scan_catches_a_deleted_recipe(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "kept.yaml").write_text("a: 1\n")
    (tmp_path / "README.md").write_text("run configs/kept.yaml, not configs/gone.yaml or docs/stack.md\n")
    assert cited_but_missing(tmp_path, ["README.md"]) == ["README.md: configs/gone.yaml", "README.md: docs/stack.md"]
