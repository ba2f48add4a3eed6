"""data_prep/files.py: the local side of the local-or-URL path helpers (no filesystem with a
scheme is reachable here)."""

import pytest

from data_prep import files
from data_prep.errors import InputError
from tests import helpers


def test_expand_input_files_keeps_order_sorts_globs_and_names_what_is_missing(tmp_path):
    for name in ("b.txt", "a.txt", "c.txt"):
        (tmp_path / name).write_text("x\n")
    (tmp_path / "d.txt").mkdir()  # a folder matching the glob is not an input file
    got = files.expand_input_files(f"{tmp_path / 'c.txt'}, {tmp_path / '[ab].txt'}")
    assert got == [str(tmp_path / n) for n in ("c.txt", "a.txt", "b.txt")]
    for bad in (tmp_path / "missing.txt", tmp_path / "*.none", tmp_path / "d.txt"):
        with pytest.raises(InputError, match="an existing file or a glob"):
            files.expand_input_files(str(bad))
    with pytest.raises(InputError, match="an empty list"):
        files.expand_input_files(" , ")


def test_local_paths_never_import_tensorflow(tmp_path):
    # Streaming data creation relies on it: its processes must not import TensorFlow.
    code = (
        "import sys\n"
        "from data_prep import files\n"
        f"d = {str(tmp_path)!r} + '/out/sub'\n"
        "files.makedirs(d)\n"
        "with files.open_file(d + '/a.tmp', 'wb') as f: f.write(b'abc')\n"
        "files.replace_files([d + '/a.tmp'], [d + '/a'])\n"
        "assert files.file_size(d + '/a') == 3\n"
        "assert files.expand_input_files(d + '/*') == [d + '/a']\n"
        "files.remove_files([d + '/a', d + '/never'])\n"
        "assert 'tensorflow' not in sys.modules\n"
    )
    helpers.run_python(code)
    assert not (tmp_path / "out/sub/a").exists()
