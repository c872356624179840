"""Where a registry's objects live: a local folder, S3-compatible storage, or `registry serve` over HTTP.

All three look like a flat key -> bytes store with ETags. Writers need two conditional writes so
two publishers can never both take a version number or both move a channel: `put_if_absent` and
`put_if_match` (local: a file lock; S3: PutObject with If-None-Match / If-Match). HTTP is read-only.
boto3 is imported only when an S3 registry is opened, so the gateway does not need it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator, Protocol

from routeopt.artifacts.serving.manifest import ManifestError, check_file_name
from routeopt.common.io import atomic_write, make_dirs

MAX_OBJECT_BYTES = 256 * 2**20  # no policy file is this big; a hostile server cannot exhaust memory
LISTING_KEY = "_keys.json"  # synthesised by `registry serve`: every key in the registry


class RegistryError(RuntimeError):
    """The registry cannot be read or written; the message names the location and the key."""


class NotFound(RegistryError):
    pass


class Backend(Protocol):
    location: str

    def get(self, key: str) -> tuple[bytes, str]: ...
    def get_if_changed(self, key: str, etag: str | None) -> tuple[bytes, str] | None: ...
    def put(self, key: str, data: bytes) -> None: ...
    def put_if_absent(self, key: str, data: bytes) -> bool: ...
    def put_if_match(self, key: str, data: bytes, etag: str | None) -> bool: ...
    def list(self, prefix: str) -> list[str]: ...
    def delete(self, keys: list[str]) -> None: ...


def _safe_key(key: str) -> str:
    try:
        return check_file_name(key, "registry key")
    except ManifestError as exc:
        raise RegistryError(str(exc)) from None


def etag_of(data: bytes) -> str:
    return '"' + hashlib.sha256(data).hexdigest()[:32] + '"'


class LocalBackend:
    """A folder; conditional writes are serialised by an flock on `<root>/.lock`."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.location = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / _safe_key(key)

    def get(self, key: str) -> tuple[bytes, str]:
        try:
            data = self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"{self.root}: {key} not found") from None
        except OSError as exc:
            raise RegistryError(f"{self.root}: cannot read {key}: {exc}") from None
        return data, etag_of(data)

    def get_if_changed(self, key: str, etag: str | None) -> tuple[bytes, str] | None:
        data, tag = self.get(key)
        return None if tag == etag else (data, tag)

    def put(self, key: str, data: bytes) -> None:
        """Write atomically, readable by all (0644, folders 0755): a gateway often runs as
        another user than the publisher, and nothing in a registry is secret."""
        path = self._path(key)
        make_dirs(path.parent)
        atomic_write(path, data, permissions=0o644)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        make_dirs(self.root)
        with open(self.root / ".lock", "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.put_if_match(key, data, None)

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> bool:
        with self._locked():
            try:
                current = self.get(key)[1]
            except NotFound:
                current = None
            if current != etag:
                return False
            self.put(key, data)
            return True

    def list(self, prefix: str) -> list[str]:
        base = self.root / prefix if prefix else self.root
        if not base.is_dir():
            return []
        return sorted(
            str(p.relative_to(self.root))
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )

    def delete(self, keys: list[str]) -> None:
        """Remove keys and the version folders they leave empty (a publisher's abandoned
        attempt); top-level folders such as `versions/` stay, since others write into them."""
        for key in keys:
            path = self._path(key)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            for parent in path.parents:
                if parent.parent == self.root or self.root not in parent.parents:
                    break
                try:
                    parent.rmdir()
                except OSError:
                    break


class S3Backend:
    """An S3 bucket (or MinIO, moto...) under a key prefix; credentials from the usual AWS env."""

    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None) -> None:
        try:
            import boto3  # the gateway never needs boto3 unless it reads S3 directly
        except ImportError:
            raise RegistryError(f"s3://{bucket}: needs boto3; pip install 'routeopt[s3]'") from None

        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.client = boto3.client("s3", endpoint_url=endpoint_url)
        self.location = f"s3://{bucket}/{self.prefix}"

    def _key(self, key: str) -> str:
        key = _safe_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _error(self, exc: Exception, key: str) -> RegistryError:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        if code in ("NoSuchKey", "404", "NotFound"):
            return NotFound(f"{self.location}: {key} not found")
        return RegistryError(f"{self.location}: {key}: {exc}")

    def get(self, key: str) -> tuple[bytes, str]:
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            return resp["Body"].read(), resp["ETag"]
        except Exception as exc:  # botocore raises many classes; map all to one clear error
            raise self._error(exc, key) from None

    def get_if_changed(self, key: str, etag: str | None) -> tuple[bytes, str] | None:
        try:
            kwargs = {"IfNoneMatch": etag} if etag else {}
            resp = self.client.get_object(Bucket=self.bucket, Key=self._key(key), **kwargs)
            return resp["Body"].read(), resp["ETag"]
        except Exception as exc:
            if getattr(exc, "response", {}).get("Error", {}).get("Code") in ("304", "NotModified"):
                return None
            raise self._error(exc, key) from None

    def put(self, key: str, data: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        except Exception as exc:
            raise self._error(exc, key) from None

    def _conditional(self, key: str, data: bytes, **cond: str) -> bool:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **cond)
            return True
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                return False
            raise self._error(exc, key) from None

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self._conditional(key, data, IfNoneMatch="*")

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> bool:
        if etag is None:
            return self.put_if_absent(key, data)
        return self._conditional(key, data, IfMatch=etag)

    def list(self, prefix: str) -> list[str]:
        if prefix.strip("/"):
            _safe_key(prefix.strip("/"))
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        cut = len(self.prefix) + 1 if self.prefix else 0
        keys: list[str] = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full
            ):
                keys.extend(o["Key"][cut:] for o in page.get("Contents", []))
        except Exception as exc:
            raise self._error(exc, prefix) from None
        return sorted(keys)

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            with contextlib.suppress(Exception):
                self.client.delete_object(Bucket=self.bucket, Key=self._key(key))


class HttpBackend:
    """A read-only registry behind `routeopt registry serve` (or any static server with ETags)."""

    def __init__(self, base_url: str, timeout_s: float = 5.0) -> None:
        self.base = base_url.rstrip("/") + "/"
        self.location = self.base
        self.timeout_s = timeout_s

    def _fetch(self, key: str, etag: str | None) -> tuple[bytes, str] | None:
        url = self.base + urllib.parse.quote(_safe_key(key))
        req = urllib.request.Request(url, headers={"If-None-Match": etag} if etag else {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                data = resp.read(MAX_OBJECT_BYTES + 1)
                if len(data) > MAX_OBJECT_BYTES:
                    raise RegistryError(f"{url}: larger than {MAX_OBJECT_BYTES} bytes; refusing it")
                return data, resp.headers.get("ETag", "")
        except urllib.error.HTTPError as exc:
            if exc.code == 304:
                return None
            if exc.code == 404:
                raise NotFound(f"{url}: not found") from None
            raise RegistryError(f"{url}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise RegistryError(f"{url}: registry unreachable ({exc})") from None

    def get(self, key: str) -> tuple[bytes, str]:
        result = self._fetch(key, None)
        assert result is not None
        return result

    def get_if_changed(self, key: str, etag: str | None) -> tuple[bytes, str] | None:
        return self._fetch(key, etag)

    def _read_only(self, *_: object) -> bool:
        raise RegistryError(f"{self.base}: an HTTP registry is read-only; publish to its folder or bucket")

    put = put_if_absent = put_if_match = delete = _read_only  # type: ignore[assignment]

    def list(self, prefix: str) -> list[str]:
        data, _ = self.get(LISTING_KEY)
        try:
            keys = json.loads(data)
        except json.JSONDecodeError:
            raise RegistryError(f"{self.base}{LISTING_KEY}: not a JSON list of keys") from None
        return sorted(k for k in keys if isinstance(k, str) and k.startswith(prefix))


def exists(backend: Backend, key: str) -> bool:
    try:
        backend.get(key)
        return True
    except NotFound:
        return False


def open_backend(location: str | os.PathLike) -> Backend:
    """A folder path, `s3://bucket/prefix` (endpoint from `$AWS_ENDPOINT_URL`), or an http(s) URL."""
    text = str(location)
    if text.startswith(("http://", "https://")):
        return HttpBackend(text)
    if text.startswith("s3://"):
        parsed = urllib.parse.urlparse(text)
        if not parsed.netloc:
            raise RegistryError(f"{text}: an S3 registry is s3://BUCKET[/PREFIX]")
        return S3Backend(parsed.netloc, parsed.path)
    return LocalBackend(Path(text))
