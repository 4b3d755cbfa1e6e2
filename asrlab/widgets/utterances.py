"""The decoded utterances, one at a time: listen, look at the fbank, see which characters went wrong."""

from __future__ import annotations

from pathlib import Path

from ..data import audio
from ..data.sources import iter_items, load_sources
from ..data.synth import voice_of
from ..decode import read_hyps
from ..scoring import align, edit_distance
from .base import Explorer, html_escape, png

STYLE = (
    "<style>.asrlab-utt td{padding:2px 8px;vertical-align:top;text-align:left}"
    ".asrlab-utt .s{background:#ffe08a}.asrlab-utt .i{background:#a8d8ff}"
    ".asrlab-utt .d{background:#ffb3b3;text-decoration:line-through}"
    ".asrlab-utt code{font-size:13px}</style>"
)
LEGEND = (
    '<span class="asrlab-utt"><span class="s">substituted</span> <span class="i">inserted</span> '
    '<span class="d">missing</span> (the reference\'s character, struck through)</span>'
)


def marked(ref: str, hyp: str) -> str:
    """``hyp`` as HTML with its character errors against ``ref`` marked (``asrlab.scoring.align``)."""

    def ch(c: str) -> str:  # a space stays visible, and wide enough to be marked
        return "&nbsp;" if c == " " else html_escape(c)

    out = []
    for op, r, h in align(ref, hyp):
        if op == "=":
            out.append(ch(h))
        elif op == "S":
            out.append(f'<span class="s" title="reference: {html_escape(repr(r))}">{ch(h)}</span>')
        elif op == "I":
            out.append(f'<span class="i">{ch(h)}</span>')
        else:
            out.append(f'<span class="d">{ch(r)}</span>')
    return "".join(out)


class UtteranceBrowser(Explorer):
    """Decoded utterances of ``data`` (the list that was decoded): reference, greedy and lexicon
    hypotheses (``asrlab decode``'s files) with the character errors marked, the audio and its fbank;
    filters for errors only and, on the embedded corpus, by accent and voice variant.

    Headless: a table of the first ``static_rows`` utterances with errors. At most ``max_utts``
    utterances are browsed (those with errors first); their audio is read once, up front.
    """

    def __init__(
        self,
        data: str | Path,
        greedy: str | Path,
        lexicon: str | Path | None = None,
        max_utts: int = 2000,
        static_rows: int = 12,
    ):
        g = read_hyps(greedy)
        lx = read_hyps(lexicon) if lexicon else {}
        self.rows = []
        for key, (ref, hyp) in g.items():
            voice = voice_of(key) or {}
            lex = lx.get(key, (ref, None))[1]
            self.rows.append(
                {
                    "key": key,
                    "ref": ref,
                    "greedy": hyp,
                    "lexicon": lex,
                    "greedy_errors": edit_distance(ref, hyp),
                    "lexicon_errors": edit_distance(ref, lex) if lex is not None else None,
                    "accent": voice.get("accent"),
                    "variant": voice.get("variant"),
                }
            )
        self.total = len(self.rows)
        self.rows.sort(key=lambda r: (not self._errors(r), r["key"]))
        self.rows = self.rows[:max_utts]
        wanted = {r["key"] for r in self.rows}
        self.audio = {it.key: it.audio for it in iter_items(load_sources(data)) if it.key in wanted}
        self.static_rows = static_rows

    @staticmethod
    def _errors(r: dict) -> int:
        """The errors of the final answer: the lexicon search's where there is one, else greedy's."""
        return r["lexicon_errors"] if r["lexicon_errors"] is not None else r["greedy_errors"]

    def select(self, errors_only: bool = False, accent: str | None = None, variant: str | None = None) -> list[dict]:
        return [
            r
            for r in self.rows
            if (not errors_only or self._errors(r))
            and (accent in (None, r["accent"]))
            and (variant in (None, r["variant"]))
        ]

    def table_html(self, rows: list[dict]) -> str:
        has_lex = any(r["lexicon"] is not None for r in rows)
        td = '<td style="text-align:left;vertical-align:top">'  # inline: notebook front ends right-align tables
        head = '<tr><th style="text-align:left">utterance</th><th></th><th style="text-align:left">text</th></tr>'
        body = []
        for r in rows:
            lines = [
                ("reference", html_escape(r["ref"]).replace(" ", "&nbsp;")),
                (f"greedy ({r['greedy_errors']})", marked(r["ref"], r["greedy"])),
            ]
            if has_lex and r["lexicon"] is not None:
                lines.append((f"lexicon ({r['lexicon_errors']})", marked(r["ref"], r["lexicon"])))
            voice = f"<br><small>{r['accent']} / {r['variant']}</small>" if r["accent"] else ""
            for i, (name, text) in enumerate(lines):
                first = (
                    f'{td[:-1]} rowspan="{len(lines)}"><code>{html_escape(r["key"])}</code>{voice}</td>'
                    if i == 0
                    else ""
                )
                body.append(f"<tr>{first}{td}<small>{name}</small></td>{td}<code>{text}</code></td></tr>")
        return f'{STYLE}<table class="asrlab-utt">{head}{"".join(body)}</table>'

    def summary(self) -> str:
        wrong = sum(1 for r in self.rows if self._errors(r))
        shown = f" (browsing {len(self.rows)})" if len(self.rows) < self.total else ""
        return f"{wrong} of {self.total} utterances{shown} have a character error"

    def static(self) -> list:
        wrong = self.select(errors_only=True)[: self.static_rows]
        return [f"<p>{self.summary()}; the first {len(wrong)}: {LEGEND}</p>" + self.table_html(wrong)]

    def fbank_png(self, key: str) -> bytes:
        from .. import plots  # matplotlib: the notebooks extra

        wav, sr = audio.decode(self.audio[key])
        return png(plots.spectrogram(audio.fbank(wav, sr).numpy(), title=key))

    def wav(self, key: str) -> bytes:
        """The utterance as 16 kHz WAV bytes, whatever it was stored as."""
        wav, sr = audio.decode(self.audio[key])
        return audio.encode_wav(audio.resample(wav, sr, 16000).numpy(), 16000)

    def widget(self):
        import ipywidgets as w

        accents = sorted({r["accent"] for r in self.rows if r["accent"]})
        variants = sorted({r["variant"] for r in self.rows if r["variant"]})
        self.errors_only = w.Checkbox(
            value=any(self._errors(r) for r in self.rows), description="errors only", indent=False
        )
        self.accent = w.Dropdown(options=[("all accents", None)] + [(a, a) for a in accents], description="accent")
        self.variant = w.Dropdown(options=[("all voices", None)] + [(v, v) for v in variants], description="voice")
        self.pick = w.Select(options=[], rows=8, layout=w.Layout(width="360px"))
        self.count = w.HTML()
        self.text = w.HTML()
        self.player = w.Audio(format="wav", autoplay=False, controls=True)
        self.picture = w.Image(format="png", layout=w.Layout(max_width="100%"))

        def refilter(_=None):
            rows = self.select(self.errors_only.value, self.accent.value, self.variant.value)
            self.count.value = f"<b>{len(rows)}</b> of {self.total} utterances match; {self.summary()}"
            self.pick.options = [(f"{r['key']}  ({self._errors(r)} errors)", r["key"]) for r in rows]
            self.pick.value = rows[0]["key"] if rows else None
            if not rows:
                self.text.value, self.player.value, self.picture.value = "<i>no utterance matches</i>", b"", b""

        def show(_=None):
            key = self.pick.value
            if key is None:
                return
            row = next(r for r in self.rows if r["key"] == key)
            self.text.value = f"{LEGEND}{self.table_html([row])}"
            if key in self.audio:
                self.player.value = self.wav(key)
                self.picture.value = self.fbank_png(key)

        for c in (self.errors_only, self.accent, self.variant):
            c.observe(refilter, names="value")
        self.pick.observe(show, names="value")
        refilter()
        filters = [self.errors_only] + ([self.accent, self.variant] if accents else [])
        box = w.VBox([w.HBox(filters), self.count, w.HBox([self.pick, w.VBox([self.text, self.player])]), self.picture])
        box.add_class("asrlab-utterances")
        return box
