"""Paths that may be local or on another filesystem (gs://, hdfs://, s3://): local paths go
through the standard library, the others through tf.io.gfile, imported only for them, so that
the streaming data creation (no process of it imports TensorFlow) and the scripts share one
implementation."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

from data_prep.errors import input_error


def is_url(path: str) -> bool:
    return "://" in path


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def expand_input_files(pattern: str) -> list[str]:
    """Expands a comma list of files or globs, as the original `--input_file` flag; keeps order.

    Raises InputError naming the part that matches no existing file.
    """
    files: list[str] = []
    for part in (p.strip() for p in pattern.split(",")):
        if not part:
            continue
        if is_url(part):
            gfile = _gfile()
            matched = sorted(gfile.glob(part)) if any(c in part for c in "*?[") else [part]
            exists = all(gfile.exists(f) and not gfile.isdir(f) for f in matched)
        else:
            matched = sorted(glob.glob(part)) if any(c in part for c in "*?[") else [part]
            exists = all(os.path.isfile(f) for f in matched)
        if not matched or not exists:
            raise input_error(part, "an existing file or a glob that matches files", "nothing")
        files.extend(matched)
    if not files:
        raise input_error(repr(pattern), "a comma list of files or globs", "an empty list")
    return files


def open_file(path: str, mode: str = "rb"):
    return _gfile().GFile(path, mode) if is_url(path) else open(path, mode)


def file_size(path: str) -> int:
    return _gfile().stat(path).length if is_url(path) else os.path.getsize(path)


def bytes_bar(paths: Sequence[str], desc: str, **options):
    """A progress bar (tqdm, on stderr) over the total size of the files at `paths`, in bytes:
    the rate and the time left of a data script that reads them (update it with the bytes
    read). `options` go to tqdm."""
    from tqdm import tqdm

    options.setdefault("mininterval", 2.0)
    total = sum(file_size(path) for path in paths)
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, **options)


def makedirs(folder: str) -> None:
    if is_url(folder):
        _gfile().makedirs(folder)
    else:
        os.makedirs(folder, exist_ok=True)


def make_parent_folders(paths: Sequence[str]) -> None:
    """Creates the folder of each path that names one (the scripts' --output_file lists)."""
    for folder in {os.path.dirname(path) for path in paths} - {""}:
        makedirs(folder)


def replace_files(temporary: Sequence[str], final: Sequence[str]) -> None:
    """Renames each temporary file onto its final name, replacing what is there."""
    for tmp, path in zip(temporary, final, strict=True):
        if is_url(path):
            _gfile().rename(tmp, path, overwrite=True)
        else:
            os.replace(tmp, path)


def remove_files(paths: Sequence[str]) -> None:
    """Removes the files of `paths` that exist."""
    for path in paths:
        if is_url(path):
            if _gfile().exists(path):
                _gfile().remove(path)
        elif os.path.exists(path):
            os.remove(path)


def write_atomically(outputs: Sequence[str], write) -> int:
    """Runs `write(temporary_paths) -> count` on temporary names beside `outputs` and renames
    them into place only when it returned a count above 0: a failed or empty run leaves no
    partial file and replaces nothing. Returns the count (0: nothing was written)."""
    tmp = [f"{p}.tmp{os.getpid()}" for p in outputs]
    try:
        n = write(tmp)
    except BaseException:
        remove_files(tmp)
        raise
    if n == 0:
        remove_files(tmp)
        return 0
    replace_files(tmp, outputs)
    return n
