"""``asrlab shards pack``: WeNet-layout shards from what a user has (a Kaldi dir, a raw list, a NeMo
manifest, or shards to re-pack in another compression), one process per source, each shard read back
and compared with what went in before the list names it.

Each source becomes its own shards (``shards/<name>_<source>_<n>.tar[.gz|...]``, ``shard_size``
utterances each), so the work splits across processes and the output does not depend on their number.
Members keep their audio's format (``KEY.wav``, ``KEY.flac``, ...; an utterance cut from a longer
recording is written as WAV); unusable items follow ``bad_input`` and are counted by reason.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import soundfile as sf

from ..errors import UsageError
from .shards import COMPRESSIONS, compress, tar_bytes
from .sources import DataError, Source, bad_input, load_sources, read_source

_EXT = {"WAV": "wav", "FLAC": "flac", "OGG": "ogg", "MP3": "mp3"}


def _ext(data: bytes) -> str | None:
    try:
        fmt = sf.info(io.BytesIO(data)).format
    except Exception:  # soundfile raises several types
        return None
    return _EXT.get(fmt, "wav" if fmt.startswith("WAV") else None)


def _pack_source(args) -> dict:
    i, src, out, name, shard_size, compression, policy = args
    skipped: Counter = Counter()
    members, written, want = [], [], []
    count = 0

    def flush():
        path = (
            out
            / "shards"
            / (f"{name}_{i:05d}_{len(written):04d}.tar" + ("" if compression == "none" else f".{compression}"))
        )
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(compress(tar_bytes(members), compression))
        got = [
            (it.key, it.text, hashlib.sha256(it.audio).hexdigest() if it.audio else None)
            for it in read_source(Source(tmp.name, str(tmp)))
        ]
        if got != want:
            tmp.unlink()
            raise DataError(
                f"{path}: read back, it does not hold what was written ({len(got)} utterances of {len(want)})"
            )
        os.replace(tmp, path)
        written.append(str(path))
        members.clear()
        want.clear()

    for item in read_source(src):
        ext = _ext(item.audio) if item.audio is not None else None
        reason = (
            item.error
            or (None if item.text and item.text.strip() else "empty_text")
            or (None if ext else "undecodable_audio")
        )
        if reason is not None:
            bad_input(item.where, reason, policy, skipped)
            continue
        text = item.text.strip()  # as a shard's reader gives it back
        members += [(f"{item.key}.txt", text.encode("utf-8")), (f"{item.key}.{ext}", item.audio)]
        count += 1
        want.append((item.key, text, hashlib.sha256(item.audio).hexdigest()))
        if len(want) == shard_size:
            flush()
    if want:
        flush()
    return {"shards": written, "utterances": count, "skipped": dict(skipped)}


def pack(
    data: str | Path,
    out: str | Path,
    shard_size: int = 1000,
    compression: str = "none",
    processes: int | None = None,
    bad_input_policy: str = "skip",
    progress=None,
) -> dict:
    """Pack ``data`` into shards under ``out`` (``out/shards/``, ``out/data.list``); returns a summary:
    shards, utterances, skipped by reason, the list's path."""
    if shard_size < 1:
        raise UsageError("shard_size must be at least 1")
    if compression not in COMPRESSIONS:
        raise UsageError(f"unknown compression {compression!r}; choose from {', '.join(COMPRESSIONS)}")
    sources = load_sources(data)
    out = Path(out).resolve()
    (out / "shards").mkdir(parents=True, exist_ok=True)
    name = Path(data).stem.replace(".", "_") or "data"
    jobs = [(i, s, out, name, shard_size, compression, bad_input_policy) for i, s in enumerate(sources)]
    n = processes or min(len(jobs), os.cpu_count() or 1)
    bar = progress(total=len(jobs), desc=f"pack {Path(data).name}", unit="source") if progress else None
    results = []
    try:
        if n <= 1:
            runs = map(_pack_source, jobs)
            for r in runs:
                results.append(r)
                if bar:
                    bar.update(1)
        else:
            with ProcessPoolExecutor(n) as pool:
                for r in pool.map(_pack_source, jobs):
                    results.append(r)
                    if bar:
                        bar.update(1)
    finally:
        if bar:
            bar.close()
    shards = [p for r in results for p in r["shards"]]
    (out / "data.list").write_text("".join(f"{p}\n" for p in shards))
    skipped: Counter = Counter()
    for r in results:
        skipped.update(r["skipped"])
    return {
        "list": str(out / "data.list"),
        "sources": len(sources),
        "shards": len(shards),
        "utterances": sum(r["utterances"] for r in results),
        "skipped": dict(skipped),
    }


__all__ = ["pack"]
