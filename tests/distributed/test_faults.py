"""Faults of a distributed run (gloo, CPU, launched by torchrun or as bare ranks): a killed or
hung rank stops the others within seconds naming it, and the run resumes from its last
complete checkpoint to equal an uninterrupted run; SIGTERM to one rank stops every rank at one step with
one checkpoint; differing configs, an unreachable rendezvous and an out_dir that not every rank
sees give a ConfigError (exit code 2) that says what to fix; two torchrun "nodes" on 127.0.0.1
train together like one process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml

from ember.config import load
from ember.distributed.config import DistributedConfig
from ember.distributed.process_group import Topology, start
from ember.distributed.watchdog import Watchdog, process_gone
from ember.errors import CheckpointError, ConfigError
from ember.testing.distributed import (
    assert_states_close, checkpoint_state, ember_start, finish, free_port, rank_pids, torchrun_start,
)
from ember.train.distributed import config_differences
from ember.train.loop import train

pytestmark = pytest.mark.dist  # every test here needs torch.distributed (a store, gloo)

CONFIG = {
    # 400 steps of 24 rows: far more than a test lets run, so a rank is killed mid-run
    "data": {"preset": "synthetic", "batch_size": 24,
             "synthetic": {"num_dense": 3, "num_sparse": 3, "rows": 9600, "eval_rows": 48, "vocab_size": 40}},
    "embedding": {"dim": 4},
    "tables": [{"name": "C1", "optimizer": {"type": "adagrad", "lr": 0.1}},
               {"name": "C2", "optimizer": {"type": "sgd", "lr": 0.1}},
               {"name": "C3", "optimizer": {"type": "adam", "lr": 0.01}}],
    "model": {"type": "deepfm", "deep_mlp": [8]},
    "train": {"epochs": 1, "log_every": 4, "progress": False, "threads": 1, "precision": "fp32",
              "dense_optimizer": {"type": "adam", "lr": 0.01}},
    "pipeline": {"enabled": False},
    "distributed": {"sharding": "row_wise", "tables": {"C1": "table_wise"}},
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    cfg = {**CONFIG, "train": {**CONFIG["train"], "out_dir": str(root / "runs")}}
    path = root / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, root / "runs"


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            done = finish(proc, 5)
            raise AssertionError(f"{path} never appeared (rc {done.returncode}):\n{done.stderr[-4000:]}")
        time.sleep(0.02)


def _train_losses(run: Path, steps: int) -> list[float]:
    """The losses a run logged up to step ``steps``."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["kind"] == "train" and r["step"] <= steps]


def _one_process(path: Path, name: str, steps: int):
    return train(load(path, [f"train.run_name={name}", f"train.max_steps={steps}"]))


@pytest.mark.slow
def test_two_torchrun_nodes_train_like_one_process_and_a_hung_node_stops_the_other(setup):
    """Two torchrun launches with ``--nnodes 2`` on 127.0.0.1 train together. Rank 1 (node 1)
    then hangs (SIGSTOP: to rank 0 it looks like a vanished machine, and its own torchrun agent
    sees nothing): rank 0 blocks in its next collective, which would wait distributed.timeout_s
    (300 s); its watchdog sees no heartbeat for heartbeat_timeout_s and ends the process, naming
    rank 1. What the nodes trained equals one process, and the run resumed from the last
    complete checkpoint on one process ends as an uninterrupted run does."""
    path, runs = setup
    port = free_port()
    nodes = [torchrun_start(path, 1, ["train.run_name=nodes", "checkpoint.every=4", "distributed.heartbeat_timeout_s=3"],
                            ["--nnodes=2", f"--node-rank={r}", "--master-addr=127.0.0.1", f"--master-port={port}"])
             for r in (0, 1)]
    (rank0,), (rank1,) = rank_pids(nodes[0], 1).values(), rank_pids(nodes[1], 1).values()
    _wait_for(runs / "nodes" / "checkpoints" / "LATEST", nodes[0])
    os.kill(rank1, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        done = finish(nodes[0], 90)
        elapsed = time.monotonic() - t0
    finally:
        os.kill(rank1, signal.SIGKILL)
        finish(nodes[1], 60)
    assert elapsed < 30, f"rank 0 took {elapsed:.0f} s to stop"
    err = done.stderr
    assert re.search(rf"ember: error: rank 1 \([^,]+, pid {rank1}\) stopped responding: no heartbeat for \d+ s", err), err[-4000:]
    assert f"exitcode: 1) local_rank: 0 (pid: {rank0})" in err  # the watchdog's exit code
    assert "Traceback" not in err.split("local_rank: 0")[0]  # nothing from inside torch.distributed
    stopped = checkpoint_state(runs / "nodes")
    assert 4 <= stopped["step"] < 40 and stopped["step"] % 4 == 0
    _one_process(path, "one_nodes", stopped["step"])
    assert_states_close(checkpoint_state(runs / "one_nodes"), stopped)
    losses = [_train_losses(runs / name, stopped["step"]) for name in ("one_nodes", "nodes")]
    assert len(losses[0]) == stopped["step"] // 4 and losses[1] == pytest.approx(losses[0], abs=1e-6)
    train(load(path, ["train.run_name=nodes", f"train.resume={runs / 'nodes'}", "train.max_steps=40"]))
    _one_process(path, "one40", 40)
    assert_states_close(checkpoint_state(runs / "one40"), checkpoint_state(runs / "nodes"))


@pytest.mark.slow
def test_a_killed_rank_under_one_torchrun_is_named_though_the_agent_terminates_the_others(setup):
    """One torchrun, 2 ranks: when rank 1 dies its agent sends SIGTERM to rank 0 at once; rank
    0 still names rank 1 (no traceback) before it exits."""
    path, runs = setup
    proc = torchrun_start(path, 2, ["train.run_name=agent", "checkpoint.every=4"])
    pids = rank_pids(proc, 2)
    _wait_for(runs / "agent" / "checkpoints" / "LATEST", proc)
    os.kill(pids[1], signal.SIGKILL)
    t0 = time.monotonic()
    done = finish(proc, 90)
    assert time.monotonic() - t0 < 30 and done.returncode != 0
    assert re.search(rf"ember train: error: rank 1 \([^,]+, pid {pids[1]}\) exited", done.stderr), done.stderr[-4000:]
    assert f"exitcode  : 1 (pid: {pids[0]})" in done.stderr, done.stderr[-2500:]  # RankLost's exit code, not the agent's SIGTERM
    assert "[rank0]: Traceback" not in done.stderr and "pair.cc" not in done.stderr


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_every_rank_at_one_step_with_one_checkpoint(setup):
    """Bare ranks (no torchrun agent, which would forward it to all): SIGTERM reaches rank 1
    alone. Time-based checkpoints (decided together each step) run meanwhile."""
    path, runs = setup
    port = free_port()
    ranks = [ember_start(path, r, 2, port, ["train.run_name=stopped", "checkpoint.every_s=0.3"]) for r in (0, 1)]
    _wait_for(runs / "stopped" / "checkpoints" / "LATEST", ranks[0])
    ranks[1].send_signal(signal.SIGTERM)
    done = [finish(p, 90) for p in ranks]
    saved = []
    for d in done:
        assert d.returncode == 143, d.stderr[-3000:]  # 128 + SIGTERM, on both ranks
        saved += re.findall(r"ember train: stopped by SIGTERM; the run was saved to (\S+) ", d.stderr)
    assert len(saved) == 2 and saved[0] == saved[1], saved  # one checkpoint, written together
    state = checkpoint_state(Path(saved[0]))
    assert state["step"] < 400
    _one_process(path, "one_stop", state["step"])
    assert_states_close(checkpoint_state(runs / "one_stop"), state)


def _bare_ranks(path: Path, overrides: list[list[str]], prefixes: list[list[str]] | None = None):
    port = free_port()
    procs = [ember_start(path, r, len(overrides), port, o, (prefixes or [[]] * len(overrides))[r])
             for r, o in enumerate(overrides)]
    return [finish(p, 120) for p in procs]


@pytest.mark.slow
def test_ranks_with_differing_configs_name_the_keys(setup):
    path, _ = setup
    done = _bare_ranks(path, [["train.run_name=differ"], ["train.run_name=differ", "train.log_every=2", "train.threads=2"]])
    for d in done:
        assert d.returncode == 2, d.stderr[-3000:]
        assert "the ranks' configs differ" in d.stderr and "train.log_every: rank 0: 4, rank 1: 2" in d.stderr
        assert "train.threads" not in d.stderr.split("may differ")[1]  # a local key: not a difference
        assert "Traceback" not in d.stderr


@pytest.mark.slow
@pytest.mark.parametrize("copy", ["shorter", "missing"])
def test_a_node_with_another_copy_of_the_data_stops_every_rank_naming_it(tmp_path, copy):
    """Two "nodes" (bare ranks in their own working directory) read data.train at the same
    relative path: node 1's copy is shorter, or missing. Both ranks stop at the start with a
    ConfigError (exit 2) naming the file, neither waiting for the other until
    distributed.timeout_s nor reporting an internal error."""
    rows = "".join(f"{i % 2},{i},c{i % 5}\n" for i in range(40))
    nodes = [tmp_path / "n0", tmp_path / "n1"]
    for node in nodes:
        node.mkdir()
    (nodes[0] / "t.csv").write_text("y,d,c\n" + rows)
    if copy == "shorter":
        (nodes[1] / "t.csv").write_text("y,d,c\n" + rows[: len(rows) // 2])
    cfg = {"data": {"format": "csv", "train": "t.csv", "batch_size": 8},
           "schema": {"labels": ["y"], "dense": [{"name": "d"}], "sparse": [{"name": "c"}]},
           "embedding": {"dim": 4}, "model": {"type": "lr"}, "pipeline": {"enabled": False},
           "train": {"out_dir": str(tmp_path / "runs"), "run_name": "copies", "progress": False, "threads": 1},
           "distributed": {"timeout_s": 30}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    t0 = time.monotonic()
    done = _bare_ranks(path, [[], []], [["sh", "-c", f'cd {node} && exec "$@"', "sh"] for node in nodes])
    assert time.monotonic() - t0 < 25  # not distributed.timeout_s
    said = (r"the ranks see different data.train files: 't.csv' has \d+ bytes on rank 1 and \d+ on rank 0"
            if copy == "shorter" else "not every rank can list data.train: rank 1: data path 't.csv' matches no csv file")
    for d in done:
        assert d.returncode == 2, d.stderr[-3000:]
        assert re.search("ember train: error: " + said, d.stderr), d.stderr[-3000:]
        assert "Traceback" not in d.stderr and "internal error" not in d.stderr


@pytest.mark.slow
def test_a_diverged_run_stops_every_rank_at_its_first_non_finite_loss(tmp_path):
    """Dense SGD at lr 1e30: the all-reduced weights turn NaN on every rank at once, and every
    rank stops there with the one-line Diverged error (exit 2), none waiting for another."""
    rows = "".join(f"{i % 2},{i},c{i % 5}\n" for i in range(64))
    (tmp_path / "t.csv").write_text("y,d,c\n" + rows)
    cfg = {"data": {"format": "csv", "train": str(tmp_path / "t.csv"), "batch_size": 8},
           "schema": {"labels": ["y"], "dense": [{"name": "d"}], "sparse": [{"name": "c"}]},
           "embedding": {"dim": 4}, "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
           "train": {"out_dir": str(tmp_path / "runs"), "run_name": "nan", "progress": False, "threads": 1,
                     "dense_optimizer": {"type": "sgd", "lr": 1e30}},
           "distributed": {"timeout_s": 30}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    t0 = time.monotonic()
    done = _bare_ranks(path, [[], []])
    assert time.monotonic() - t0 < 25  # not distributed.timeout_s
    for d in done:
        assert d.returncode == 2, d.stderr[-3000:]
        assert re.search(r"ember train: error: training diverged at step \d+: the batch's loss is nan", d.stderr), \
            d.stderr[-3000:]
        assert "Traceback" not in d.stderr


def _can_unshare(tmp: Path) -> bool:
    try:
        return subprocess.run(["unshare", "--mount", "sh", "-c", f"mount -t tmpfs tmpfs {tmp}"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.slow
def test_an_out_dir_one_rank_cannot_see_is_an_error(setup):
    """Rank 1 runs in a mount namespace where train.out_dir is a private tmpfs: as on a node
    whose out_dir is its local disk."""
    path, runs = setup
    runs.mkdir(exist_ok=True)
    if not _can_unshare(runs):
        pytest.skip("needs `unshare --mount` (root or user namespaces) to give one rank its own train.out_dir")
    private = ["unshare", "--mount", "sh", "-c", f'mount -t tmpfs tmpfs {runs} && exec "$@"', "sh"]
    done = _bare_ranks(path, [["train.run_name=blind"], ["train.run_name=blind"]], [[], private])
    for d in done:
        assert d.returncode == 2, d.stderr[-3000:]
        assert re.search(r"train.out_dir is not shared: rank 1 \(\S+\) cannot see \S+blind", d.stderr), d.stderr[-3000:]


def test_an_unreachable_rendezvous_is_a_config_error_within_the_timeout(monkeypatch):
    port = free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=rf"rank 1 of 2 could not reach the rendezvous at 127.0.0.1:{port} within 0.5 s; "
                                          "check that node 0"):
        start(DistributedConfig(timeout_s=0.5), torch.device("cpu"), Topology(1, 2, 1, 2))
    with pytest.raises(ConfigError, match=rf"rank 0 listened at 127.0.0.1:{port} for 0.5 s .* not all 2 ranks joined"):
        start(DistributedConfig(timeout_s=0.5), torch.device("cpu"), Topology(0, 2, 0, 2))
    assert time.monotonic() - t0 < 15


def test_config_differences_name_keys_and_ranks():
    a = {"data.batch_size": 24, "train.lr": 0.1}
    assert config_differences([a, a]) == []
    assert config_differences([a, {**a, "data.batch_size": 48}, a, {"data.batch_size": 24}]) == [
        "data.batch_size: rank 0: 24, rank 1: 48, rank 2: 24, rank 3: 24",
        "train.lr: rank 0: 0.1, rank 1: 0.1, rank 2: 0.1, rank 3: (unset)"]


def _watchdogs(world: int, timeout_s: float):
    """``world`` watchdogs on one store (as ranks 0..world-1), beating every 0.05 s; each
    records the exit code it would end its process with."""
    port = free_port()
    import datetime

    import torch.distributed as dist

    master = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))
    exits: dict[int, list[int]] = {r: [] for r in range(world)}
    dogs = [Watchdog(dist.PrefixStore("t/", dist.TCPStore("127.0.0.1", port, timeout=datetime.timedelta(seconds=5))),
                     r, world, timeout_s, f"127.0.0.1:{port}", interval_s=0.05, grace_s=0.2,
                     exit=exits[r].append) for r in range(world)]
    for d in dogs:
        d.start()
    return master, dogs, exits


def _until(cond, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_watchdog_names_a_hung_rank_and_ends_a_blocked_process():
    master, dogs, exits = _watchdogs(3, timeout_s=0.5)
    dogs[1]._stop.set()  # rank 1 hangs: its heartbeat stops, no "done"
    _until(lambda: exits[0] == [1])  # rank 0 watches rank 1; its main thread "blocked": it ends it
    assert re.match(r"rank 1 \(\S+, pid \d+\) stopped responding: no heartbeat for \d+ s", dogs[0].verdict())
    _until(lambda: exits[2] == [1])  # rank 2 hears it from the shared verdict
    assert dogs[2].verdict() == dogs[0].verdict()
    for d in dogs:
        d.close()


def test_watchdog_passes_on_a_rank_s_own_error_and_ignores_finished_ranks():
    master, dogs, exits = _watchdogs(2, timeout_s=0.3)
    dogs[1].close()  # rank 1 finished: its silence is no loss
    time.sleep(0.6)
    assert dogs[0].verdict() is None and exits[0] == []
    dogs[0].close()
    master, dogs, exits = _watchdogs(2, timeout_s=30)
    dogs[0].failed(CheckpointError("no checkpoint at /x"))  # rank 0 leaves with an error of its own
    assert dogs[1].explain(wait_s=5) == f"rank 0 ({dogs[0].me['host']}, pid {os.getpid()}) failed: CheckpointError: no checkpoint at /x"
    assert exits == {0: [], 1: []}  # both main threads handle their end themselves
    for d in dogs:
        d.close()


def test_process_gone():
    child = subprocess.Popen(["sleep", "30"])
    assert not process_gone(child.pid)
    child.kill()
    _until(lambda: process_gone(child.pid))  # a zombie until waited for: gone already
    child.wait()
    assert process_gone(child.pid)


def test_a_checkpoint_of_another_model_is_a_checkpoint_error_naming_the_keys(setup):
    path, runs = setup
    _one_process(path, "small", 2)
    with pytest.raises(CheckpointError, match=r"does not fit this config's model .* it was written with model.deep_mlp.sizes: "
                                              r"checkpoint: \[8\], this config: \[16\]; resume or init_from it with the model"):
        train(load(path, ["train.run_name=small", f"train.resume={runs / 'small'}", "train.max_steps=4",
                          "model.deep_mlp=[16]"]))
    assert checkpoint_state(runs / "small")["step"] == 2  # the checkpoint is untouched
