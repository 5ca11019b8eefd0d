"""Any dataset as a task (task=dataset): a folder written by `save_to_disk`, JSON, JSONL or Parquet
files (or a folder of them), or a hub id, read with the `datasets` package, its columns mapped to a
question's fields by `task.columns`.

`datasets` is imported here only, when such a task loads: runs of the other tasks never need it.
Every failure is one SettingsError (MissingFileError for what is not there) that names the fix.
"""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path

from specbench.errors import MissingFileError, SettingsError, SpecbenchError
from specbench.inputs.questions import Question, checked_question

FIELDS = ("turns", "question_id", "category", "subtask", "system")
FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}
FIX_OFFLINE = ("on a machine with network, datasets.load_dataset(...).save_to_disk(<folder>), copy the folder "
               "here and pass task.path=<folder>")


def _datasets():
    try:
        import datasets
    except ImportError:
        raise SettingsError("task=dataset needs the datasets package: pip install datasets "
                            "(pip install -e . brings it)") from None
    # a task loads while the settings are checked: bars and notices there would bury the one error line
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def column_map(columns) -> dict:
    """{field: column or None} for every field; a key that is no field is refused naming the fields."""
    if columns is None:
        columns = {}
    if not isinstance(columns, Mapping):
        raise SettingsError(f"task.columns must map fields to columns (e.g. {{turns: text}}), got {columns!r}; "
                            f"fields: {', '.join(FIELDS)}")
    unknown = [str(k) for k in columns if k not in FIELDS]
    if unknown:
        raise SettingsError(f"task.columns names {', '.join(unknown)}, which is no field of a question; "
                            f"fields: {', '.join(FIELDS)}")
    named = {f: columns.get(f) for f in FIELDS}
    bad = [f for f, c in named.items() if c is not None and not (isinstance(c, str) and c)]
    if bad:
        raise SettingsError(f"task.columns.{bad[0]} must be a column name, got {named[bad[0]]!r}")
    return named


def _data_files(folder: Path) -> tuple[str, list[str]]:
    """The format and files of a folder of JSON/JSONL/Parquet files (searched recursively)."""
    files = sorted(p for p in folder.rglob("*") if p.suffix in FORMATS and p.is_file())
    formats = {FORMATS[p.suffix] for p in files}
    if not files:
        raise MissingFileError(f"task.path '{folder}' holds no dataset: neither a folder written by save_to_disk "
                               f"nor any .json, .jsonl or .parquet file")
    if len(formats) > 1:
        raise SettingsError(f"task.path '{folder}' mixes JSON and Parquet files; point it at one kind")
    return formats.pop(), [str(p) for p in files]


def _one_split(loaded, split: str | None, where: str):
    """A Dataset out of what was loaded: the named split, else the only one."""
    datasets = _datasets()
    if isinstance(loaded, datasets.Dataset):
        if split is not None and loaded.split is not None and str(loaded.split) != split:
            raise SettingsError(f"task.split={split}, but {where} holds the split {loaded.split} alone; "
                                f"leave task.split unset")
        return loaded
    splits = list(loaded)
    if split is None and len(splits) == 1:
        return loaded[splits[0]]
    if split in splits:
        return loaded[split]
    ask = f"task.split={split} is not one of them" if split else "set task.split=<one of them>"
    raise SettingsError(f"{where} has the splits {', '.join(splits)}; {ask}")


def _reason(e: Exception) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 300 else text[:300] + "..."


def _hub_unreachable() -> str | None:
    """Why the hub cannot be reached, or None. Without network the hub client retries for half a
    minute, printing as it goes; this asks once, in seconds. In offline mode the cache answers."""
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return None
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=5).close()
    except OSError as e:
        return f"{url.hostname}: {_reason(e)}"
    return None


def _loaded(path: str, split: str | None):
    """The Dataset at `path`: a save_to_disk folder, local files, else a hub id."""
    datasets = _datasets()
    local = Path(path).expanduser()
    where = f"task.path '{path}'"
    if local.is_dir() and any((local / f).is_file() for f in ("dataset_dict.json", "state.json")):
        try:
            return _one_split(datasets.load_from_disk(str(local)), split, where)
        except SpecbenchError:
            raise
        except Exception as e:  # a damaged folder: datasets raises from arrow, json or fsspec
            raise SettingsError(f"{where}: the folder written by save_to_disk cannot be read ({_reason(e)}); "
                                f"save it again") from None
    if local.is_file() or local.is_dir():
        if local.is_file() and local.suffix not in FORMATS:
            raise SettingsError(f"{where}: a {local.suffix or 'suffixless'} file; task=dataset reads .json, .jsonl "
                                f"and .parquet files, or a folder written by save_to_disk")
        fmt, files = (FORMATS[local.suffix], [str(local)]) if local.is_file() else _data_files(local)
        # a throwaway cache, the rows kept in memory: an edited file is never answered from a stale copy
        with tempfile.TemporaryDirectory(prefix="specbench-dataset-") as cache:
            try:
                loaded = datasets.load_dataset(fmt, data_files=files, cache_dir=cache, keep_in_memory=True)
            except Exception as e:  # malformed JSON or Parquet: datasets wraps arrow's errors
                raise SettingsError(f"{where}: cannot be read as {fmt} ({_reason(e)})") from None
        return _one_split(loaded, split, where)
    # what cannot be a hub id (owner/name) was meant as a local path
    if local.is_absolute() or path.startswith((".", "~")) or path.count("/") > 1 or local.suffix in FORMATS:
        raise MissingFileError(f"{where} not found: give a local folder or file, or a hub id (owner/name)")
    unreachable = _hub_unreachable()
    if unreachable:
        raise MissingFileError(f"{where}: no such local folder or file, and the hub is unreachable ({unreachable}); "
                               f"a hub dataset fetched here before loads with HF_HUB_OFFLINE=1, else {FIX_OFFLINE}")
    try:
        loaded = datasets.load_dataset(path)
    except Exception as e:  # unknown id, gated, offline: the hub's reasons come in many types
        raise MissingFileError(f"{where}: no such local folder or file, and the hub could not give it "
                               f"({_reason(e)}); {FIX_OFFLINE}") from None
    return _one_split(loaded, split, f"dataset '{path}'")


def load_dataset_questions(path: str, columns=None, split: str | None = None) -> list[Question]:
    """The dataset at `path` as questions. A field's column defaults to the field's own name where the
    dataset has one; else the question id is the row number, the category 'default', the subtask
    Spec-Bench's column of the category and no system prompt. turns (required) may hold a string or a
    list of strings."""
    named = column_map(columns)
    ds = _loaded(str(path), split)
    present = list(ds.column_names)
    missing = [c for c in named.values() if c is not None and c not in present]
    if missing:
        raise SettingsError(f"task.columns names column(s) {', '.join(missing)}, which {path} does not have; "
                            f"its columns: {', '.join(present)}")
    use = {f: named[f] or (f if f in present else None) for f in FIELDS}
    if use["turns"] is None:
        raise SettingsError(f"{path} has no column 'turns'; set task.columns.turns=<the column holding the "
                            f"prompts>; its columns: {', '.join(present)}")
    rows = ds.to_list()
    if not rows:
        raise SettingsError(f"{path}: no rows in the dataset")
    seen: dict = {}
    return [checked_question(f"{path} row {i}", f"row {i}", row[use["question_id"]] if use["question_id"] else i,
                             _field(row, use, "category"), row[use["turns"]], _field(row, use, "subtask"), seen,
                             turns_name=f"column '{use['turns']}'", system=_field(row, use, "system"))
            for i, row in enumerate(rows)]


def _field(row: dict, use: dict, field: str):
    return row[use[field]] if use[field] else None
