"""Allocator tunables: the command line re-runs itself once with them (unless the user chose
their own or opted out), and they cut page faults per large step."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ember.allocator import TUNABLES, _glibc

pytestmark = pytest.mark.skipif(not _glibc(), reason="glibc tunables: Linux with glibc only")

PROBE = "import os; print(os.environ.get('GLIBC_TUNABLES'))"


def _cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "EMBER_MALLOC", "EMBER_MALLOC_REEXEC")}
    return {**env, **extra}


def test_the_command_line_reruns_itself_with_the_tunables():
    probe = subprocess.run([sys.executable, "-c", "import sys; from ember.allocator import reexec_tuned;"
                            "reexec_tuned(['-m', 'ember', '--help']); print('not re-run')"], env=_cli_env(),
                           capture_output=True, text=True, timeout=120)
    assert "not re-run" not in probe.stdout and "usage" in probe.stdout  # replaced by `python -m ember --help`


@pytest.mark.parametrize("extra, expected", [
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "glibc.malloc.arena_max=2"),  # the user's choice wins
    ({"EMBER_MALLOC": "default"}, "None"),  # opted out
])
def test_the_users_choice_is_kept(extra, expected):
    code = ("import os; from ember.allocator import reexec_tuned; reexec_tuned(['-m', 'ember', '--help']);"
            "print('kept', os.environ.get('GLIBC_TUNABLES'))")
    out = subprocess.run([sys.executable, "-c", code], env=_cli_env(**extra), capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == f"kept {expected}"


def test_tunables_cut_page_faults_of_large_activations():
    """A step-like loop allocating 64 MiB activations: without tunables every one is mapped and
    faulted in afresh; with them the pages are reused (>= 10x fewer faults)."""
    code = ("import resource, torch\n"
            "x = torch.randn(16384, 256)\n"
            "w = torch.randn(256, 1024)\n"
            "for _ in range(3): (x @ w).relu_().sum()\n"
            "f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "for _ in range(5): (x @ w).relu_().sum()\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)")
    env = _cli_env(OMP_NUM_THREADS="1")
    plain = int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120).stdout)
    tuned = int(subprocess.run([sys.executable, "-c", code], env={**env, "GLIBC_TUNABLES": TUNABLES},
                               capture_output=True, text=True, timeout=120).stdout)
    assert plain >= 5 * 16384 * 1024 * 4 // 4096 // 2  # about one fault per page of each activation
    assert tuned * 10 <= plain
