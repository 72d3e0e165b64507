"""Where data files live: a local path, or a URI of object storage or a remote filesystem
(``s3://bucket/key``, ``gs://``, ``hdfs://``, ``abfs://``, any scheme pyarrow's filesystems
know, or fsspec's when installed), turned into a pyarrow filesystem and a path on it.

Local paths never come here: ``is_remote`` tells them apart (a ``scheme://`` prefix) and the
readers keep their own local code (``pa.OSFile``, ``os.walk``), so local reads cost what they
did. For a URI, the helpers below list (``walk``, ``stat``), and open for streaming
(``open_stream``: sequential, buffered; CSV) or for ranged random access (``open_file``:
Parquet footers and row groups, ORC stripes): an object is never downloaded whole first.

S3 (``s3://``): credentials, endpoint and region come from ``data.storage_options``
(:class:`StorageOptions`), else from the standard environment variables (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``,
``AWS_REGION`` / ``AWS_DEFAULT_REGION``), read when the filesystem is made, then the AWS
SDK's own chain (``~/.aws``, instance roles). Each request is retried by pyarrow's
``AwsStandardS3RetryStrategy`` (``retries`` attempts, exponential backoff); a listing or an
open that still fails on what looks transient (network, throttling, 5xx) is tried once more
after a pause. What is left is named: a missing bucket, a denied request (bad or missing
credentials, a policy), a missing object and an unreachable endpoint each have their own
message (ConfigError / DataError).

Example:
    >>> is_remote("s3://bucket/train/"), is_remote("data/train.csv"), split_uri("s3://b/k/x.csv")
    (True, False, ('s3', 'b/k/x.csv'))
"""

from __future__ import annotations

import datetime
import fnmatch
import functools
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Literal, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs
from pydantic import Field, field_serializer, model_validator

from ember.config_base import ConfigModel
from ember.errors import ConfigError, DataError

__all__ = ["StorageOptions", "Entry", "is_remote", "split_uri", "walk", "stat", "open_stream", "open_file", "opened",
           "file_size", "is_file", "storage_error", "is_storage_error", "match_glob"]

log = logging.getLogger("ember")

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_OP_ATTEMPTS = 2  # a listing / open failing on a transient error after the SDK's retries: one more try
_OP_PAUSE_S = 1.0  # before it (the SDK's own backoff covers the short blips)
_GCS_RETRY_S = 15  # gs://: how long the GCS client retries a failing request (unless storage_options.extra says)
STREAM_BUFFER = 4 << 20  # sequential reads of an object: bytes fetched per ranged GET (at least)
T = TypeVar("T")


class StorageOptions(ConfigModel):
    """``data.storage_options``: how to reach data paths given as URIs (``s3://bucket/prefix/``).
    Unset keys fall back to the standard environment variables, then the AWS SDK's own chain.
    The credentials (``access_key``, ``secret_key``, ``session_token``) are never written out:
    the config a run records (``config.yaml``, checkpoints, exports) holds them as null, so a
    command that reads a run later (``ember eval``, ``ember predict``) takes them from the
    environment, or from a config you give it again.

    Example:
        >>> StorageOptions(endpoint_override="127.0.0.1:9000", scheme="http").scheme
        'http'
    """

    endpoint_override: str | None = None
    """S3: the server to talk to instead of AWS, `host:port` or a URL (MinIO, Ceph, R2, a local test server);
    unset: `AWS_ENDPOINT_URL_S3`, else `AWS_ENDPOINT_URL`, else AWS itself."""
    scheme: Literal["http", "https"] | None = None
    """S3: `http` or `https` for the endpoint; unset: the endpoint URL's own scheme, else `https`."""
    access_key: str | None = None
    """S3: access key ID; unset: `AWS_ACCESS_KEY_ID` (or the AWS profile / instance role). Set with `secret_key`."""
    secret_key: str | None = None
    """S3: secret access key; unset: `AWS_SECRET_ACCESS_KEY`. Set with `access_key`."""
    session_token: str | None = None
    """S3: session token of temporary credentials; unset: `AWS_SESSION_TOKEN`."""
    region: str | None = None
    """S3: the bucket's region; unset: `AWS_REGION`, else `AWS_DEFAULT_REGION`, else the AWS SDK's default."""
    anonymous: bool = False
    """S3: send no credentials (public buckets)."""
    retries: int = Field(5, ge=1, le=50)
    """S3: attempts per request (pyarrow's `AwsStandardS3RetryStrategy`: exponential backoff) before a transient
    error (network, throttling, 5xx) counts; a listing or open that still fails is tried once more after 1 s."""
    connect_timeout_s: float | None = Field(None, gt=0)
    """S3: seconds to wait for a connection; unset: the AWS SDK's default (1 s)."""
    request_timeout_s: float | None = Field(None, gt=0)
    """S3: seconds to wait for a request's data; unset: the AWS SDK's default (3 s)."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Other schemes: keyword arguments of their filesystem (`gs://`: `pyarrow.fs.GcsFileSystem`, whose
    `retry_time_limit` is 15 s unless given here; a scheme only fsspec knows: `fsspec.filesystem(scheme, **extra)`);
    `hdfs://` and `abfs://` take theirs in the URI."""

    def key(self) -> str:
        """Every field, credentials included, as JSON: this process's cache key of a filesystem
        (never written anywhere; ``model_dump`` leaves the credentials out)."""
        return json.dumps({name: getattr(self, name) for name in type(self).model_fields}, sort_keys=True)

    @field_serializer("access_key", "secret_key", "session_token")
    def _never_written(self, value: str | None) -> None:
        """Credentials stay in memory: a recorded config holds them as null (class docstring)."""
        return None

    @model_validator(mode="after")
    def _check(self) -> "StorageOptions":
        if (self.access_key is None) != (self.secret_key is None):
            raise ValueError("storage_options: set access_key and secret_key together (or neither, to use "
                             "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)")
        if self.anonymous and self.access_key is not None:
            raise ValueError("storage_options: anonymous sends no credentials; drop access_key/secret_key or anonymous")
        return self


_DEFAULT = StorageOptions()


@dataclass(frozen=True)
class Entry:
    """One object (file) found by a listing: its URI, size in bytes and modification time."""

    uri: str
    size: int
    mtime_ns: int


def is_remote(path: str) -> bool:
    """Whether ``path`` is a URI (``scheme://...``), read through a pyarrow filesystem."""
    return bool(_SCHEME.match(path))


def split_uri(uri: str) -> tuple[str, str]:
    """``(scheme, the rest)`` of a URI, the scheme lower case."""
    m = _SCHEME.match(uri)
    if not m:
        raise ValueError(f"not a URI: {uri!r}")
    return m.group(1).lower(), uri[m.end():]


def _s3_kwargs(options: StorageOptions) -> dict[str, Any]:
    """S3FileSystem's arguments: the options, else the environment (read now, not at import)."""
    env = os.environ
    endpoint = options.endpoint_override or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
    kw: dict[str, Any] = {"retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=options.retries)}
    if endpoint:
        kw["endpoint_override"] = endpoint
        if options.scheme is None and endpoint.startswith(("http://", "https://")):
            kw["scheme"] = endpoint.split("://", 1)[0]
    if options.scheme is not None:
        kw["scheme"] = options.scheme
    region = options.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        kw["region"] = region
    if options.anonymous:
        kw["anonymous"] = True
    elif options.access_key is not None:
        kw.update(access_key=options.access_key, secret_key=options.secret_key, session_token=options.session_token)
    if options.connect_timeout_s is not None:
        kw["connect_timeout"] = options.connect_timeout_s
    if options.request_timeout_s is not None:
        kw["request_timeout"] = options.request_timeout_s
    return kw


def _endpoint(options: StorageOptions) -> str:
    """Where S3 requests go, for messages."""
    kw = _s3_kwargs(options)
    return kw.get("endpoint_override") or "AWS S3" + (f" ({kw['region']})" if "region" in kw else "")


@functools.lru_cache(maxsize=64)
def _filesystem(scheme: str, authority: str, options_key: str, env: tuple[str | None, ...]) -> tuple[pafs.FileSystem, str, str]:
    """The filesystem for URIs ``scheme://authority/...``, and where its paths meet the URIs:
    ``(fs, uri_root, path_root)``, the URI ``uri_root + rest`` being the path ``path_root +
    rest`` on it (S3: ``s3://`` and ``""``; a filesystem whose path starts with the URI's
    authority, GCS's bucket or Azure's container: ``gs://bucket/`` and ``bucket/``); one per
    (scheme, authority, options, environment) and process."""
    options = StorageOptions.model_validate(json.loads(options_key))
    if scheme in ("s3", "s3a"):
        return pafs.S3FileSystem(**_s3_kwargs(options)), f"{scheme}://", ""
    uri = f"{scheme}://{authority}/"
    if scheme in ("gs", "gcs"):  # its paths are bucket/key, as S3's; retries bounded (the client's own: 15 min)
        return pafs.GcsFileSystem(**{"retry_time_limit": datetime.timedelta(seconds=_GCS_RETRY_S), **options.extra}), \
            f"{scheme}://", ""
    try:
        if options.extra:
            raise pa.ArrowInvalid("options for fsspec")  # pyarrow's from_uri takes no keyword arguments
        fs, path = pafs.FileSystem.from_uri(uri)
        return fs, uri, path if not path or path.endswith("/") else path + "/"  # gs: 'bucket'; abfs: 'container/'
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as e:
        try:
            import fsspec
        except ImportError:
            raise ConfigError(f"data path {scheme}://{authority}/...: pyarrow's filesystems do not read '{scheme}://' "
                              f"({e}); install fsspec with the package for that scheme, or copy the data to a "
                              "supported store (s3://, gs://, hdfs://, abfs://) or a local path") from None
        try:
            handler = pafs.FSSpecHandler(fsspec.filesystem(scheme, **options.extra))
        except (ImportError, ValueError, TypeError) as err:
            raise ConfigError(f"data path {scheme}://{authority}/...: neither pyarrow nor fsspec can open "
                              f"'{scheme}://' ({err}); install the fsspec package for it, or fix "
                              "data.storage_options.extra") from None
        return pafs.PyFileSystem(handler), f"{scheme}://", ""
    except OSError as e:  # pyarrow could not start the filesystem's client (HDFS: Java, libhdfs, the namenode)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if scheme in ("hdfs", "viewfs") and any(k in str(e) for k in ("libjvm", "libhdfs", "JAVA_HOME", "CLASSPATH")):
            raise ConfigError(f"data path {uri}...: HDFS needs Java and libhdfs on this machine ({first}); install a "
                              "Java runtime and Hadoop, set JAVA_HOME and HADOOP_HOME (and CLASSPATH to the output of "
                              "`hadoop classpath --glob`), or copy the data to a local path or object storage") from None
        raise ConfigError(f"data path {uri}...: cannot reach the {scheme}:// filesystem ({first}); check the host and "
                          "port in the path, and that the service is reachable from this machine") from None


def resolve(uri: str, options: StorageOptions | None = None) -> tuple[pafs.FileSystem, str, Callable[[str], str]]:
    """``(filesystem, path on it, to_uri)`` of ``uri``; ``to_uri(path)`` turns a path on that
    filesystem (one a listing gives) back into a URI.

    Example:
        >>> fs, path, to_uri = resolve("gs://some-bucket/x.csv")  # GCS's paths start with the bucket
        >>> path, to_uri("some-bucket/d/y.csv")
        ('some-bucket/x.csv', 'gs://some-bucket/d/y.csv')
    """
    scheme, rest = split_uri(uri)
    authority = rest.split("/", 1)[0]
    env = tuple(os.environ.get(k) for k in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION",
                                             "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID"))
    fs, uri_root, path_root = _filesystem(scheme, authority if scheme not in ("s3", "s3a") else "",
                                          (options or _DEFAULT).key(), env)
    canonical = f"{scheme}://{rest}"
    if not canonical.startswith(uri_root):  # the authority alone: gs://bucket
        canonical += "/"
    path = path_root + canonical[len(uri_root):]
    path = path.rstrip("/") or path[:1]  # a root '/' stays

    def to_uri(p: str) -> str:
        if p + "/" == path_root:  # the root itself: abfs://container@account
            return uri_root.rstrip("/")
        return uri_root + (p[len(path_root):] if p.startswith(path_root) else p.lstrip("/"))

    return fs, path, to_uri


def _bucket(uri: str) -> str:
    return split_uri(uri)[1].split("/", 1)[0]


_DENIED = ("ACCESS_DENIED", "AccessDenied", "SIGNATURE_DOES_NOT_MATCH", "INVALID_ACCESS_KEY_ID", "InvalidAccessKeyId",
           "SignatureDoesNotMatch", "Forbidden", "HTTP response code 403", "403 Forbidden", "EXPIRED_TOKEN",
           "InvalidToken", "UNRECOGNIZED_CLIENT")
_NO_BUCKET = ("NO_SUCH_BUCKET", "NoSuchBucket", "The specified bucket does not exist")
_TRANSIENT = ("NETWORK_CONNECTION", "curlCode", "SLOW_DOWN", "SlowDown", "SERVICE_UNAVAILABLE", "INTERNAL_FAILURE",
              "REQUEST_TIMEOUT", "THROTTL", "Throttl", "RequestTimeout", "Connection reset", "timed out", "HTTP 5")


def is_storage_error(error: BaseException) -> bool:
    """Whether ``error`` is a remote store's answer (denied, missing bucket, network), as opposed to
    bytes that do not decode: readers name it as a storage failure, not as a damaged file."""
    text = str(error)
    return isinstance(error, OSError) and any(k in text for k in _DENIED + _NO_BUCKET + _TRANSIENT + ("AWS Error",))


def _transient(error: BaseException) -> bool:
    text = str(error)
    return not any(k in text for k in _DENIED + _NO_BUCKET) and (any(k in text for k in _TRANSIENT) or
                                                               isinstance(error, (TimeoutError, ConnectionError)))


def storage_error(uri: str, action: str, error: BaseException, options: StorageOptions | None = None,
                  attempts: int = 1) -> ConfigError | DataError:
    """The error to show for ``error`` raised while ``action`` (e.g. ``"listing"``) on ``uri``:
    a missing bucket, a denied request, a missing object, or a failure that retrying did not
    cure, each with what to do."""
    options = options or _DEFAULT
    text = " ".join(str(error).split())
    s3 = split_uri(uri)[0] in ("s3", "s3a")
    where = f" at {_endpoint(options)}" if s3 else ""
    if any(k in text for k in _NO_BUCKET):
        return ConfigError(f"{uri}: bucket '{_bucket(uri)}' does not exist{where}; check the bucket name in the path, "
                           "and the endpoint (data.storage_options.endpoint_override or AWS_ENDPOINT_URL) and region")
    if isinstance(error, PermissionError) or any(k in text for k in _DENIED):
        creds = ("the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or data.storage_options.access_key / "
                 "secret_key) and that their policy allows listing the bucket and reading its objects "
                 "(s3:ListBucket, s3:GetObject)" if s3 else "the credentials and the permissions on it")
        return ConfigError(f"{uri}: access denied while {action}{where} ({_short(text)}); check {creds}")
    if split_uri(uri)[0] in ("gs", "gcs") and "access token" in text:
        return ConfigError(f"{uri}: no Google Cloud credentials to read it with ({_short(text)}); set "
                           "GOOGLE_APPLICATION_CREDENTIALS to a service account's JSON key file (or run where the "
                           "metadata server gives them), or, for a public bucket, set data.storage_options.extra: "
                           "{anonymous: true}")
    if isinstance(error, FileNotFoundError):
        return DataError(f"{uri}: no such object{where} (removed or renamed since it was listed?); restore it, or "
                         "remove it from the data paths")
    tries = f" after {attempts} attempt(s) of {options.retries} request(s) each" if s3 else ""
    return DataError(f"{uri}: {action} failed{where}{tries} ({_short(text)}); check that the endpoint is reachable "
                     "from this machine, or raise data.storage_options.retries for a flaky network")


def _short(text: str) -> str:
    text = re.sub(r"\s*\(Request ID: [^)]*\)", "", text)
    return text if len(text) <= 300 else text[:300] + "..."


def _retrying(uri: str, action: str, options: StorageOptions | None, fn: Callable[[], T]) -> T:
    """``fn()``; a transient failure is tried again (``_OP_ATTEMPTS`` in all, a pause between),
    then raised as ``storage_error`` says, as is any other failure of the store."""
    for attempt in range(1, _OP_ATTEMPTS + 1):
        try:
            return fn()
        except (OSError, pa.ArrowException) as e:
            if isinstance(e, FileNotFoundError) and action.startswith("open"):
                raise storage_error(uri, action, e, options) from None
            if attempt < _OP_ATTEMPTS and _transient(e):
                log.warning("%s: %s failed (%s); trying again in %g s", uri, action, _short(str(e)), _OP_PAUSE_S)
                time.sleep(_OP_PAUSE_S)
                continue
            raise storage_error(uri, action, e, options, attempt) from None
    raise AssertionError("unreachable")


def stat(uri: str, options: StorageOptions | None = None) -> Literal["file", "directory"] | None:
    """What ``uri`` names: an object (``"file"``), a prefix holding objects or a bucket
    (``"directory"``), or nothing (None; a missing bucket raises ConfigError)."""
    fs, path, _ = resolve(uri, options)

    def get() -> Literal["file", "directory"] | None:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            return "file"
        if info.type == pafs.FileType.Directory:
            return "directory"
        if "/" in path and split_uri(uri)[0] in ("s3", "s3a", "gs", "gcs"):  # a key: does its bucket exist?
            if fs.get_file_info(path.split("/", 1)[0]).type == pafs.FileType.NotFound:
                raise FileNotFoundError(f"NoSuchBucket: The specified bucket does not exist: {path}")
        elif split_uri(uri)[0] in ("s3", "s3a", "gs", "gcs"):
            raise FileNotFoundError(f"NoSuchBucket: The specified bucket does not exist: {path}")
        return None

    return _retrying(uri, "reading its information", options, get)


def walk(uri: str, options: StorageOptions | None = None) -> list[Entry]:
    """Every object under prefix ``uri`` (recursively), sorted by URI; [] when none is there."""
    fs, path, to_uri = resolve(uri, options)

    def get() -> list[Entry]:
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
        lead = 1 if not path.startswith("/") else 0  # fsspec's memory:// answers "/b/k" for "b/k": keep the URI's form
        return sorted((Entry(to_uri(i.path[lead:] if lead and i.path.startswith("/") else i.path), i.size or 0,
                             _mtime_ns(i)) for i in infos if i.type == pafs.FileType.File), key=lambda e: e.uri)

    return _retrying(uri, "listing", options, get)


def _mtime_ns(info: pafs.FileInfo) -> int:
    ns = info.mtime_ns
    return int(ns) if ns is not None else 0


def is_file(path: str, options: StorageOptions | None = None) -> bool:
    """Whether ``path`` (local or URI) is a file / an object."""
    if not is_remote(path):
        return os.path.isfile(path)
    return stat(path, options) == "file"


def file_size(path: str, options: StorageOptions | None = None) -> int:
    """Bytes of ``path`` (local or URI) as stored."""
    if not is_remote(path):
        return os.path.getsize(path)
    fs, p, _ = resolve(path, options)
    info = _retrying(path, "reading its size", options, lambda: fs.get_file_info(p))
    if info.type != pafs.FileType.File:
        raise storage_error(path, "reading its size", FileNotFoundError(path), options)
    return int(info.size or 0)


def opened(path: str, options: StorageOptions | None = None) -> ContextManager[Any]:
    """What pyarrow's readers take for ``path``: a local path as it is (the reader opens and
    closes the file), or a URI opened for ranged reads (``open_file``), closed on leaving."""
    return open_file(path, options) if is_remote(path) else nullcontext(path)


def open_stream(uri: str, options: StorageOptions | None = None) -> pa.NativeFile:
    """``uri`` as a sequential stream of its stored bytes (no decompression), read ahead in
    ranged requests of a few MiB, never downloaded whole; ``tell()`` counts bytes read."""
    fs, path, _ = resolve(uri, options)
    return _retrying(uri, "opening", options,
                     lambda: fs.open_input_stream(path, compression=None, buffer_size=STREAM_BUFFER))


def open_file(uri: str, options: StorageOptions | None = None) -> pa.NativeFile:
    """``uri`` opened for random access (Parquet / ORC read their footer, then ranges)."""
    fs, path, _ = resolve(uri, options)
    return _retrying(uri, "opening", options, lambda: fs.open_input_file(path))


def match_glob(pattern_parts: list[str], parts: list[str]) -> bool:
    """Whether path ``parts`` match glob ``pattern_parts`` as ``glob.glob(recursive=True)``
    matches: each part by ``fnmatch`` (``*`` never crosses a ``/``), ``**`` any parts.

    Example:
        >>> match_glob(["d", "*.csv"], ["d", "a.csv"]), match_glob(["d", "*.csv"], ["d", "x", "a.csv"])
        (True, False)
        >>> match_glob(["d", "**", "*.csv"], ["d", "x", "y", "a.csv"]), match_glob(["d", "**", "*.csv"], ["d", "a.csv"])
        (True, True)
    """
    if not pattern_parts:
        return not parts
    head, rest = pattern_parts[0], pattern_parts[1:]
    if head == "**":
        return any(match_glob(rest, parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], head) and match_glob(rest, parts[1:])
