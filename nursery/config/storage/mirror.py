"""A model folder of a bucket made local, complete or not at all, through an object cache.

A model is served only from a complete download. Its objects are fetched (in parallel) into
a cache named by what identifies their content (the repository, the key, the ETag or
generation and the size), then hard-linked into a folder named by the model's whole listing,
built under a temporary name and renamed into place once every file is there. A failed
download leaves no folder behind and never touches the one that is serving; a reload or a
restart (with ``--cloud-cache-directory``) fetches only the objects whose tag changed, and a
model that did not change at all is not fetched.

Layout under the cache folder::

    objects/<sha256>                                      one file per object version
    models/<sha256(repository url)[:16]>/<model>/<sha256(listing)[:16]>/   complete folders
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path

from nursery.config.storage.base import (
    ObjectInfo,
    ObjectStore,
    RemoteModel,
    StorageError,
    unsafe_part,
)
from nursery.config.storage.url import CloudRoot

FETCHERS = 8  # objects downloaded at once for one model
MOUNT_ENV = {"s3": "TRITON_AWS_MOUNT_DIRECTORY", "gs": "TRITON_GCS_MOUNT_DIRECTORY",
             "as": "TRITON_AZURE_MOUNT_DIRECTORY"}


def mount_directory(scheme: str) -> str:
    """Where downloads go without a cache folder: Triton's mount directory, else /tmp."""
    return os.environ.get(MOUNT_ENV.get(scheme, ""), "") or tempfile.gettempdir()


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8", "surrogateescape"))
        h.update(b"\0")
    return h.hexdigest()


def object_path(base: Path, root: CloudRoot, key: str, obj: ObjectInfo) -> Path:
    identity = f"{root.scheme}|{root.endpoint}|{root.account}|{root.bucket}"
    return base / "objects" / _digest(identity, key, obj.tag, str(obj.size))


def model_folder(base: Path, model: RemoteModel) -> Path:
    listing = [f"{o.rel}\0{o.size}\0{o.tag}" for o in sorted(model.files, key=lambda o: o.rel)]
    return (base / "models" / _digest(model.root.url)[:16] / model.name
            / _digest(*listing)[:16])


MAX_OBJECTS_PER_MODEL = 10_000  # as many files as a local model's fingerprint walks


def check_keys(model: RemoteModel) -> None:
    if len(model.files) > MAX_OBJECTS_PER_MODEL:
        raise StorageError(
            f"'{model.root.child_url(model.name)}' holds {len(model.files)} objects, more than "
            f"the {MAX_OBJECTS_PER_MODEL} a model may have; refused")
    for obj in model.files:
        if unsafe_part(obj.rel):
            raise StorageError(
                f"object '{model.root.child_url(model.name + '/' + obj.rel)}' is not a plain "
                "path inside the model folder ('..', '.', or an empty component); refused")


def localize(model: RemoteModel, store: ObjectStore, base: Path) -> Path:
    """The model's complete local folder (made now, or found from an earlier load).

    Raises :class:`StorageError` naming the object's URL and the cause when any object
    cannot be fetched; nothing is left half-made."""
    check_keys(model)
    final = model_folder(base, model)
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    (base / "objects").mkdir(parents=True, exist_ok=True)
    files = [o for o in model.files if not o.rel.endswith("/")]
    with ThreadPoolExecutor(max_workers=FETCHERS) as pool:
        futures = [pool.submit(_fetch, model, store, base, o) for o in files]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for future in pending:
            future.cancel()
        for future, obj in zip(futures, files, strict=True):
            if future.done() and not future.cancelled():
                error = future.exception()
                if isinstance(error, StorageError):
                    raise error
                if error is not None:  # a library error no store expected: still this load's
                    url = model.root.child_url(f"{model.name}/{obj.rel}")
                    raise StorageError(f"failed to download '{url}': "
                                       f"{type(error).__name__}: {error}") from None
    partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=final.parent))
    try:
        for obj in model.files:
            target = partial / obj.rel
            if obj.rel.endswith("/"):
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            source = object_path(base, model.root, model.root.key(f"{model.name}/{obj.rel}"),
                                 obj)
            try:
                os.link(source, target)
            except OSError:  # another file system, or links refused: a copy will do
                shutil.copyfile(source, target)
        try:
            os.rename(partial, final)
        except OSError:
            if not final.is_dir():  # not a concurrent load of the same listing that won
                raise
    except OSError as exc:
        raise StorageError(f"cannot lay out model '{model.name}' under {final.parent}: "
                           f"{exc.strerror or exc}") from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return final


def _fetch(model: RemoteModel, store: ObjectStore, base: Path, obj: ObjectInfo) -> None:
    rel = f"{model.name}/{obj.rel}"
    key = model.root.key(rel)
    cached = object_path(base, model.root, key, obj)
    if cached.is_file() and cached.stat().st_size == obj.size:
        return  # fetched before (this run or an earlier one): the tag says it is the same
    fd, temp = tempfile.mkstemp(prefix=".fetch-", dir=cached.parent)
    os.close(fd)
    try:
        try:
            store.download(ObjectInfo(rel, obj.size, obj.tag), Path(temp))
        except StorageError as exc:
            raise StorageError(
                f"failed to download '{model.root.child_url(rel)}': {exc}") from None
        size = os.path.getsize(temp)
        if size != obj.size:
            raise StorageError(
                f"failed to download '{model.root.child_url(rel)}': got {size} bytes, "
                f"the listing said {obj.size} (the object changed or the transfer broke)")
        os.chmod(temp, 0o444)  # linked into model folders: nothing may write through them
        os.replace(temp, cached)
    except OSError as exc:
        raise StorageError(f"failed to download '{model.root.child_url(rel)}': "
                           f"{exc.strerror or exc}") from None
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def prune(base: Path, model: RemoteModel) -> None:
    """Remove the model's other local folders (earlier listings) once this one serves."""
    keep = model_folder(base, model)
    for folder in keep.parent.iterdir() if keep.parent.is_dir() else ():
        if folder != keep and not folder.name.startswith(".partial-"):
            shutil.rmtree(folder, ignore_errors=True)
