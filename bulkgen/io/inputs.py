"""Turn INPUT arguments (files, folders, globs, saved datasets) into a list of Sources.

A Source's name prefixes the ids of its rows that have no id column ("<name>:<row>"), so names
are stable: a file's stem, or its path inside the folder or glob it was found through.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bulkgen.errors import UserError

_SUFFIXES = {
    ".jsonl.gz": "jsonl",
    ".jsonl": "jsonl",
    ".parquet": "parquet",
    ".csv": "csv",
    ".csv.gz": "csv",
    ".tsv": "csv",
    ".tsv.gz": "csv",
}
_KNOWN = ".jsonl, .jsonl.gz, .parquet, .csv or .tsv (.gz)"


@dataclass(frozen=True)
class Source:
    name: str
    kind: str  # "jsonl" | "parquet" | "csv" (CSV or TSV) | "arrow" (a saved dataset)
    paths: tuple[Path, ...]  # one file, or a saved dataset's Arrow files in order

    @property
    def label(self) -> str:
        """How error messages name this source."""
        return str(self.paths[0].parent if self.kind == "arrow" else self.paths[0])


def find_sources(inputs: Sequence[str], exclude: str | Path | None = None) -> list[Source]:
    """All sources named by the INPUT arguments, in order; a UserError for anything unusable.

    Files under exclude (the output folder) are left out: a rerun must not read its own shards;
    a file named as it is (not a part-* shard) is read wherever it is (`run p.jsonl -o .`).
    """
    sources: list[Source] = []
    named: set[Path] = set()  # files named as they are: read even inside the output folder
    for arg in inputs:
        if glob.has_magic(arg):
            sources += _from_glob(arg)
        elif os.path.isdir(arg):
            sources += _from_folder(Path(arg), prefix="")
        elif os.path.isfile(arg):
            sources.append(_from_file(Path(arg), name=_strip_suffix(Path(arg).name)))
            if not Path(arg).name.startswith("part-"):  # not one of the job's own shards
                named.add(Path(arg).resolve())
        elif os.path.exists(arg):  # a FIFO, a device: reading it could block, or never end
            raise UserError(f"input {arg} is not a regular file or a folder")
        else:
            raise UserError(f"input {arg} does not exist")
    if exclude is not None:
        out = Path(exclude).resolve()
        sources = [
            s
            for s in sources
            if s.paths[0].resolve() in named or not s.paths[0].resolve().is_relative_to(out)
        ]
        if not sources:
            raise UserError(f"the inputs hold nothing but the output folder {exclude}")
    return _deduplicated(sources)


def _kind(path: Path) -> str | None:
    name = path.name.lower()
    return next((kind for suffix, kind in _SUFFIXES.items() if name.endswith(suffix)), None)


def _strip_suffix(name: str) -> str:
    lower = name.lower()
    suffix = next((s for s in _SUFFIXES if lower.endswith(s)), "")
    return name[: len(name) - len(suffix)]


def _from_file(path: Path, name: str) -> Source:
    kind = _kind(path)
    if kind is None:
        raise UserError(f"input {path}: unknown format; bulkgen reads {_KNOWN} files")
    return Source(name=name, kind=kind, paths=(path,))


def _is_saved_dataset(folder: Path) -> bool:
    return (folder / "state.json").is_file() or (folder / "dataset_dict.json").is_file()


def _from_folder(folder: Path, prefix: str) -> list[Source]:
    if _is_saved_dataset(folder):
        return _saved_dataset(folder, prefix or folder.resolve().name)
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and _kind(p)
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )
    if not files:
        raise UserError(f"input folder {folder} holds no {_KNOWN} files")
    sources = []
    for path in files:
        rel = path.relative_to(folder).as_posix()
        sources.append(_from_file(path, name=prefix + _strip_suffix(rel)))
    return sources


def _from_glob(pattern: str) -> list[Source]:
    matches = sorted(glob.glob(pattern, recursive=True))
    if not matches:
        raise UserError(f"no files match {pattern}")
    # Names are paths below the part of the pattern that has no wildcard.
    parts = Path(pattern).parts
    base = Path(*parts[: next(i for i, p in enumerate(parts) if glob.has_magic(p))] or ["."])
    sources: list[Source] = []
    for match in matches:
        path = Path(match)
        rel = path.relative_to(base).as_posix() if path.is_relative_to(base) else path.name
        if path.is_dir():
            sources += _from_folder(path, prefix=rel + "/")
        elif _kind(path) and path.is_file():  # not a FIFO named *.jsonl (it blocked the run)
            sources.append(_from_file(path, name=_strip_suffix(rel)))
    if not sources:
        raise UserError(f"no {_KNOWN} files match {pattern}")
    return sources


def _saved_dataset(folder: Path, name: str) -> list[Source]:
    """A folder written by datasets' save_to_disk: Arrow stream files listed in state.json, or a
    DatasetDict of such folders. Read with pyarrow alone; the datasets library is not needed."""
    try:
        dict_file = folder / "dataset_dict.json"
        if dict_file.is_file():
            splits = json.loads(dict_file.read_text())["splits"]
            nested = [_saved_dataset(folder / split, f"{name}/{split}") for split in splits]
            return [source for sources in nested for source in sources]
        state = json.loads((folder / "state.json").read_text())
        paths = tuple(folder / f["filename"] for f in state["_data_files"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"input {folder} looks like a saved dataset but cannot be read: {e}") from e
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise UserError(f"saved dataset {folder} lacks its data file {missing[0].name}")
    return [Source(name=name, kind="arrow", paths=paths)]


def _deduplicated(sources: list[Source]) -> list[Source]:
    """Drop a file named twice; refuse two different files whose rows would get the same ids."""
    seen: dict[tuple[str, ...], Source] = {}
    names: dict[str, Source] = {}
    for source in sources:
        key = tuple(str(p.resolve()) for p in source.paths)
        if key in seen:
            continue
        if source.name in names:
            raise UserError(
                f"inputs {names[source.name].label} and {source.label} would both give rows ids "
                f"'{source.name}:<row>'; pass their common folder instead, or rename one"
            )
        seen[key] = names[source.name] = source
    return list(seen.values())
