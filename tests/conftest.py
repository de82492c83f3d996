import os

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
