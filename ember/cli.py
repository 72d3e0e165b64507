"""Command line: ``ember train|eval|predict|export|generate|towers|serve|profile|plan``, driven by a YAML run config.

Every command takes ``--config run.yaml`` (where it needs one) and ``key.path=value`` overrides,
before, after or between the flags, e.g.
``ember train --config configs/demo.yaml train.epochs=2 data.batch_size=1024``.

A mistake in the input (config, override, path, flag) ends with ``ember <command>: error: ...``
and exit status 2, without a traceback; a system failure (disk, memory) with exit status 1; an
error ember did not expect is reported as an internal error with its traceback, exit status 3.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

__all__ = ["main"]

_OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")  # key.path=value


def _config(args: argparse.Namespace):
    from ember.config import load

    return load(args.config, args.overrides)


def cmd_train(args: argparse.Namespace) -> int:
    from ember.outputs import check_apart, check_in_run, claim_output
    from ember.train.loop import run_directory, train

    cfg = _config(args)
    if args.export:  # checked now, not after hours of training; inside the run is fine (runs/x/export)
        for used in [run_directory(cfg), *(p for p in (cfg.train.resume, cfg.train.init_from) if p is not None)]:
            check_apart(args.export, used, "--export", inside_ok=True)
        check_in_run(args.export, run_directory(cfg), "--export")
        claim_output(args.export, "export", "--export", args.overwrite)
    result = train(cfg, overwrite=args.overwrite)
    if result.parts is not None and not result.parts.lead:
        return 0  # a distributed run: rank 0 reports
    print(f"run directory: {result.run_dir}")
    print(f"steps: {result.step}")
    for k, v in result.metrics.items():
        print(f"eval {k}: {_metric(k, v)}")
    es = next((r for r in reversed(result.history) if r.get("kind") == "early_stopping"), None)
    if es is not None:
        where = f"stopped early at step {es['stopped_step']}" if es["stopped_early"] else "ran to the end"
        best = f"{es['best']:.4f}" if es["best"] is not None else "none"
        print(f"early stopping: {where}; best {es['metric']} {best} at step {es['best_step']}"
              + (f" ({es['best_checkpoint']}{', restored' if es['restored_best'] else ''})" if es["best_checkpoint"] else ""))
    if result.bad_rows:
        print("skipped bad rows: " + ", ".join(f"{k}: {v}" for k, v in result.bad_rows.items()))
    if args.export:
        parts = result.parts
        assert parts is not None
        with _scratch() as scratch:
            if parts.dist is not None:  # rank 0 holds its shard only: export every rank's rows, from the final checkpoint
                parts = _load_checkpoint(_private_disk(cfg, scratch, "train"), *_verified(str(result.run_dir)))
            print(f"exported to {_export(parts, cfg, args.export)}")
    return 0


def _metric(key: str, value: float) -> str:
    """A metric as printed: counts whole, an undefined AUC said so (the warning above says why)."""
    if key in ("rows", "skipped_rows") or key.startswith(("rows/", "gauc_groups_skipped/")):
        return f"{value:.0f}"
    if math.isnan(value):
        return "nan (undefined: the eval labels hold one class)" if key.startswith("auc/") else \
            "nan (undefined: see the warning above)"
    return f"{value:.4f}"


def _export(parts, cfg, out_dir: str, onnx: bool = False) -> Path:
    """Export a run's trained parts (``Components``) with its ``RunConfig`` for serving; ``onnx``:
    with the dense model as an ONNX graph too (``ember export --format onnx``)."""
    from ember.checkpoint.export import export_model

    return export_model(
        parts.model, parts.collections(), parts.embeddings.features,
        parts.linear.features if parts.linear is not None else None,
        parts.task_names, cfg.model_dump(mode="json", by_alias=True), out_dir, onnx=onnx,
    )


_PRUNED_RETRIES = 3  # a run saving every few seconds could prune each newest checkpoint in turn


def _restore(args: argparse.Namespace, scratch: Path | None = None):
    """Config (from the checkpoint unless --config is given), parts loaded from a checkpoint, and
    which checkpoint that was: ``{"checkpoint": path, "step": step}``.

    Reading writes nothing under the training run's paths: the disk tiers the tables need go to
    ``scratch`` (a private temporary directory; None: one removed at exit), not to the run's
    ``storage.disk_path``, which a running training run is using. A checkpoint that a training
    run still running prunes (``checkpoint.keep``) while it is read: read through a run
    directory, the newest checkpoint is read instead, said in one line; named itself, an error."""
    from ember.checkpoint.load import resolve_checkpoint
    from ember.errors import CheckpointError

    command = getattr(args, "command", None) or "ember"
    scratch = scratch if scratch is not None else _scratch_at_exit()
    for attempt in range(_PRUNED_RETRIES + 1):
        ckpt = resolve_checkpoint(args.checkpoint)
        try:
            ckpt, manifest = _verified(str(ckpt))
            cfg = _restored_config(args, manifest)
            parts = _load_checkpoint(_private_disk(cfg, scratch / str(attempt), command), ckpt, manifest)
            return cfg, parts, {"checkpoint": str(ckpt), "step": int(manifest["step"])}
        except (OSError, CheckpointError) as e:
            if (ckpt / "manifest.json").exists():
                raise  # not pruned: damaged, unreadable
            if ckpt.resolve() == Path(args.checkpoint).resolve():
                raise CheckpointError(f"checkpoint {ckpt} was removed while being read (a training run still running "
                                      "prunes old checkpoints, checkpoint.keep); give its run directory to read "
                                      "the newest checkpoint, or copy the checkpoint elsewhere first") from e
            if attempt == _PRUNED_RETRIES:
                raise CheckpointError(f"{args.checkpoint}: {attempt + 1} checkpoints in a row were removed while being "
                                      "read (a training run still running prunes them); copy one elsewhere first") from e
            print(f"ember {command}: checkpoint {ckpt} was removed while being read (pruned by the training run); "
                  "reading the newest checkpoint instead", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


def _restored_config(args: argparse.Namespace, manifest: dict):
    """The run config of a restore: --config with the overrides, else the checkpoint's own."""
    from ember.config import apply_overrides, from_dict, load
    from ember.featurize.schema import as_recorded

    if args.config:
        return load(args.config, args.overrides)
    recorded = manifest["config"]
    recorded = {**recorded, "schema": as_recorded(recorded["schema"])} if recorded.get("schema") else recorded
    return from_dict(apply_overrides(recorded, args.overrides))


def _scratch_at_exit() -> Path:
    """A private temporary directory, removed when the process exits."""
    import atexit
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="ember-read-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def _private_disk(cfg, scratch: Path, command: str):
    """``cfg`` with every disk tier under ``scratch``: a command that only reads a checkpoint
    never writes where the training run keeps (and may still be using) its disk tiers. Says so
    in one line (stderr), instead of the storage plan of each table that training prints."""
    def moved(storage):
        return storage.model_copy(update={"disk_path": str(scratch)}) if storage.disk_path is not None else storage

    tiered = [t.name for t in cfg.table_configs() if t.storage.disk_path is not None]
    if not tiered:
        return cfg
    print(f"ember {command}: the disk tiers of {len(tiered)} table(s) go to a private temporary directory {scratch} "
          "(removed at exit; TMPDIR places it), not the training run's storage.disk_path", file=sys.stderr, flush=True)
    emb = cfg.embedding.model_copy(update={"storage": moved(cfg.embedding.storage)})
    tables = [t.model_copy(update={"storage": moved(t.storage)}) for t in cfg.tables]
    return cfg.model_copy(update={"embedding": emb, "tables": tables})


def _reading(checkpoint: str) -> list[Path]:
    """What an export of ``checkpoint`` reads: the path given, the checkpoint it names, and that
    checkpoint's run directory (an output there would replace the run)."""
    from ember.checkpoint.load import resolve_checkpoint

    ckpt = resolve_checkpoint(checkpoint)
    return [Path(checkpoint), ckpt, *([ckpt.parent.parent] if ckpt.parent.name == "checkpoints" else [])]


@contextmanager
def _scratch() -> Iterator[Path]:
    """A private temporary directory for the command's disk tiers, removed when it ends."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ember-read-") as d:
        yield Path(d)


def _verified(path: str) -> tuple[Path, dict]:
    """The checkpoint at ``path`` (or its run's latest) and its verified manifest."""
    from ember.checkpoint.load import resolve_checkpoint, verify_checkpoint

    ckpt = resolve_checkpoint(path)
    return ckpt, verify_checkpoint(ckpt)


def _load_checkpoint(cfg, ckpt: Path, manifest: dict):
    """This process's parts (``Components``) for ``cfg`` holding every row of ``ckpt``, all its
    parts (whatever world size saved it), and its dense model (``ember.train.checkpointer.restore``)."""
    from ember.errors import CapacityError
    from ember.train.builder import build_components
    from ember.train.checkpointer import restore

    try:
        parts = build_components(cfg, announce=False)
    except CapacityError as e:
        e.add_note("(a command reading a checkpoint keeps disk tiers in a private temporary directory: set TMPDIR "
                   "to a larger volume)")
        raise
    restore(parts, ckpt, exact=False, cfg=cfg, manifest=manifest)  # weights, every row, table counters
    return parts


def cmd_eval(args: argparse.Namespace) -> int:
    with _scratch() as scratch:
        return _eval(args, scratch)


def _eval(args: argparse.Namespace, scratch: Path) -> int:
    from ember.pipeline.loader import make_batches
    from ember.train.evaluate import evaluate
    from ember.train.metrics import json_safe

    cfg, parts, source = _restore(args, scratch)
    print(f"ember eval: scoring checkpoint {source['checkpoint']} (step {source['step']})", file=sys.stderr, flush=True)
    batches = make_batches(cfg.data, cfg.schema, "eval")
    metrics = evaluate(parts, batches)
    if batches.bad_rows.total:
        print(f"ember eval: {batches.bad_rows} (left out of the metrics)", file=sys.stderr)
    print(json.dumps(json_safe({**source, **metrics}), indent=1))  # the checkpoint scored, then its metrics; an undefined AUC is null
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from ember.outputs import claim_output

    onnx = getattr(args, "format", "ember") == "onnx"
    if onnx:  # a missing package is said before the checkpoint is read
        from ember.checkpoint.onnx import require_onnx

        require_onnx()
    claim_output(args.out, "export", "--out", args.overwrite, _reading(args.checkpoint))  # before the work
    with _scratch() as scratch:
        cfg, parts, source = _restore(args, scratch)
        print(f"exported checkpoint {source['checkpoint']} (step {source['step']}) to "
              f"{_export(parts, cfg, args.out, onnx=onnx)}" + (" (with model.onnx)" if onnx else ""))
    return 0


def cmd_towers(args: argparse.Namespace) -> int:
    from ember.errors import ConfigError

    if args.towers < 1:
        raise ConfigError(f"--towers must be >= 1, got {args.towers}")
    if args.rows < 1:
        raise ConfigError(f"--rows must be >= 1, got {args.rows}")
    if args.out:
        from ember.outputs import claim_output

        claim_output(args.out, "towers", "--out", args.overwrite, _reading(args.checkpoint))
    with _scratch() as scratch:
        return _towers(args, scratch)


def _towers(args: argparse.Namespace, scratch: Path) -> int:
    from ember.errors import ConfigError, WriteError
    from ember.fileio import write_bytes_atomic
    from ember.pipeline.loader import make_batches
    from ember.train.towers import propose_towers

    cfg, parts, source = _restore(args, scratch)
    if cfg.model.type == "lr":  # its dim-D tables are built but never trained: their dots would be noise
        raise ConfigError(f"checkpoint {source['checkpoint']} is of an lr model, whose features have no "
                          "trained embeddings to interact; propose towers from a model with interactions (dlrm, dcn, "
                          "deepfm, wdl, ...)")
    n = len(parts.embeddings.features)
    if args.towers > n:
        raise ConfigError(f"--towers {args.towers}: the model has {n} sparse features; ask for at most {n}")
    split = "eval" if cfg.data.holds("eval") else "train"
    proposal = propose_towers(parts, make_batches(cfg.data, cfg.schema, split), args.towers, args.rows)
    print(f"ember towers: {args.towers} towers for {n} features from checkpoint {source['checkpoint']} "
          f"({proposal.rows} {split} rows); {proposal.inside_share:.1%} of the interaction strength stays inside "
          "towers", file=sys.stderr)
    snippet = proposal.snippet()
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(Path(args.out), snippet.encode(), WriteError)
        print(f"ember towers: wrote {args.out}", file=sys.stderr)
    print(snippet, end="")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from ember.errors import ConfigError
    from ember.serving.server import serve

    if args.port < 0 or args.port > 65535:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    if not (math.isfinite(args.poll_s) and args.poll_s > 0):
        raise ConfigError(f"--poll-s {args.poll_s}: give the seconds between checks for a new export, a finite "
                          "number > 0 (e.g. 2)")
    if args.max_body_bytes < 1:
        raise ConfigError(f"--max-body-bytes {args.max_body_bytes}: give the largest request body in bytes, >= 1")
    if args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    import torch

    torch.set_num_threads(args.threads)  # per request; requests themselves run concurrently on a thread pool

    def ready(host: str, port: int) -> None:  # once the export is open and the port bound
        print(f"ember serve: serving {args.export} on http://{host}:{port} (POST /score, GET /health)",
              file=sys.stderr, flush=True)

    serve(args.export, args.host, args.port, args.poll_s, args.max_body_bytes, on_ready=ready,
          trust_torchscript=args.trust_torchscript)
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from ember.serving import Predictor
    from ember.serving.predictions import csv_bytes, write_predictions

    from ember.config import apply_overrides
    from ember.errors import ConfigError

    # `--input a.csv data.x=1` hands the override to --input (nargs="+"): take such items back
    inputs = [i for i in args.input if not (_OVERRIDE.match(i) and not Path(i).exists())]
    overrides = apply_overrides({}, [*args.overrides, *(i for i in args.input if i not in inputs)])
    if set(overrides) - {"data"}:
        raise ConfigError(f"predict: overrides {sorted(set(overrides) - {'data'})} are not data.* keys; predict takes "
                          "data.* overrides only (e.g. data.batch_size=1024 data.csv.delimiter=';')")
    if args.output and Path(args.output).is_dir():
        raise ConfigError(f"--output {args.output} is a directory; give a file path for the CSV")
    if args.output:  # before the scoring: format from the extension, and never over what ember did not write
        from ember.outputs import claim_output, output_format

        fmt, compression = output_format(args.output, None, ("csv", "tsv", "parquet"), "--output")
        claim_output(args.output, "predictions", "--output", args.overwrite, [args.export, *inputs])
    keep = [c.strip() for c in (args.keep or "").split(",") if c.strip()]
    if args.keep is not None and not keep:
        raise ConfigError("--keep takes input column names separated by commas (e.g. --keep id,country); got none")
    p = Predictor.load(args.export, trust_torchscript=args.trust_torchscript)
    table = p.predict_table(inputs, keep, format=args.format, **overrides.get("data", {}))
    if p.bad_rows is not None and p.bad_rows.total:  # only with data.on_bad_rows=skip given here
        print(f"ember predict: {p.bad_rows}; the output has {p.bad_rows.total} line(s) fewer than the input has "
              "rows (predict with data.on_bad_rows=error to find them)", file=sys.stderr)
    if args.output:
        write_predictions(args.output, table, fmt, compression)
        print(f"wrote {table.num_rows} predictions to {args.output}")
    else:  # CSV on stdout, a block of rows at a time
        step = 1 << 14
        for start in range(0, max(table.num_rows, 1), step):
            sys.stdout.write(csv_bytes(table.slice(start, step), ",", header=start == 0).decode())
        sys.stdout.flush()
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from ember.errors import ConfigError
    from ember.outputs import claim_output
    from ember.source.files import expand_paths
    from ember.train.profile import describe, profile_data, write_profile

    if args.top < 1:
        raise ConfigError(f"--top must be >= 1, got {args.top}")
    cfg = _config(args)
    out = args.out or str(Path("profiles") / Path(args.config).stem)
    data = expand_paths(cfg.data.paths("train"), cfg.data.format, cfg.data.storage_options, "data.train") \
        if cfg.data.format not in ("synthetic", "sql", "iceberg") and cfg.data.paths("train") else []
    claim_output(out, "profile", "--out", args.overwrite, [args.config, *data])  # before the reading
    profile = profile_data(cfg, args.rows, top=args.top, config_path=args.config)
    print(describe(profile))
    paths = write_profile(profile, out)
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from ember.errors import ConfigError
    from ember.train.capacity import plan_capacity

    if not 1 <= args.world_size <= MAX_PLAN_RANKS:  # (the plan prints a line per rank: 10^8 ran out of memory)
        raise ConfigError(f"--world-size must be in 1..{MAX_PLAN_RANKS}, got {args.world_size}")
    if args.nodes < 1 or args.world_size % args.nodes:
        raise ConfigError(f"--nodes {args.nodes} must be >= 1 and divide --world-size {args.world_size}")
    if args.profile is not None and args.rows is not None:
        raise ConfigError("give --profile (a profile written earlier) or --rows N (profile N rows now), not both")
    cfg = _config(args)
    profile, source = None, "from the config alone: give --profile or --rows N to count the data's IDs"
    if args.profile is not None:
        from ember.train.profile import read_profile

        profile, source = read_profile(args.profile), f"from the profile {args.profile}"
    elif args.rows is not None:
        from ember.train.profile import profile_data

        profile = profile_data(cfg, args.rows)
        source = f"from the first {profile['data']['rows_read']:,} rows of data.train"
    plan = plan_capacity(cfg, args.world_size, profile, source, args.world_size // args.nodes)
    print(plan.describe())
    if cfg.distributed.placement == "towers":
        from ember.train.builder import tower_plan

        _, tower_node = tower_plan(cfg, cfg.table_configs(), args.world_size, args.world_size // args.nodes)
        print(f"  tower placement over {args.nodes} node(s): tower k on node {tower_node} (towers in model order)")
        return 0
    if cfg.distributed.placement == "embedding_ranks":
        from ember.distributed.embedding_ranks import describe_ranks

        print(describe_ranks(args.world_size, cfg.distributed.embedding_ranks))
    print("  (the dim-1 first-order tables of deepfm, wdl and lr are placed like the table they belong to)")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from ember.errors import ConfigError, WriteError
    from ember.fileio import atomic_file
    from ember.outputs import claim_output, mark_file, output_format
    from ember.pipeline.loader import write_synthetic
    from ember.source.config import SyntheticOptions

    if args.rows <= 0:
        raise ConfigError(f"--rows must be a positive number of rows, got {args.rows}")
    try:
        given = json.loads(args.options) if args.options else {}
    except json.JSONDecodeError as e:
        raise ConfigError(f"--options is not valid JSON ({e}); give an object, e.g. '{{\"vocab_size\": 1000}}'") from None
    if not isinstance(given, dict):
        raise ConfigError(f"--options must be a JSON object of synthetic options, got {type(given).__name__} {args.options}")
    if "seed" in given:
        raise ConfigError("--options: give the seed with --seed, not in --options")
    if not 0 <= args.seed < 2**63:  # (checked here so the message names the flag, not an --options key)
        raise ConfigError(f"--seed {args.seed}: give a whole number in [0, 2**63)")
    opts = SyntheticOptions.parse({**given, "seed": args.seed}, where="--options")
    if Path(args.out).is_dir():
        raise ConfigError(f"--out {args.out} is a directory; give the file to write, e.g. {Path(args.out) / 'train.parquet'}")
    fmt, compression = output_format(args.out, args.format, ("csv", "tsv", "parquet", "orc"), "--out", "--format")
    claim_output(args.out, "generate", "--out", args.overwrite)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(args.out, WriteError) as tmp:  # an --overwrite that fails keeps the old file
        write_synthetic(str(tmp), fmt, args.rows, opts, split=args.split, compression=compression)  # type: ignore[arg-type]
    if fmt != "parquet":  # (a Parquet file holds its own mark)
        mark_file(args.out, "generate")
    print(f"wrote {args.rows} rows to {[args.out]}")
    return 0


_DESCRIPTION = "Train, evaluate, export and serve sparse recommendation models, driven by a YAML run config."
_EPILOG = """\
Commands that read a run config take --config run.yaml and key.path=value overrides, before,
after or between the flags, e.g.
  ember train --config configs/demo.yaml train.epochs=2 data.batch_size=1024
'ember COMMAND --help' lists a command's flags.

Exit status: 0 done; 1 the system failed (disk, memory, a lost rank); 2 a problem with the
input (config, paths, flags); 3 a bug in ember (reported with its traceback); 128+N a signal."""


# One example per command, shown at the end of its --help.
_EXAMPLES = {
    "train": "ember train --config configs/demo.yaml --export runs/demo/export train.epochs=2",
    "eval": "ember eval --checkpoint runs/demo",
    "export": "ember export --checkpoint runs/demo --out exports/demo\n"
              "  ember export --checkpoint runs/demo --out exports/demo-onnx --format onnx",
    "towers": "ember towers --checkpoint runs/demo --towers 4 --out towers.yaml",
    "serve": "ember serve --export runs/demo/export --port 8000\n"
             "  curl -s localhost:8000/score -d '{\"rows\": [{\"C1\": \"a\", \"I1\": 3}]}'",
    "predict": "ember predict --export runs/demo/export --input new_rows.csv --output scores.csv",
    "profile": "ember profile --config configs/criteo.yaml --rows 100000 --out profiles/criteo",
    "plan": "ember plan --config configs/criteo.yaml --world-size 4 --profile profiles/criteo/profile.json",
    "generate": "ember generate --out data/train.parquet --rows 1000000 --options '{\"vocab_size\": 1000000}'",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ember", description=_DESCRIPTION, epilog=_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"ember {_version()}")
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, helptext: str) -> argparse.ArgumentParser:
        """A command's parser: its one-line help is also its description, its example the epilog."""
        return sub.add_parser(name, help=helptext, description=helptext[0].upper() + helptext[1:] + ".",
                              epilog="Example:\n  " + _EXAMPLES[name],
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    t = command("train", "train a model (resume with train.resume=DIR, finetune with train.init_from=DIR)")
    t.add_argument("--config", required=True, help="the run config (YAML)")
    t.add_argument("--export", help="also export the final model to this directory")
    t.add_argument("--overwrite", action="store_true",
                   help="replace an earlier run of the same train.run_name, and an earlier export at --export (else "
                   "refused; train.resume continues a run)")
    t.add_argument("overrides", nargs="*", help="config overrides, key.path=value (the value is read as YAML)")
    t.set_defaults(fn=cmd_train, parser=t)

    for name, fn, helptext in [("eval", cmd_eval, "AUC and logloss of a checkpoint on the eval data"),
                               ("export", cmd_export, "export a checkpoint for serving")]:
        e = command(name, helptext)
        e.add_argument("--checkpoint", required=True, help="checkpoint or run directory")
        e.add_argument("--config", help="run config (default: the one stored in the checkpoint)")
        if name == "export":
            e.add_argument("--out", required=True, help="directory to write the export to (a new path)")
            e.add_argument("--overwrite", action="store_true", help="replace an earlier export at --out (nothing else)")
            e.add_argument("--format", choices=("ember", "onnx"), default="ember",
                           help="ember: ember's own export (ember predict, ember serve); onnx: the same plus the dense "
                                "model as a standard ONNX graph (model.onnx) for ember.portable and inference servers "
                                "(needs pip install 'ember[portable]')")
        e.add_argument("overrides", nargs="*", help="config overrides, key.path=value (e.g. data.eval=dev.csv)")
        e.set_defaults(fn=fn, parser=e)

    tw = command("towers", "propose DMT towers from a trained model's embedding interactions")
    tw.add_argument("--checkpoint", required=True, help="checkpoint or run directory")
    tw.add_argument("--towers", type=int, required=True, help="K, the number of towers")
    tw.add_argument("--rows", type=int, default=20_000, help="sample rows to measure interactions on (eval data)")
    tw.add_argument("--out", help="also write the config snippet to this YAML file")
    tw.add_argument("--overwrite", action="store_true", help="replace a snippet written earlier at --out (nothing else)")
    tw.add_argument("--config", help="run config (default: the one stored in the checkpoint)")
    tw.add_argument("overrides", nargs="*", help="config overrides, key.path=value")
    tw.set_defaults(fn=cmd_towers, parser=tw)

    sv = command("serve", "score JSON rows over HTTP, following the export as it is replaced")
    sv.add_argument("--export", required=True, help="export directory (re-read whenever its manifest changes), or a "
                    "run's exports/ directory of full and delta exports (follow mode: each new delta is applied)")
    sv.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one and prints it)")
    sv.add_argument("--trust-torchscript", action="store_true", help="load an export whose dense model only its TorchScript model.pt gives (one written before format 5, or "
                    "of a model of your own): TorchScript is a program, so only for exports from a source you trust")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    sv.add_argument("--poll-s", type=float, default=2.0, help="seconds between checks for a new export")
    sv.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger requests get 413")
    sv.add_argument("--threads", type=int, default=1, help="torch threads per request (small requests: 1 is fastest; "
                    "concurrent requests run on their own threads)")
    sv.set_defaults(fn=cmd_serve, parser=sv)

    pr = command("predict", "score raw rows with an exported model")
    pr.add_argument("--export", required=True, help="export directory")
    pr.add_argument("--input", nargs="+", required=True, help="files in the export's data format")
    pr.add_argument("--trust-torchscript", action="store_true", help="load an export whose dense model only its TorchScript model.pt gives (one written before format 5, or "
                    "of a model of your own): TorchScript is a program, so only for exports from a source you trust")
    pr.add_argument("--output", help="file for the probabilities, its format from the extension: .csv (.gz, .bz2, "
                    ".zst), .tsv, .parquet (default: CSV on stdout)")
    pr.add_argument("--overwrite", action="store_true", help="replace earlier predictions at --output (nothing else)")
    pr.add_argument("--keep", metavar="COLS", help="input columns to copy into the output beside the p_<task> "
                    "columns, comma-separated (e.g. --keep id,country: a key to join the scores back on)")
    pr.add_argument("--format", choices=["csv", "tsv", "parquet", "orc"],
                    help="format of the input files (default: from their extensions; other extensions need this)")
    pr.add_argument("overrides", nargs="*", help="data.key.path=value, e.g. data.csv.delimiter=';'")
    pr.set_defaults(fn=cmd_predict, parser=pr)

    pf = command("profile", "profile the training data as training reads it: labels, features, bad rows")
    pf.add_argument("--config", required=True, help="the run config (YAML): its data.train, schema and tables")
    pf.add_argument("--rows", type=int, help="read only the first N rows of data.train (default: all)")
    pf.add_argument("--out", help="directory for profile.json, profile.txt and profile.png (default: "
                    "profiles/<config name>)")
    pf.add_argument("--overwrite", action="store_true", help="replace a profile written earlier at --out (nothing else)")
    pf.add_argument("--top", type=int, default=10, help="most frequent values listed per sparse feature (default 10)")
    pf.add_argument("overrides", nargs="*", help="config overrides, key.path=value")
    pf.set_defaults(fn=cmd_profile, parser=pf)

    pl = command("plan", "print each table's rows and bytes per tier and rank, the sharding, and the RAM / disk a run "
                 "needs (no training)")
    pl.add_argument("--config", required=True, help="the run config (YAML)")
    pl.add_argument("--profile", help="a data profile (profile.json or its directory, from ember profile) to take "
                    "each table's rows from")
    pl.add_argument("--rows", type=int, help="profile the first N rows of data.train now and take the rows from them")
    pl.add_argument("--world-size", type=int, required=True, help="number of ranks (torchrun processes in all)")
    pl.add_argument("--nodes", type=int, default=1, help="nodes (torchrun --nnodes) the ranks spread over, evenly: "
                    "what distributed.placement towers places the towers on (default 1)")
    pl.add_argument("overrides", nargs="*", help="config overrides, key.path=value")
    pl.set_defaults(fn=cmd_plan, parser=pl)

    g = command("generate", "write synthetic Criteo-shaped data to files")
    g.add_argument("--out", required=True, help="file to write, its format from the extension: .csv/.tsv (.gz, .bz2, "
                   ".zst), .parquet, .orc")
    g.add_argument("--format", choices=["csv", "tsv", "parquet", "orc"],
                   help="needed only for other extensions; must agree with a known one")
    g.add_argument("--overwrite", action="store_true", help="replace data generated earlier at --out (nothing else)")
    g.add_argument("--rows", type=int, default=100_000, help="rows to write (default 100000)")
    g.add_argument("--split", choices=["train", "eval"], default="train",
                   help="which split of the generator to write (default train)")
    g.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    g.add_argument("--options", help='synthetic options as JSON, e.g. \'{"vocab_size": 1000000}\'')
    g.set_defaults(fn=cmd_generate, parser=g)
    return p


def main(argv: list[str] | None = None) -> int:
    """The command line; run as the process's own command (``argv`` None), it first re-runs itself
    with the allocator tunables large batches need (``ember.allocator``). Returns the exit status:
    0 done, 1 a system failure, 2 a problem with the input, 3 a bug in ember, 128+N a signal."""
    if argv is None:
        from ember.allocator import reexec_tuned

        reexec_tuned(["-m", "ember", *sys.argv[1:]])
        _stop_cleanly_on_sigterm()
    try:
        args = _parse(build_parser(), argv)
    except SystemExit as e:  # --help, --version, or a flag error argparse has printed
        return e.code if isinstance(e.code, int) else int(e.code is not None)
    from ember.errors import EmberError, RunInterrupted

    _show_ember_logs()
    _stacks_on_sigusr1()

    try:
        _check_inputs(args)
        return int(args.fn(args))
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # another pipe than stdout's: a real failure
        return 141  # as a process SIGPIPE ended
    except RunInterrupted as e:
        print(f"ember {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except EmberError as e:
        print(f"ember {args.command}: error: {_with_notes(e)}", file=sys.stderr)
        return int(getattr(e, "exit_code", 2))  # 2: bad input; RankLost: 1
    except KeyboardInterrupt as e:  # (train saves and raises RunInterrupted; the other commands just stop)
        signum = e.signum if isinstance(e, _Terminated) else 2
        print(f"ember {args.command}: interrupted" + (f" ({signal.Signals(signum).name})" if signum != 2 else ""),
              file=sys.stderr)
        return 128 + signum
    except Exception as e:
        if any("ember pipeline stage" in n for n in getattr(e, "__notes__", [])) or isinstance(e, (OSError, MemoryError)):
            # the system failed (disk full, out of memory, a kernel error in a pipeline stage): named, no traceback
            print(f"ember {args.command}: error: {type(e).__name__}: {_with_notes(e)}", file=sys.stderr)
            return 1
        import traceback

        traceback.print_exc()
        print(f"ember {args.command}: internal error (a bug in ember, please report it with the traceback above): "
              f"{type(e).__name__}: {_with_notes(e)}", file=sys.stderr)
        return 3


MAX_PLAN_RANKS = 65536  # ember plan --world-size: far past any cluster a run spans


class _Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the command is, as Ctrl-C is: its half-written outputs
    (an atomic write's temporary file) are removed on the way out, not left behind."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop_cleanly_on_sigterm() -> None:
    """SIGTERM and SIGHUP end a command as SIGINT does (clean-up, then exit 128 + N). A training
    run installs its own handlers while it trains (it checkpoints first: ember.train.agreement)."""
    def stop(signum: int, frame: object) -> None:
        raise _Terminated(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Flags and ``key=value`` overrides in any order: argparse gives a command's trailing
    positionals only the first run of them, so later overrides come back unparsed and join
    ``overrides`` here, in order; an unknown flag (or an override given to a command that takes
    none) is the command's usage error."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        flags = [a for a in extra if a.startswith("-")]
        if flags or not hasattr(args, "overrides"):
            args.parser.error(f"unrecognized arguments: {' '.join(flags or extra)}")
        args.overrides = [*args.overrides, *extra]
    return args


def _version() -> str:
    """The installed distribution's version, else the package's own (a source checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ember")
    except PackageNotFoundError:  # the package's own attribute (its facade, a layer above: read, not imported)
        return str(sys.modules["ember"].__version__)


def _check_inputs(args: argparse.Namespace) -> None:
    """The paths a command reads exist and hold what it reads: a checkpoint for --checkpoint, an
    export for --export, files for --input; else a ConfigError saying what was given and what
    the command expects."""
    from ember.errors import ConfigError

    given = getattr(args, "checkpoint", None)
    if given is not None:
        path, kind = Path(given), _holds(Path(given))
        if kind == "missing":
            raise ConfigError(f"--checkpoint {given} does not exist; give a run directory (train.out_dir/train.run_name, "
                              "whose latest checkpoint is read) or one checkpoint (<run>/checkpoints/step-N)")
        if kind in ("export", "export series"):
            raise ConfigError(f"--checkpoint {given} is {_A[kind]}, not a checkpoint; ember {args.command} reads a "
                              "training checkpoint or run directory (train.out_dir/train.run_name)"
                              + (f", e.g. {path.parent}" if _holds(path.parent) == "run" else "")
                              + (f"; to score rows with an export use ember predict --export {given}" if kind == "export" else ""))
    given = getattr(args, "export", None) if args.command in ("predict", "serve") else None
    if given is not None:
        path, kind = Path(given), _holds(Path(given))
        if kind == "missing":
            raise ConfigError(f"--export {given} does not exist; give an export directory, written by ember export --out "
                              "DIR or ember train --export DIR" + (" (or a run's exports/ series)" if args.command == "serve" else ""))
        if kind in ("run", "checkpoint"):
            series = path / "exports" if kind == "run" and _holds(path / "exports") == "export series" else None
            raise ConfigError(f"--export {given} is {_A[kind]}, not an export; export it first (ember export --checkpoint "
                              f"{given} --out DIR) and give --export DIR"
                              + (f", or serve the exports this run wrote while training: --export {series}" if series and
                                 args.command == "serve" else ""))
        if kind == "export series" and args.command == "predict":
            full = sorted(path.glob("*-full"))
            raise ConfigError(f"--export {given} is {_A[kind]}; ember predict reads one export: give one of its full "
                              f"exports, e.g. --export {full[-1]}")
    for item in getattr(args, "input", None) or []:
        if "://" in item:  # a URI (s3://...): listed, and a missing bucket or object named, when read
            continue
        if not Path(item).exists() and not _OVERRIDE.match(item) and not any(c in item for c in "*?["):
            raise ConfigError(f"--input {item} does not exist; give files (or directories, or glob patterns) of rows "
                              "to score")


_A = {"export": "an export (written by ember export or train --export)",
      "export series": "a run's export series (full and delta exports, for ember serve)",
      "run": "a training run directory", "checkpoint": "a training checkpoint"}


def _holds(path: Path) -> str:
    """What ``path`` holds, as far as its names and manifest tell: ``missing``, ``checkpoint``,
    ``run`` (a run or its checkpoints/ directory), ``export``, ``export series`` or ``other``."""
    from ember.outputs import manifest_kind

    if not path.exists():
        return "missing"
    kind = manifest_kind(path)
    if kind is not None:
        return kind
    if (path / "checkpoints").is_dir() or (path / "LATEST").is_file():
        return "run"
    if path.is_dir() and any(path.glob("*-full")):
        return "export series"
    return "other"


def _stdout_closed() -> bool:
    """Whether the reader of stdout went away (``ember predict ... | head``): then the command
    stops quietly, and later flushes go to /dev/null instead of failing again."""
    import os
    import select

    try:
        fd = sys.stdout.fileno()
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        if not any(events & select.POLLERR for _, events in poll.poll(0)):  # a pipe whose reader closed
            return False
        os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor (captured in process)
        return False
    return True


def _with_notes(e: BaseException) -> str:
    """The message and the notes added on its way up (e.g. the pipeline stage that raised it)."""
    return " ".join([str(e), *getattr(e, "__notes__", [])])


def _stacks_on_sigusr1() -> None:
    """``kill -USR1 <pid>`` prints every thread's Python stack to stderr and the command goes on:
    what a run that seems stuck is doing (the test launchers ask it of a rank before killing it)."""
    import faulthandler
    import signal

    if hasattr(signal, "SIGUSR1") and threading.current_thread() is threading.main_thread():
        try:
            faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
        except (ValueError, OSError, RuntimeError):  # no usable stderr (a closed or odd descriptor)
            pass


def _show_ember_logs() -> None:
    """ember's own informational lines (e.g. how tables were grouped) go to stderr, once: to
    whatever ``sys.stderr`` is when a line is logged (a caller that redirects or closes an
    earlier stderr, as notebooks and test runners do, never gets a logging error)."""
    import logging

    class _CurrentStderr(logging.StreamHandler):
        @property  # type: ignore[override]
        def stream(self):  # noqa: D102
            return sys.stderr

        @stream.setter
        def stream(self, value) -> None:  # StreamHandler.__init__ sets it; the property decides
            pass

    log = logging.getLogger("ember")
    if not log.handlers:
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("ember: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def run() -> None:
    """The ``ember`` command: ``main`` on this process's arguments, then the process ends with its
    status (``ember.process_exit``: no interpreter teardown for native threads to abort in)."""
    from ember.process_exit import end_process

    try:
        code = main()
    except KeyboardInterrupt:  # Ctrl-C in the first moments (loading, parsing), before main's own handling
        print("ember: interrupted", file=sys.stderr)
        code = 130
    end_process(code)


if __name__ == "__main__":
    run()
