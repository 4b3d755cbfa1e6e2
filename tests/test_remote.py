"""Shards named by URL, served by a local HTTP server on 127.0.0.1 (a thread, stopped after each test):
read as local shards are, a connection cut mid-shard retried from where it broke, a shard that keeps
breaking skipped and counted (or named, under bad_input=fail); the index stamps remote shards too."""

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from asrlab.data import remote
from asrlab.data.index import forget, use_index
from asrlab.data.loader import AsrLoader
from asrlab.data.config import DataConfig
from asrlab.data.shards import write_split
from asrlab.data.sources import DataError, load_sources

from conftest import tone_utts


class Shards(BaseHTTPRequestHandler):
    """GET and HEAD of the files under ``root``; a GET of a name in ``cuts`` sends ``cut_at`` bytes of
    the file and closes the connection, as many times as ``cuts`` says."""

    root: Path
    cuts: Counter
    cut_at = 3000
    gets: Counter

    def _file(self) -> Path | None:
        f = self.root / self.path.lstrip("/")
        return f if f.is_file() else None

    def do_HEAD(self):  # noqa: N802
        f = self._file()
        if f is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(f.stat().st_size))
        self.send_header("ETag", f'"{f.stat().st_mtime_ns}"')
        self.end_headers()

    def do_GET(self):  # noqa: N802
        f = self._file()
        if f is None:
            self.send_error(404)
            return
        data = f.read_bytes()
        self.gets[f.name] += 1
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.cuts[f.name] > 0:
            self.cuts[f.name] -= 1
            self.wfile.write(data[: self.cut_at])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def served(tmp_path, monkeypatch):
    """Two shards of 6 utterances, a local list and a list of their URLs; (url list, local list, handler)."""
    write_split(tone_utts(12), tmp_path, "train", shard_size=6)
    handler = type("H", (Shards,), {"root": tmp_path / "shards", "cuts": Counter(), "gets": Counter()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    names = [Path(p).name for p in (tmp_path / "data.list").read_text().split()]
    (tmp_path / "urls.list").write_text("".join(f"{base}/{n}\n" for n in names))
    monkeypatch.setattr(remote, "BACKOFF_S", 0.01)
    monkeypatch.setattr(remote.RetryingReader.__init__, "__defaults__", (remote.RETRIES, 0.01, remote._fsspec_open))
    forget()
    try:
        yield tmp_path / "urls.list", tmp_path / "data.list", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
        forget()


def read_keys(path, tok, **cfg):
    loader = AsrLoader(load_sources(path), tok, DataConfig(shuffle=False, max_frames_in_batch=2000, **cfg))
    keys = [k for b in loader for k in b["keys"]]
    return keys, loader.skipped()


def test_shards_over_http_read_as_local_ones(served, tok):
    urls, local, handler = served
    assert read_keys(urls, tok) == read_keys(local, tok)
    assert len(read_keys(urls, tok)[0]) == 12 and set(handler.gets) == {"train_000000000.tar", "train_000000001.tar"}
    assert sorted(read_keys(urls, tok, num_workers=2)[0]) == sorted(read_keys(local, tok)[0])  # in worker processes


def test_a_connection_cut_mid_shard_is_retried_from_where_it_broke(served, tok):
    urls, local, handler = served
    handler.cuts["train_000000001.tar"] = 2
    keys, skipped = read_keys(urls, tok)
    assert keys == read_keys(local, tok)[0] and not skipped
    assert handler.gets["train_000000001.tar"] == 3  # two cut, the third whole


def test_a_shard_that_keeps_breaking_follows_the_bad_input_policy(served, tok):
    urls, local, handler = served
    handler.cuts["train_000000001.tar"] = 100
    keys, skipped = read_keys(urls, tok)
    assert skipped == {"remote_read_failed": 1}
    assert set(keys) < set(read_keys(local, tok)[0]) and len(keys) >= 6  # the other shard, and what came before
    # retried RETRIES times in a row where it broke (a read that got some bytes first starts the count again)
    assert remote.RETRIES + 1 <= handler.gets["train_000000001.tar"] <= 2 * (remote.RETRIES + 1)
    handler.cuts["train_000000001.tar"] = 100
    with pytest.raises(DataError, match=r"train_000000001\.tar.*remote_read_failed"):
        read_keys(urls, tok, bad_input="fail")


def test_the_index_of_remote_shards_is_reused_until_one_changes(served):
    urls, _, handler = served
    sources = load_sources(urls)
    first = use_index(urls, sources, processes=1, progress=False)
    assert (first["indexed"], first["utterances"]) == (2, 12)
    forget()
    gets = sum(handler.gets.values())
    again = use_index(urls, sources, progress=False)
    assert (again["indexed"], again["reused"]) == (0, 2) and sum(handler.gets.values()) == gets  # HEADs only
    shard = handler.root / "train_000000000.tar"
    shard.write_bytes(shard.read_bytes())  # a new mtime: a new ETag
    forget()
    assert use_index(urls, sources, progress=False)["indexed"] == 1


def test_a_missing_remote_shard_is_bad_input(served, tok):
    urls, _, _ = served
    urls.write_text(urls.read_text() + urls.read_text().splitlines()[0].rsplit("/", 1)[0] + "/nope.tar\n")
    keys, skipped = read_keys(urls, tok)
    assert len(keys) == 12 and skipped == {"missing_file": 1}
