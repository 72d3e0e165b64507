"""Data paths in object storage (``s3://``), against moto's S3 server on 127.0.0.1 over real
HTTP: listing follows the rules of local directories and globs, reads equal local reads and
are streamed, a watched prefix hands out objects as they arrive, and a missing bucket, a
missing object, a denied request and an unreachable endpoint each raise their own error."""

from __future__ import annotations

import gzip
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ember.errors import ConfigError, DataError
from ember.source import storage
from ember.source.csv import read_csv
from ember.source.files import expand_paths
from ember.source.parquet import read_parquet
from ember.source.storage import StorageOptions
from ember.source.watch import FileWatcher, WatchOptions, check_watched
from ember.testing.s3 import S3Server, server_or_skip


@pytest.fixture(scope="module")
def s3():
    yield from server_or_skip("bkt")


def _tree(root: Path) -> None:
    """Data files beside what tools leave there (markers, hidden parts, notes, _temporary)."""
    files = {
        "a.csv": "y,c\n1,x\n", "b.csv.gz": None, "sub/c.csv": "y,c\n0,z\n", "sub/deep/d.csv": "y,c\n1,w\n",
        "_SUCCESS": "", ".a.csv.crc": "x", "notes.txt": "hi", "_temporary/e.csv": "y,c\n1,q\n",
        ".hidden/f.csv": "y,c\n1,q\n", "README.md": "#",
    }
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(gzip.compress(b"y,c\n0,g\n") if text is None else text.encode())


@pytest.fixture(scope="module")
def tree(s3, tmp_path_factory) -> tuple[Path, str]:
    local = tmp_path_factory.mktemp("tree") / "t"
    _tree(local)
    return local, s3.upload(local, "bkt/tree")


@pytest.mark.parametrize("pattern", ["", "/", "/*.csv", "/**/*.csv", "/sub/*.csv", "/sub", "/a.csv", "/*.txt",
                                     "/_temporary/*.csv", "/.hidden/*.csv"])
def test_listing_follows_the_local_rules(s3, tree, pattern):
    """Directories (prefixes), globs and files give what the same local tree gives, as URIs, sorted."""
    local, uri = tree
    fmt = "csv"
    want = [f"{uri}/{Path(p).relative_to(local).as_posix()}" for p in expand_paths([f"{local}{pattern}"], fmt)]
    assert want, "the local pattern must match something"
    assert expand_paths([f"{uri}{pattern}"], fmt, StorageOptions(**s3.options())) == want


def test_reads_equal_local_reads(s3, tmp_path):
    """CSV (plain and .gz, decompressed by extension) and Parquet row groups read from S3 are the
    local reads: the same batches and the same row numbers."""
    rows = "y,c\n" + "".join(f"{i % 2},v{i}\n" for i in range(3000))
    (tmp_path / "r.csv").write_text(rows)
    (tmp_path / "r.csv.gz").write_bytes(gzip.compress(rows.encode()))
    pq.write_table(pa.table({"y": list(range(500)), "c": [f"v{i}" for i in range(500)]}), tmp_path / "r.parquet",
                   row_group_size=128)
    options = StorageOptions(**s3.options())
    for name in ("r.csv", "r.csv.gz"):
        uri = s3.upload(tmp_path / name, f"bkt/reads/{name}")
        remote = [(c.first_row, c.batch) for c in read_csv(uri, ["y", "c"], block_bytes=4096, storage_options=options)]
        local = [(c.first_row, c.batch) for c in read_csv(str(tmp_path / name), ["y", "c"], block_bytes=4096)]
        assert len(local) > 1 and remote == local
    uri = s3.upload(tmp_path / "r.parquet", "bkt/reads/r.parquet")
    remote = [(c.first_row, c.batch) for c in read_parquet(uri, ["c"], read_rows=100, storage_options=options)]
    assert remote == [(c.first_row, c.batch) for c in read_parquet(str(tmp_path / "r.parquet"), ["c"], read_rows=100)]


def test_a_large_object_is_streamed_not_downloaded_first(s3):
    """After the first block of an 8 MiB CSV object, only a few MiB of it were fetched."""
    line = b"1," + b"x" * 98 + b"\n"
    body = b"y,c\n" + line * (8 * 10486)
    s3.put("bkt/big/big.csv", body)
    consumed = [0]
    chunks = read_csv("s3://bkt/big/big.csv", ["y"], block_bytes=1 << 16, consumed=consumed,
                      storage_options=StorageOptions(**s3.options()))
    first = next(chunks)
    assert first.batch.num_rows > 0
    assert 0 < consumed[0] <= len(body) // 2, (consumed[0], len(body))
    assert sum(c.batch.num_rows for c in chunks) + first.batch.num_rows == 8 * 10486
    assert consumed[0] == len(body)


def test_missing_bucket_missing_object_and_empty_prefix_each_say_so(s3):
    options = StorageOptions(**s3.options())
    for path in ("s3://nobucket/train/", "s3://nobucket/train/*.csv", "s3://nobucket/a.csv"):
        with pytest.raises(ConfigError, match="bucket 'nobucket' does not exist at http://127.0.0.1"):
            expand_paths([path], "csv", options)
    with pytest.raises(ConfigError, match="'s3://bkt/nothing/a.csv': no such object .*in bucket 'bkt'"):
        expand_paths(["s3://bkt/nothing/a.csv"], "csv", options)
    with pytest.raises(ConfigError, match="'s3://bkt/tree/\\*.orc' matches no csv file"):
        expand_paths(["s3://bkt/tree/*.orc"], "csv", options)
    # an object gone after the listing: the read names it
    with pytest.raises(DataError, match="s3://bkt/gone.csv: no such object at http://127.0.0.1.*removed or renamed"):
        list(read_csv("s3://bkt/gone.csv", ["y"], storage_options=options))


def test_denied_requests_name_the_credentials(s3, tree):
    """moto checks signatures and IAM policies here: a user without a policy and a wrong secret
    are both denied, with a message naming the credentials and the permissions needed."""
    _, uri = tree
    with s3.authenticated():
        assert expand_paths([f"{uri}/a.csv"], "csv", StorageOptions(**s3.options())) == [f"{uri}/a.csv"]
        for options in (s3.options("nobody"), s3.options(secret_key="not-the-secret")):
            with pytest.raises(ConfigError, match="access denied while .*check the credentials .*s3:GetObject"):
                expand_paths([f"{uri}/a.csv"], "csv", StorageOptions(**options))
            with pytest.raises(ConfigError, match="access denied"):
                list(read_csv(f"{uri}/a.csv", ["y"], storage_options=StorageOptions(**options)))


def test_environment_variables_reach_the_server(s3, tree, monkeypatch):
    """No storage_options: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... are read when the filesystem is made."""
    _, uri = tree
    for k, v in s3.env().items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)
    assert expand_paths([f"{uri}/sub/*.csv"], "csv") == [f"{uri}/sub/c.csv"]


def test_a_transient_failure_is_retried_then_named(s3, tree):
    """An endpoint that is down: the listing is tried again after a pause; a server that comes up
    meanwhile answers it. One that stays down is named with what to check."""
    from moto.server import ThreadedMotoServer

    _, uri = tree
    late = S3Server().port  # a free port, nothing listening yet
    options = StorageOptions(**{**s3.options(), "endpoint_override": f"http://127.0.0.1:{late}", "retries": 1})
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=late, verbose=False)  # moto's state is shared: same buckets
    starter = threading.Timer(0.3, server.start)
    starter.start()
    try:
        t = time.time()
        assert expand_paths([f"{uri}/a.csv"], "csv", options) == [f"{uri}/a.csv"]
        assert time.time() - t >= storage._OP_PAUSE_S * 0.9  # it did fail first, and waited
    finally:
        starter.join()
        server.stop()
    down = StorageOptions(**{**s3.options(), "endpoint_override": f"http://127.0.0.1:{late}", "retries": 1})
    with pytest.raises(DataError, match=f"failed at http://127.0.0.1:{late} after 2 attempt.*endpoint is reachable"):
        expand_paths([f"{uri}/a.csv"], "csv", down)


def test_a_watched_prefix_hands_out_objects_as_they_arrive(s3):
    """Each poll lists the prefix: new objects in name order, each once; hidden and marker
    objects never; ``ready: marker`` waits for the directory's _SUCCESS."""
    options = StorageOptions(**s3.options())
    check_watched(["s3://bkt/incoming/"], options)  # an empty prefix of an existing bucket is fine
    with pytest.raises(ConfigError, match="bucket 'nobucket' does not exist"):
        check_watched(["s3://nobucket/incoming/"], options)
    w = FileWatcher(["s3://bkt/incoming/"], "csv", WatchOptions(settle_s=0, order="name"), storage_options=options)
    assert w.poll() == []
    s3.put("bkt/incoming/b.csv", b"y\n1\n")
    s3.put("bkt/incoming/a.csv", b"y\n1\n")
    s3.put("bkt/incoming/.c.csv", b"y\n1\n")
    s3.put("bkt/incoming/_temporary/d.csv", b"y\n1\n")
    assert w.poll() == ["s3://bkt/incoming/a.csv", "s3://bkt/incoming/b.csv"]
    s3.put("bkt/incoming/c.csv", b"y\n1\n")
    assert w.poll() == ["s3://bkt/incoming/c.csv"] and w.poll() == []
    marked = FileWatcher(["s3://bkt/parts/*/*.csv"], "csv", WatchOptions(ready="marker"), storage_options=options)
    s3.put("bkt/parts/d=1/x.csv", b"y\n1\n")
    assert marked.poll() == []
    s3.put("bkt/parts/d=1/_SUCCESS", b"")
    assert marked.poll() == ["s3://bkt/parts/d=1/x.csv"]


def test_a_scheme_only_fsspec_knows_goes_through_the_same_code():
    """``memory://`` (fsspec's in-memory filesystem; pyarrow has none): listed by the same rules,
    read as a stream; an unknown scheme is a ConfigError saying what to install."""
    fsspec = pytest.importorskip("fsspec", reason="fsspec is not installed")
    mem = fsspec.filesystem("memory")
    mem.pipe("/ember-test/d/b.csv", b"y,c\n0,z\n")
    mem.pipe("/ember-test/d/a.csv", b"y,c\n1,x\n")
    mem.pipe("/ember-test/d/_SUCCESS", b"")
    try:
        files = expand_paths(["memory://ember-test/d/"], "csv")
        assert files == expand_paths(["memory://ember-test/d/*.csv"], "csv") == \
            ["memory://ember-test/d/a.csv", "memory://ember-test/d/b.csv"]
        assert [c.batch.to_pydict() for f in files for c in read_csv(f, ["c"])] == [{"c": ["x"]}, {"c": ["z"]}]
    finally:
        mem.rm("/ember-test", recursive=True)
    with pytest.raises(ConfigError, match="neither pyarrow nor fsspec can open 'nosuchscheme://'"):
        expand_paths(["nosuchscheme://b/d/"], "csv")


@pytest.mark.parametrize("uri, path, listed, back", [
    # GCS's and Azure's paths start with the bucket / container, which the URI holds as its authority
    ("gs://some-bucket/d/x.csv", "some-bucket/d/x.csv", "some-bucket/d/y.csv", "gs://some-bucket/d/y.csv"),
    ("gs://some-bucket", "some-bucket", "some-bucket/y.csv", "gs://some-bucket/y.csv"),
    ("gcs://b/d/", "b/d", "b/d/y.csv", "gcs://b/d/y.csv"),
    ("abfs://box@acct.dfs.core.windows.net/d/x.csv", "box/d/x.csv", "box/d/y.csv",
     "abfs://box@acct.dfs.core.windows.net/d/y.csv"),
    ("abfs://box@acct.dfs.core.windows.net", "box", "box", "abfs://box@acct.dfs.core.windows.net"),
    ("abfs://acct.dfs.core.windows.net/box/x.csv", "/box/x.csv", "/box/y.csv", "abfs://acct.dfs.core.windows.net/box/y.csv"),
    ("s3://bkt/d/x.csv", "bkt/d/x.csv", "bkt/d/y.csv", "s3://bkt/d/y.csv"),
])
def test_a_uri_resolves_to_its_path_on_the_filesystem_and_back(uri, path, listed, back):
    """No request is sent: the path a URI names on its filesystem keeps the bucket (gs://
    once resolved to '/x.csv', so no gs:// path could be read), and a path a listing gives
    turns back into the URI."""
    options = StorageOptions(region="us-east-1")  # s3: no region lookup
    _, got, to_uri = storage.resolve(uri, options)
    assert got == path and to_uri(listed) == back


def test_gcs_without_credentials_says_how_to_give_them():
    """The GCS client's answer when it finds no credentials (no request sent) is named as such,
    not as an unreachable endpoint."""
    said = OSError("google::cloud::Status(UNAVAILABLE: Retry policy exhausted, with a last message of Could not "
                   "create a OAuth2 access token to authenticate the request.")
    e = storage.storage_error("gs://b/x.csv", "reading its information", said)
    assert isinstance(e, ConfigError) and str(e).startswith("gs://b/x.csv: no Google Cloud credentials to read it with")
    assert "GOOGLE_APPLICATION_CREDENTIALS" in str(e) and "anonymous: true" in str(e)


def test_hdfs_without_java_is_a_config_error_saying_what_it_needs(monkeypatch):
    """pyarrow's HDFS client needs a JVM and libhdfs; without them its error lists every
    libjvm path it tried (88 lines): one line says what to install and set instead."""
    from types import SimpleNamespace

    import pyarrow.fs as pafs

    tried = "\n".join(f"dlopen(/usr/lib/jvm/{i}/libjvm.so) failed: cannot open shared object file" for i in range(88))

    def no_jvm(uri):
        raise OSError("Unable to load libjvm\n" + tried)

    # pyarrow's types take no new attributes: storage sees a pyarrow.fs whose from_uri fails as without a JVM
    fake = SimpleNamespace(**{k: getattr(pafs, k) for k in dir(pafs) if not k.startswith("__")})
    fake.FileSystem = SimpleNamespace(from_uri=no_jvm)
    monkeypatch.setattr(storage, "pafs", fake)
    storage._filesystem.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"^data path hdfs://nn:8020/...: HDFS needs Java and libhdfs on this "
                                              r"machine \(Unable to load libjvm\); install a Java runtime and Hadoop, "
                                              r"set JAVA_HOME and HADOOP_HOME") as e:
            expand_paths(["hdfs://nn:8020/x.csv"], "csv")
        assert "dlopen" not in str(e.value) and "\n" not in str(e.value)
    finally:
        storage._filesystem.cache_clear()


def test_credentials_in_the_config_are_never_written_out(tmp_path):
    """A run records its config (config.yaml, checkpoints, exports): the storage credentials are
    null there, so no secret lands on disk; the config in memory keeps them."""
    import yaml

    from ember.config import from_dict, to_yaml

    raw = {"data": {"format": "csv", "train": "s3://b/train.csv", "storage_options": {
        "endpoint_override": "127.0.0.1:9", "scheme": "http", "access_key": "AKIA-ID", "secret_key": "s3cr3t",
        "session_token": "tok-9f3a"}}, "schema": {"labels": ["y"], "sparse": [{"name": "a"}]}, "model": {"type": "lr"}}
    cfg = from_dict(raw)
    assert (cfg.data.storage_options.access_key, cfg.data.storage_options.secret_key) == ("AKIA-ID", "s3cr3t")
    text = to_yaml(cfg)
    assert "s3cr3t" not in text and "AKIA-ID" not in text and "tok-9f3a" not in text
    recorded = yaml.safe_load(text)
    assert recorded["data"]["storage_options"]["endpoint_override"] == "127.0.0.1:9"
    again = from_dict(recorded)  # a recorded config loads: the credentials come from the environment then
    assert again.data.storage_options.secret_key is None
    assert "s3cr3t" not in cfg.model_dump_json()


def test_listed_objects_carry_their_sizes_without_a_request_each(monkeypatch):
    """``expand_sized`` (the ranks' file check, a CSV's byte count) takes each object's size from
    the prefix's or glob's listing: no HEAD per object, which on a bucket of thousands of objects
    was one request each on every rank. An object named alone is asked for its size."""
    fsspec = pytest.importorskip("fsspec", reason="fsspec is not installed")
    from ember.source import files as files_module
    from ember.source import storage

    mem = fsspec.filesystem("memory")
    mem.pipe("/ember-sized/d/a.csv", b"y,c\n1,x\n")
    mem.pipe("/ember-sized/d/b.csv", b"y,c\n0,zz\n1,w\n")
    asked: list[str] = []
    real = storage.file_size
    monkeypatch.setattr(storage, "file_size", lambda path, options=None: asked.append(path) or real(path, options))
    try:
        want = [("memory://ember-sized/d/a.csv", 8), ("memory://ember-sized/d/b.csv", 13)]
        assert files_module.expand_sized(["memory://ember-sized/d/"], "csv") == want
        assert files_module.expand_sized(["memory://ember-sized/d/*.csv"], "csv") == want
        assert asked == []  # the listing's sizes
        assert files_module.expand_sized(["memory://ember-sized/d/b.csv"], "csv") == want[1:]
        assert asked == ["memory://ember-sized/d/b.csv"]  # named alone: its own size
    finally:
        mem.rm("/ember-sized", recursive=True)
