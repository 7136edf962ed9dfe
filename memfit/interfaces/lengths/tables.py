"""--lengths DATA from columnar data: a Parquet file, a dataset saved with `datasets`' save_to_disk (a folder),
or a dataset name `datasets` resolves (its own cache and HF_HUB_OFFLINE / HF_DATASETS_OFFLINE apply).

pyarrow and datasets are optional (memfit[data]) and imported here only. Columns holding token ids are reduced
to their lengths by Arrow (no Python lists of ids); the rows then go through read.py's row rules, so a column
table reads like the same data written as JSONL."""
from __future__ import annotations

from pathlib import Path

from memfit.errors import MemfitError

INSTALL = "install memfit[data] (pyarrow, datasets, tokenizers)"
# columns read.py's rules look at; the rest (images, ids, metadata) are never loaded into Python
COLUMNS = ("length", "input_ids", "chosen_length", "rejected_length", "chosen_input_ids", "rejected_input_ids",
           "text", "prompt", "completion", "messages", "chosen", "rejected")
SPLIT = "train"  # the split a trainer trains on


def is_saved_dataset(path: Path) -> bool:
    """A folder written by Dataset.save_to_disk (state.json) or DatasetDict.save_to_disk (dataset_dict.json)."""
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def parquet_rows(path: str) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MemfitError(f"{path}: reading Parquet needs pyarrow; {INSTALL}") from None
    try:
        names = pq.read_schema(path).names
        table = pq.read_table(path, columns=_kept(path, names))
    except MemfitError:
        raise
    except Exception as e:  # noqa: BLE001 - Arrow's many error types: one line naming the file
        raise MemfitError(f"{path}: not a readable Parquet file ({_first_line(e)})") from None
    return table_rows(path, table)


def _kept(source: str, names: list[str]) -> list[str]:
    keep = [c for c in names if c in COLUMNS]
    if not keep:
        raise MemfitError(f"{source}: no column memfit reads (one of: {', '.join(COLUMNS)}); it has "
                          f"{', '.join(names[:8]) or 'none'}")
    return keep


def saved_dataset_rows(path: str) -> list[dict]:
    datasets = _datasets(path)
    try:
        data = datasets.load_from_disk(path)
    except Exception as e:  # noqa: BLE001
        raise MemfitError(f"{path}: not a dataset saved with save_to_disk ({_first_line(e)})") from None
    return table_rows(path, _arrow(path, _train_split(path, data, datasets)))


def named_dataset_rows(name: str) -> list[dict]:
    """A dataset name (`org/name`, optionally `org/name:split`), loaded by `datasets` the way a trainer would."""
    datasets = _datasets(name)
    repo, _, split = name.partition(":")
    try:
        data = datasets.load_dataset(repo, split=split or SPLIT)
    except Exception as e:  # noqa: BLE001 - offline, unknown, gated, no such split: the library says which
        raise MemfitError(f"--lengths {name}: not a file, and `datasets` could not load it as a dataset name "
                          f"({type(e).__name__}: {_first_line(e)}); give a file of lengths, JSONL, Parquet or a "
                          "save_to_disk folder") from None
    return table_rows(name, _arrow(name, data))


def _datasets(source: str):
    try:
        import datasets
    except ImportError:
        raise MemfitError(f"{source}: reading a Hugging Face dataset needs the datasets library; {INSTALL}") from None
    datasets.disable_progress_bars()  # memfit prints its own lines; bars on stderr would break a one-line error
    return datasets


def _train_split(path: str, data, datasets):
    if isinstance(data, datasets.DatasetDict):
        if SPLIT not in data:
            raise MemfitError(f"{path}: a DatasetDict without a {SPLIT!r} split (it has: {', '.join(data)})")
        return data[SPLIT]
    return data


def _arrow(source: str, data):
    """The dataset's rows as an Arrow table (its indices mapping applied), only the columns read.py looks at."""
    return data.select_columns(_kept(source, data.column_names)).with_format("arrow")[:]


def table_rows(source: str, table) -> list[dict]:
    """Rows as dicts; columns of token ids become their lengths (Arrow counts them)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows == 0:
        raise MemfitError(f"{source}: no rows")
    columns = {}
    for name in table.column_names:
        col = table.column(name)
        if name.endswith("input_ids") and (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
            col = pc.list_value_length(col)
        columns[name] = col.to_pylist()
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]
