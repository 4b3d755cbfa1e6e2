"""``asrlab``'s command line as a user meets it: its help, its errors on bad input, its start-up time.

The errors run ``python -m asrlab.cli`` as a user would, so what is checked is the exit code and the one
line on stderr, not an exception inside the test's process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import wave
from pathlib import Path

from asrlab.cli import build_parser
from asrlab.data.shards import tar_bytes


def asrlab(*args, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "asrlab.cli", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


def commands(parser: argparse.ArgumentParser, path=("asrlab",)):
    """``(path, parser, its help line in the parent)`` of every command and nested command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*path, name), sub, helps.get(name)
                yield from commands(sub, (*path, name))


def test_every_command_and_argument_says_what_it_does():
    parser = build_parser()
    missing = []
    for path, sub, help_ in [(("asrlab",), parser, parser.description), *commands(parser)]:
        if not (help_ or "").strip() or not (sub.description or "").strip():
            missing.append(f"command {' '.join(path)}: no help or no description")
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if not (action.help or "").strip():
                missing.append(f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}: no help")
    assert not missing, "\n".join(missing)


def test_the_help_says_what_asrlab_is_for_a_user():
    text = build_parser().format_help()
    assert "``" not in text and "parses arguments" not in text
    assert "speech recognizer" in text and "doctor" in text


def test_help_and_a_wrong_doctor_folder_start_without_torch(tmp_path):
    """Every ``--help``, and ``asrlab doctor`` on a missing or empty folder, answer without importing torch."""
    (tmp_path / "empty").mkdir()
    script = f"""
import contextlib, io, json, sys
from asrlab.cli import build_parser, main
paths = {json.dumps([list(p[1:]) for p, _, _ in commands(build_parser())])}
for path in [[]] + paths:
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(path + ["--help"])
        except SystemExit:
            pass
help_torch = "torch" in sys.modules
err = io.StringIO()
with contextlib.redirect_stderr(err):
    codes = [main(["doctor", {str(tmp_path / "missing")!r}]), main(["doctor", {str(tmp_path / "empty")!r}])]
print(json.dumps({{"help_torch": help_torch, "torch": "torch" in sys.modules, "codes": codes, "err": err.getvalue()}}))
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert not got["help_torch"], "--help imported torch"
    assert not got["torch"], "asrlab doctor on a wrong folder imported torch"
    assert got["codes"] == [2, 2]
    lines = got["err"].splitlines()
    assert (
        lines[0] == f"asrlab: error: {tmp_path / 'missing'}: not a directory, nothing is there (give a run's "
        "folder, what asrlab train got as --exp, or the run's log files)"
    )
    assert lines[1].startswith(f"asrlab: error: {tmp_path / 'empty'}: no run there")


def _wav(path: Path, seconds: float = 0.3, rate: int = 16000) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(rate)
        w.writeframes(bytes(2 * int(seconds * rate)))
    return path


def test_training_on_a_list_of_garbage_names_the_lines_and_why(tmp_path):
    garbage = tmp_path / "garbage.list"
    garbage.write_text("hello world\nfoo bar baz\n\n%%%\n")
    r = asrlab("train", "--data", garbage, "--exp", tmp_path / "exp", "--max-steps", 1)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "vocab_size" not in r.stderr
    assert r.stderr.splitlines()[-1] == (
        f"asrlab: error: no usable utterance in {garbage}: 3 lines, each missing_file (line 1: 'hello world')"
    )
    assert not (tmp_path / "exp" / "units.txt").exists()  # a vocabulary of the blank alone, kept, would fail again


def test_training_on_lines_unusable_for_different_reasons_counts_each(tmp_path):
    lines = [
        {"key": "a", "wav": str(tmp_path / "gone.wav"), "txt": "one"},
        {"key": "b", "wav": str(_wav(tmp_path / "b.wav")), "txt": ""},
        {"key": "c", "wav": str(tmp_path / "gone2.wav"), "txt": "two"},
    ]
    raw = tmp_path / "raw.list"
    raw.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = asrlab("train", "--data", raw, "--exp", tmp_path / "exp", "--max-steps", 1)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[-1] == (
        f"asrlab: error: no usable utterance in {raw}: 3 lines: "
        "2 missing_file (first: line 1), 1 empty_text (first: line 2)"
    )


def test_shards_inspect_names_the_unusable_line(tmp_path):
    shard = tmp_path / "good.tar"
    shard.write_bytes(tar_bytes([("u1.txt", b"one"), ("u1.wav", _wav(tmp_path / "u1.wav").read_bytes())]))
    lst = tmp_path / "data.list"
    lst.write_text(f"{shard}\nthis line is no shard at all\n")
    r = asrlab("shards", "inspect", lst)
    assert r.returncode == 0, r.stderr
    assert "1 usable utterances, 1 unusable" in r.stdout
    assert "unusable: line 2 ('this line is no shard at all'): missing_file" in r.stdout
    r = asrlab("shards", "inspect", lst, "--bad-input", "fail")
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == (
        f"asrlab: error: {lst}: line 2 ('this line is no shard at all'): missing_file "
        "(--bad-input fail; 1 unusable in all)"
    )


def test_decode_on_a_folder_that_is_no_run_says_so(tmp_path):
    r = asrlab("decode", "--exp", tmp_path, "--data", tmp_path / "data.list")
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"asrlab: error: {tmp_path} is not a run folder: it has no config.yaml (asrlab train writes one)"
    )


def test_a_bad_path_under_json_is_answered_in_json(tmp_path, capsys):
    """``asrlab doctor PATH --json`` on nothing there: exit 2, the error on stderr and, for a reader of the JSON,
    as ``{"error": ...}`` on stdout."""
    from asrlab.cli import main

    assert main(["doctor", str(tmp_path / "none"), "--json"]) == 2
    out = capsys.readouterr()
    assert "not a directory" in json.loads(out.out)["error"] and "asrlab: error:" in out.err
