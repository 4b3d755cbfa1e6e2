"""Minimal ctypes binding to eSpeak NG (the copy bundled by ``espeakng-loader``).

Only what the corpus synthesizer needs: initialize lazily, once per process,
in synchronous mode (no audio device, no threads), select a voice (``"en-us+m3"`` style names: language plus an
optional ``+variant``), set rate / pitch / pitch range, synthesize a string and
collect the int16 samples through the synth callback.

eSpeak NG keeps global state (current voice, parameters, the sample buffer our
callback appends to), so every call is serialized through a module-level lock.

Reproducibility. Two kinds of hidden state make the samples of an utterance
depend on what was synthesized before it in the same process:

* a PRNG for breath / whisper / Klatt noise: re-seeded before every call
  (``seed`` argument; both eSpeak's own generator and libc ``rand``);
* static variables inside the wave generator that no API call resets (the
  pitch-flutter phase, the automatic gain control, a cycle counter ...):
  the same call twice in a row gives a few samples more or less and
  different bytes. The only way to reset them is to unload the library, so
  :func:`reset` calls ``espeak_Terminate``, unloads the library (``dlclose``) and
  loads it again (a few ms in all, most of it eSpeak re-reading the language
  data when the next call selects a voice). To make that possible each load
  opens a private copy of ``libespeak-ng.so`` (a temp file, deleted as soon as
  it is mapped), so nobody else in the process (another package using
  espeakng-loader) holds a handle to it.

So: ``reset()`` followed by a fixed sequence of ``synthesize`` calls always
gives byte-identical samples. :mod:`asrlab.data.synth` resets at the start of
every fixed-size block of utterances.

Extra voice variants. eSpeak reads a variant (``+name``) from the file
``voices/!v/name`` of its data directory when a voice is selected.
:func:`add_variants` makes more variants available (``{name: file text}``):
they go into a private data directory, ``asrlab-espeak-data-<hash>`` in the
temp directory, named by a hash of the bundled data's location and the variant
texts, that links every entry of the bundled ``espeak-ng-data`` and adds the
new files next to links to the bundled variants, as dot files
(``voices/!v/.name``): eSpeak lists every voice file it finds when it first
looks a voice up, in a table of at most 349 entries that the bundled data
fills to 245, and skips dot files, so any number of variants can be added.
``espeak_Initialize`` is then pointed at it (the library is reloaded if it
was loaded with another directory). The bundled voices read the same files
through the links, so they sound exactly as they do from the bundled directory. The directory is made once (written under a temporary name
and renamed into place, so concurrent processes never see half of it) and
reused by later processes.

Example::

    >>> from asrlab.data.espeak import synthesize
    >>> audio, sr = synthesize("three seven nine", voice="en-us+m3")
    >>> audio.dtype, sr
    (dtype('int16'), 22050)
"""

from __future__ import annotations

import _ctypes
import ctypes
import ctypes.util
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

from ..errors import UsageError

import numpy as np

log = logging.getLogger(__name__)

__all__ = [
    "EspeakError",
    "synthesize",
    "reset",
    "sample_rate",
    "list_languages",
    "list_variants",
    "voice_exists",
    "data_path",
    "add_variants",
    "active_data_path",
]

# --- constants from speak_lib.h -------------------------------------------
AUDIO_OUTPUT_SYNCHRONOUS = 2
espeakINITIALIZE_DONT_EXIT = 0x8000
POS_CHARACTER = 1
espeakCHARS_UTF8 = 1
espeakENDPAUSE = 0x1000

espeakRATE = 1
espeakVOLUME = 2
espeakPITCH = 3
espeakRANGE = 4
espeakPUNCTUATION = 5
espeakCAPITALS = 6
espeakWORDGAP = 7

EE_OK = 0

# Allowed parameter ranges (eSpeak clamps some itself, we validate early).
RATE_RANGE = (80, 450)  # words per minute
PITCH_RANGE = (0, 100)  # 50 = voice default
RANGE_RANGE = (0, 100)  # 50 = normal intonation, 0 = monotone


class EspeakError(RuntimeError):
    """eSpeak NG could not be loaded, initialized, or failed to synthesize."""


# --- per-process singleton --------------------------------------------------
_lock = threading.RLock()
_lib: ctypes.CDLL | None = None
_libc: ctypes.CDLL | None = None
_sample_rate: int | None = None
_init_pid: int | None = None
_chunks: list[np.ndarray] = []
_callback_ref = None  # keep the CFUNCTYPE object alive
_current_voice: str | None = None
_warned_in_place = False
_extra_variants: dict[str, str] = {}  # name -> variant file text, see add_variants()
_overlay_path: str | None = None  # private data directory holding _extra_variants
_loaded_data: str | None = None  # data directory the loaded library was initialized with

_SYNTH_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


def _on_samples(wav, numsamples, events):  # called from inside espeak_Synth
    if numsamples > 0 and wav:
        _chunks.append(np.ctypeslib.as_array(wav, shape=(numsamples,)).copy())
    return 0  # 0 = continue synthesis


def _paths() -> tuple[str, str]:
    try:
        import espeakng_loader
    except ImportError as exc:  # pragma: no cover - dependency is required
        raise EspeakError("espeakng-loader is not installed (pip install espeakng-loader)") from exc
    return espeakng_loader.get_library_path(), espeakng_loader.get_data_path()


_VARIANT_NAME_OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def _make_overlay(data: str, variants: dict[str, str]) -> str:
    """A data directory: links to everything in ``data`` plus extra ``voices/!v`` files."""
    import hashlib

    h = hashlib.sha256(os.path.realpath(data).encode())
    for name in sorted(variants):
        h.update(b"\0" + name.encode() + b"\0" + variants[name].encode())
    final = Path(tempfile.gettempdir()) / f"asrlab-espeak-data-{h.hexdigest()[:16]}"
    if (final / ".complete").exists():
        return str(final)
    src = Path(data)
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))
    try:
        for entry in src.iterdir():
            if entry.name != "voices":
                os.symlink(entry.resolve(), tmp / entry.name)
        (tmp / "voices").mkdir()
        for entry in (src / "voices").iterdir():
            if entry.name != "!v":
                os.symlink(entry.resolve(), tmp / "voices" / entry.name)
        vdir = tmp / "voices" / "!v"
        vdir.mkdir()
        for entry in (src / "voices" / "!v").iterdir():
            if entry.name not in variants:
                os.symlink(entry.resolve(), vdir / entry.name)
        for name, text in variants.items():
            # A leading dot keeps the file out of eSpeak's voice list (it skips dot files when
            # listing), which holds at most 349 entries; the bundled data already uses 245.
            (vdir / f".{name}").write_text(text)
        (tmp / ".complete").write_text("")
        tmp.chmod(0o755)
        try:
            os.rename(tmp, final)
        except OSError:  # another process was first; its directory has the same content
            if not (final / ".complete").exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(final)


def add_variants(variants: dict[str, str]) -> None:
    """Make extra voice variants usable as ``<language>+<name>``.

    ``variants`` maps a name (letters, digits, ``_``; not a bundled variant's name)
    to the text of an eSpeak variant file (``formant``, ``pitch``, ``klatt`` ...
    lines, see eSpeak NG's voices documentation). Names already added must keep
    their text. Cheap when nothing new is added, so callers may call it before
    every synthesis.
    """
    global _overlay_path
    new = {}
    for name, text in variants.items():
        if name in _extra_variants:
            if _extra_variants[name] != text:
                raise UsageError(f"variant {name!r} was already added with other settings")
            continue
        if not name or not set(name) <= _VARIANT_NAME_OK:
            raise UsageError(f"variant name {name!r}: use letters, digits and _")
        new[name] = text
    if not new:
        return
    with _lock:
        bundled = set(list_variants())
        clash = sorted(set(new) & bundled)
        if clash:
            raise UsageError(f"variant name(s) {clash} clash with bundled variants")
        _extra_variants.update(new)
        _overlay_path = _make_overlay(_paths()[1], _extra_variants)
        if _lib is not None and _loaded_data != _overlay_path:
            _unload()


def active_data_path() -> str:
    """The data directory eSpeak is (or will be) initialized with: the bundled one or the overlay."""
    return _overlay_path or data_path()


def _open_library() -> ctypes.CDLL:
    """dlopen a private copy of libespeak-ng (copied to a temp file, unlinked once loaded).

    A private copy means this handle is the only one, so ``dlclose`` really unloads
    it and a reload starts from clean static variables. The file is removed right
    after ``dlopen`` (the mapping stays valid), so nothing is left behind.
    """
    src, _ = _paths()
    try:
        fd, tmp = tempfile.mkstemp(prefix="asrlab-espeak-", suffix=".so")
        os.close(fd)
        try:
            shutil.copyfile(src, tmp)
            return ctypes.CDLL(tmp)
        finally:
            os.unlink(tmp)
    except OSError as exc:
        global _warned_in_place
        if not _warned_in_place:
            _warned_in_place = True
            log.warning(
                "espeak: cannot load a private copy of %s (%s); loading it in place, so "
                "reset() may not clear eSpeak's state if another module also loaded it",
                src,
                exc,
            )
    try:
        return ctypes.CDLL(src)
    except OSError as exc:
        raise EspeakError(f"cannot load {src}: {exc}") from exc


def _load() -> ctypes.CDLL:
    global _lib, _libc, _sample_rate, _init_pid, _callback_ref, _current_voice, _loaded_data
    data = active_data_path()
    lib = _open_library()

    lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.espeak_Initialize.restype = ctypes.c_int
    lib.espeak_SetSynthCallback.argtypes = [_SYNTH_CALLBACK]
    lib.espeak_SetSynthCallback.restype = None
    lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
    lib.espeak_SetVoiceByName.restype = ctypes.c_int
    lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.espeak_SetParameter.restype = ctypes.c_int
    lib.espeak_Synth.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_uint,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_uint,
        ctypes.POINTER(ctypes.c_uint),
        ctypes.c_void_p,
    ]
    lib.espeak_Synth.restype = ctypes.c_int
    lib.espeak_Synchronize.argtypes = []
    lib.espeak_Synchronize.restype = ctypes.c_int
    lib.espeak_Terminate.argtypes = []
    lib.espeak_Terminate.restype = ctypes.c_int
    if hasattr(lib, "espeak_ng_SetRandSeed"):
        lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
        lib.espeak_ng_SetRandSeed.restype = None

    sr = lib.espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, data.encode(), espeakINITIALIZE_DONT_EXIT)
    if sr <= 0:
        _ctypes.dlclose(lib._handle)
        raise EspeakError(f"espeak_Initialize failed (returned {sr}), data path {data}")
    if _callback_ref is None:
        _callback_ref = _SYNTH_CALLBACK(_on_samples)
    lib.espeak_SetSynthCallback(_callback_ref)

    if _libc is None:
        libc_name = ctypes.util.find_library("c")
        try:
            _libc = ctypes.CDLL(libc_name) if libc_name else None
        except OSError:  # pragma: no cover
            _libc = None
        if _libc is not None:
            _libc.srand.argtypes = [ctypes.c_uint]
            _libc.srand.restype = None

    _lib, _sample_rate, _init_pid, _current_voice, _loaded_data = lib, sr, os.getpid(), None, data
    log.debug("espeak-ng loaded, data %s, %d Hz", data, sr)
    return lib


def _unload() -> None:
    global _lib, _current_voice
    if _lib is None:
        return
    lib, _lib, _current_voice = _lib, None, None
    lib.espeak_Terminate()
    _ctypes.dlclose(lib._handle)


def _ensure_init() -> ctypes.CDLL:
    """Load the library and call espeak_Initialize once per process."""
    global _init_pid, _current_voice
    if _lib is not None:
        if _init_pid != os.getpid():
            # Forked child: the library state was copied with the process and
            # is usable as is (synchronous mode runs no threads).
            log.debug("espeak: using state inherited from pid %s", _init_pid)
            _init_pid, _current_voice = os.getpid(), None
            _chunks.clear()
        return _lib
    lib = _load()
    log.info("espeak-ng initialized (%d Hz)", _sample_rate)
    return lib


def reset() -> None:
    """Unload and reload eSpeak NG so its internal state is as after start-up.

    After ``reset()``, a given sequence of :func:`synthesize` calls gives
    byte-identical samples, whatever was synthesized before. Not free: the next voice
    selection re-reads the language's data, so callers reset per block, not per call.
    """
    with _lock:
        _unload()
        _load()


def sample_rate() -> int:
    """Native output sample rate of eSpeak NG (22050 Hz)."""
    with _lock:
        _ensure_init()
        assert _sample_rate is not None
        return _sample_rate


def data_path() -> str:
    """Directory of the bundled espeak-ng-data."""
    return _paths()[1]


def list_languages(prefix: str = "") -> list[str]:
    """Language voice names in the bundled data (lower case), e.g. ``en-us``."""
    root = Path(data_path()) / "lang"
    names = sorted(p.name.lower() for p in root.rglob("*") if p.is_file())
    return [n for n in names if n.startswith(prefix.lower())]


def list_variants() -> list[str]:
    """Voice variant names usable after ``+`` (``m3``, ``f2``, ``klatt`` ...)."""
    root = Path(data_path()) / "voices" / "!v"
    return sorted(p.name for p in root.iterdir() if p.is_file())


def voice_exists(voice: str) -> bool:
    """True when ``voice`` (``lang`` or ``lang+variant``) is in the bundled data or added."""
    lang, _, variant = voice.partition("+")
    if lang.lower() not in set(list_languages()):
        return False
    return not variant or variant in _extra_variants or variant in set(list_variants())


def _set_voice(lib: ctypes.CDLL, voice: str) -> None:
    global _current_voice
    if voice == _current_voice:
        return
    lang, plus, variant = voice.partition("+")
    if variant in _extra_variants:
        variant = "." + variant  # see _make_overlay
    rc = lib.espeak_SetVoiceByName(f"{lang}{plus}{variant}".encode())
    if rc != EE_OK:
        _current_voice = None
        raise EspeakError(f"unknown eSpeak voice {voice!r} (error {rc})")
    _current_voice = voice


def _check(name: str, value: int, lo_hi: tuple[int, int]) -> int:
    value = int(value)
    if not lo_hi[0] <= value <= lo_hi[1]:
        raise UsageError(f"{name}={value} outside {lo_hi}")
    return value


def synthesize(
    text: str,
    voice: str = "en-us",
    rate_wpm: int = 175,
    pitch: int = 50,
    pitch_range: int = 50,
    *,
    word_gap: int = 0,
    seed: int = 0,
    fresh: bool = False,
    dtype: str = "int16",
) -> tuple[np.ndarray, int]:
    """Synthesize ``text`` and return ``(samples, sample_rate)``.

    Args:
        text: plain text (UTF-8); no SSML.
        voice: eSpeak voice name, ``"<language>[+<variant>]"``, e.g. ``"en-us+m3"``.
        rate_wpm: speaking rate in words per minute (80..450, default 175).
        pitch: base pitch, 0..100 (50 = the voice's default).
        pitch_range: intonation range, 0..100 (0 = monotone, 50 = normal).
        word_gap: extra pause between words in units of 10 ms.
        seed: seed for eSpeak's internal noise generator (breathy/whisper/klatt
            voices).
        fresh: call :func:`reset` first, so the result does not depend on what
            was synthesized before (at the cost of a reload). Without it, repeating a call
            can give slightly different samples (see the module docstring).
        dtype: ``"int16"`` (raw samples) or ``"float32"`` (scaled to [-1, 1)).

    Returns:
        1-D numpy array and the sample rate (22050 Hz for eSpeak NG).
    """
    rate_wpm = _check("rate_wpm", rate_wpm, RATE_RANGE)
    pitch = _check("pitch", pitch, PITCH_RANGE)
    pitch_range = _check("pitch_range", pitch_range, RANGE_RANGE)
    if dtype not in ("int16", "float32"):
        raise UsageError(f"dtype must be 'int16' or 'float32', not {dtype!r}")
    data = text.encode("utf-8") + b"\0"
    with _lock:
        if fresh:
            reset()
        lib = _ensure_init()
        _set_voice(lib, voice)
        # Parameters are set on every call: voice changes may reset them.
        lib.espeak_SetParameter(espeakRATE, rate_wpm, 0)
        lib.espeak_SetParameter(espeakPITCH, pitch, 0)
        lib.espeak_SetParameter(espeakRANGE, pitch_range, 0)
        lib.espeak_SetParameter(espeakWORDGAP, int(word_gap), 0)
        lib.espeak_SetParameter(espeakVOLUME, 100, 0)
        s = int(seed) & 0x7FFFFFFF
        if hasattr(lib, "espeak_ng_SetRandSeed"):
            lib.espeak_ng_SetRandSeed(s)
        if _libc is not None:
            _libc.srand(s)
        _chunks.clear()
        buf = ctypes.create_string_buffer(data)
        rc = lib.espeak_Synth(buf, len(data), 0, POS_CHARACTER, 0, espeakCHARS_UTF8, None, None)
        if rc != EE_OK:
            _chunks.clear()
            raise EspeakError(f"espeak_Synth failed with error {rc} for {text!r}")
        lib.espeak_Synchronize()
        audio = np.concatenate(_chunks) if _chunks else np.zeros(0, np.int16)
        _chunks.clear()
        sr = _sample_rate
    assert sr is not None
    audio = audio.astype(np.int16, copy=False)
    if dtype == "float32":
        return audio.astype(np.float32) / 32768.0, sr
    return audio, sr
