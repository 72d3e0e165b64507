"""train.device, and the one-way import between the builder and the distributed start."""

import ast
from pathlib import Path

import pytest
import torch

import ember.train
from ember.errors import ConfigError
from ember.train.device import pick_device


def test_pick_device():
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            pick_device("cuda")


def _imports(module: str) -> set[str]:
    tree = ast.parse((Path(ember.train.__file__).parent / f"{module}.py").read_text())
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_builder_and_distributed_do_not_import_each_other():
    assert "ember.train.builder" not in _imports("distributed")  # builder imports distributed (lazily) alone
