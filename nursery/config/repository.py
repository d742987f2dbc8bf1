"""Pure functions over model repositories: find models (a model's versions: ``versions.py``).

Layout (Triton's): ``<repo>/<model>/config.pbtxt`` and numbered version folders
``<repo>/<model>/<n>/`` holding the model file (``model.onnx`` and so on). A repository is a
local folder or a bucket (``s3://``, ``gs://``, ``as://``: ``config/storage``); a bucket is
scanned by listing its objects, and a model found there has a ``remote`` listing until the
manager makes it local (``storage.mirror.localize``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Generic, TypeVar

from nursery.config.namespaces import ModelId
from nursery.config.storage import open_store
from nursery.config.storage.base import ObjectInfo, RemoteModel, StorageError
from nursery.config.storage.url import CloudRoot
from nursery.errors import InternalError

Root = Path | CloudRoot  # a repository: a local folder or a bucket


@dataclass(frozen=True, slots=True)
class ModelLocation:
    name: str
    path: Path  # the model's folder (for a model in a bucket: its local copy, once made)
    repository: Root  # the repository root it was found in
    remote: RemoteModel | None = None  # a model in a bucket, not yet made local


@dataclass(frozen=True, slots=True)
class RepositoryScan:
    models: dict[str, ModelLocation]
    # models found in more than one repository: Triton refuses to load either copy
    duplicates: dict[str, tuple[Root, ...]]
    # repositories that could not be read (missing, not a folder, no permission): the reason,
    # Triton's "failed to poll model repository '<path>': failed to open directory <path>"
    unreadable: dict[Root, str] = field(default_factory=dict)
    # every model folder of every repository, by name, in the repositories' order (with
    # --model-namespacing each is a model of its own, in its repository's namespace)
    copies: dict[str, tuple[ModelLocation, ...]] = field(default_factory=dict)

    def identified(self, namespacing: bool) -> dict[ModelId, ModelLocation]:
        """Each loadable model folder by its identifier: with namespacing, every folder in
        its repository's namespace; without, the models found in one repository only."""
        if not namespacing:
            return {ModelId("", name): loc for name, loc in self.models.items()}
        return {ModelId(namespace_of(loc.repository, True), name): loc
                for name, locs in self.copies.items() for loc in locs}


def namespace_of(repository: Root, namespacing: bool) -> str:
    """The namespace of a repository's models: its path (or URL) as given with
    --model-namespacing, else none."""
    return str(repository) if namespacing else ""


def scan(repositories: tuple[Root, ...] | list[Root],
         renames: Mapping[Path, Mapping[str, str]] | None = None) -> RepositoryScan:
    """Every model folder in the given repositories (hidden folders skipped). A repository
    that cannot be read is reported in ``unreadable``, never raised: the callers decide
    (start-up fails on it with ``--exit-on-error``; the index and loads use the others).
    A bucket is listed (blocking, over the network: run this off the trio thread).
    ``renames``: a registered repository's folders -> the model names they serve as."""
    found: dict[str, list[ModelLocation]] = {}
    mapped: dict[str, ModelLocation] = {}
    unreadable: dict[Root, str] = {}
    for repo in repositories:
        if isinstance(repo, CloudRoot):
            try:
                for location in scan_bucket(repo):
                    found.setdefault(location.name, []).append(location)
            except StorageError as exc:
                unreadable[repo] = f"failed to poll model repository '{repo}': {exc}"
            continue
        try:
            entries = sorted(os.scandir(repo), key=lambda e: e.name)
        except OSError as exc:
            unreadable[Path(repo)] = (f"failed to poll model repository '{repo}': failed to "
                                      f"open directory {repo} ({exc.strerror})")
            continue
        names = (renames or {}).get(Path(repo), {})
        for entry in entries:
            if not entry.is_dir():  # a hidden folder is a model too, as in Triton
                continue
            name = names.get(entry.name, entry.name)
            location = ModelLocation(name, Path(entry.path), Path(repo))
            found.setdefault(name, []).append(location)
            if entry.name in names:
                mapped[name] = location
    # a mapped folder is the model of its name, whatever the repositories hold (Triton looks
    # a load's name up in the mappings before it searches the repositories)
    for name, location in mapped.items():
        found[name] = [location]
    models = {name: locs[0] for name, locs in found.items() if len(locs) == 1}
    duplicates = {
        name: tuple(loc.repository for loc in locs) for name, locs in found.items() if len(locs) > 1
    }
    copies = {name: tuple(locs) for name, locs in found.items()}
    return RepositoryScan(models, duplicates, unreadable, copies)


def scan_bucket(root: CloudRoot) -> list[ModelLocation]:
    """The model folders of a bucket, from one listing of its objects (nothing downloaded).
    Objects directly under the root, and first components that cannot be a model name
    (``.``, ``..``, empty: a key with ``//``), are not models and are skipped; a hidden
    folder is a model, as in Triton. A path in a bucket with nothing under it is no
    repository; the root of a bucket that exists (listed without error) is one, however
    empty, as for Triton's file systems (a server then starts with no model)."""
    objects = open_store(root).list()
    if not objects and root.prefix:
        raise StorageError(f"no object under {root}: the bucket path is empty or missing")
    by_model: dict[str, list[ObjectInfo]] = {}
    for obj in objects:
        first, slash, rest = obj.rel.partition("/")
        if not slash or check_model_name(first) is not None:
            continue
        files = by_model.setdefault(first, [])
        if rest:  # "m/" alone is the model folder's own marker: the folder, nothing in it
            files.append(replace(obj, rel=rest))
    return [ModelLocation(name, Path(root.child_url(name)), root,
                          RemoteModel(root, name, tuple(sorted(files, key=lambda o: o.rel))))
            for name, files in sorted(by_model.items())]


# -- snapshots and changes (poll mode, and "reload only if changed") ------------------------

MAX_FILES_PER_MODEL = 10_000  # a fingerprint never walks an unbounded tree


@dataclass(frozen=True, slots=True)
class ModelFingerprint:
    """What a model folder holds: every file's relative path, size and modification time."""

    files: tuple[tuple[str, int, int | str], ...]

    def same_model_files(self, other: ModelFingerprint, version: int) -> bool:
        """Whether ``version``'s folder and the model's files outside every version folder
        and outside its configuration (``config.pbtxt``, ``configs/``) are unchanged: Triton
        then may apply a new configuration to the serving version in place
        (IsModelVersionModified)."""
        return _version_files(self, version) == _version_files(other, version)


def _version_files(found: ModelFingerprint, version: int) -> set[tuple[str, int, int | str]]:
    mine = str(version)
    out = set()
    for entry in found.files:
        top = entry[0].replace(os.sep, "/").split("/", 1)[0]
        if top in ("config.pbtxt", "configs") or (top.isdigit() and top != mine):
            continue
        out.add(entry)
    return out


def model_fingerprint(location: ModelLocation) -> ModelFingerprint:
    """A model's fingerprint: its folder's files, or for a model in a bucket its listing
    (each object's key, size and ETag or generation: found without downloading)."""
    if location.remote is not None:
        return ModelFingerprint(tuple((o.rel, o.size, o.tag) for o in location.remote.files))
    return fingerprint(location.path)


def fingerprint(model_path: Path) -> ModelFingerprint:
    """A model folder's files (path, size, modification time) and folders (by name)."""
    entries: list[tuple[str, int, int | str]] = []
    stack = [model_path]
    while stack and len(entries) < MAX_FILES_PER_MODEL:
        folder = stack.pop()
        try:
            items = list(os.scandir(folder))
        except OSError:
            continue
        for entry in items:
            if entry.name.startswith("."):
                continue
            try:
                if entry.is_dir():
                    stack.append(Path(entry.path))
                    # a folder counts by its name: a new version folder is a change even while
                    # empty (a Python-based backend's versions need no file), as in Triton
                    entries.append((os.path.relpath(entry.path, model_path) + "/", 0, 0))
                    continue
                st = entry.stat()  # follows symlinks: a replaced target counts as a change
            except OSError:
                continue
            rel = os.path.relpath(entry.path, model_path)
            entries.append((rel, st.st_size, st.st_mtime_ns))
    return ModelFingerprint(tuple(sorted(entries)))


def snapshot(found: RepositoryScan, namespacing: bool = False
             ) -> dict[ModelId, ModelFingerprint]:
    """Every model of a scan and its files, by identifier. Without namespacing a name found
    in more than one repository is left out: Triton serves neither copy, so a model that
    becomes a duplicate is unloaded, and loaded again once one copy is left."""
    return {mid: model_fingerprint(loc) for mid, loc in found.identified(namespacing).items()}


K = TypeVar("K", str, ModelId)


@dataclass(frozen=True, slots=True)
class RepositoryChanges(Generic[K]):
    added: tuple[K, ...]
    changed: tuple[K, ...]
    removed: tuple[K, ...]

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)


def diff(old: Mapping[K, ModelFingerprint], new: Mapping[K, ModelFingerprint]
         ) -> RepositoryChanges[K]:
    return RepositoryChanges(
        added=tuple(sorted(set(new) - set(old))),
        changed=tuple(sorted(n for n in set(new) & set(old) if new[n] != old[n])),
        removed=tuple(sorted(set(old) - set(new))),
    )


MAX_NAME_BYTES = 255  # NAME_MAX of Linux file systems: a model folder's name cannot be longer


def check_model_name(name: str) -> str | None:
    """Why ``name`` cannot be a model name (a single, plain path component), or None. A
    backslash is a plain character of a folder name here, as for Triton on Linux (a Python
    model so named is then refused by its backend, as Triton's refuses it), and so is a
    leading dot: Triton's repository lists every folder but ``.`` and ``..`` (``...`` and
    ``..my_model`` are models; its L0_mlflow deploys them)."""
    if not name:
        return "the model name is empty"
    if name in (".", "..") or "/" in name or "\0" in name:
        return f"'{name}' is not a valid model name: it must be a single folder name"
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        return (f"'{name[:64]}...' is not a valid model name: it is longer than "
                f"{MAX_NAME_BYTES} bytes, the longest folder name a file system allows")
    return None


def safe_relative_path(path: str) -> str | None:
    """``path`` normalised if it stays inside the folder it is relative to, else None."""
    if not path or "\0" in path or path.startswith(("/", "\\")) or ":" in path.split("/")[0]:
        return None
    parts = []
    for part in path.replace("\\", "/").split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            return None
        parts.append(part)
    return "/".join(parts) if parts else None


def override_relative_path(path: str) -> str | None:
    """A ``file:`` override's path inside the model folder, or None when it leaves it.

    Triton joins the key to the folder with its ``JoinPath`` (a leading ``/`` joins, it does
    not make the path absolute: ``file:/1/model.onnx`` is ``1/model.onnx``), then normalises
    the result (``weakly_canonical``: repeated slashes, ``.`` and ``..``) and refuses what
    escapes the folder. The same here, purely on the text: ``..`` may climb back as long as it
    never climbs above the folder."""
    if not path or "\0" in path:
        return None
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
            continue
        parts.append(part)
    return "/".join(parts) if parts else None


def write_override(root: Path, name: str, files: Mapping[str, bytes]) -> ModelLocation:
    """Lay out a load request's ``file:`` overrides as a model folder of their own under
    ``root``, never outside it. Raises Triton's INTERNAL "failed to poll" error for a path that
    leaves the folder or cannot be written."""
    folder = root / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for raw_path, content in files.items():
        rel = override_relative_path(raw_path)
        target = (folder / rel).resolve() if rel else None
        if target is None or folder.resolve() not in target.parents:
            raise InternalError(
                f"failed to load '{name}', failed to poll from model repository: Invalid "
                f"file parameter 'file:{raw_path}' must stay within model directory "
                "(a relative path inside the model folder)")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        except OSError as exc:  # a path that is a file and a folder at once, too long, ...
            raise InternalError(
                f"failed to load '{name}', failed to poll from model repository: file "
                f"parameter 'file:{raw_path[:200]}' cannot be written: "
                f"{exc.strerror or exc}") from None
    return ModelLocation(name, folder, root)
