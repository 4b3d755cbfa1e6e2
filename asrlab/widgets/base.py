"""What every explorer shares: live or static, figures as PNG, the Explorer base, progress bars."""

from __future__ import annotations

import base64
import io
import os
import sys

from ..errors import UsageError

MODE_ENV = "ASRLAB_WIDGETS"


def interactive() -> bool:
    """Whether explorers build widgets here (see ``asrlab.widgets``)."""
    mode = os.environ.get(MODE_ENV, "auto").lower()
    if mode not in ("auto", "live", "static"):
        raise UsageError(f"{MODE_ENV}={mode!r}: expected auto, live or static")
    if mode != "auto":
        return mode == "live"
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if getattr(shell, "kernel", None) is None:  # a terminal, a script, a test: no front end to draw in
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def png(fig) -> bytes:
    """A matplotlib figure as PNG bytes; the figure is closed (a notebook would otherwise draw it again)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def html_escape(text: str) -> str:
    import html

    return html.escape(str(text), quote=False)


class Explorer:
    """An explorer: ``static()`` is what stands in for it headless, ``widget()`` builds its controls.

    ``static()`` returns a list of parts, each PNG bytes (a figure) or a str (HTML). Displaying an
    explorer (the last expression of a cell, or ``show()``) picks the view that fits where it runs.
    """

    def static(self) -> list:
        raise NotImplementedError

    def widget(self):
        raise NotImplementedError

    def show(self) -> None:
        from IPython.display import display

        if interactive():
            box = self.widget()
            bundle = box._repr_mimebundle_()
            # what a viewer without widgets shows instead (a saved notebook on a web page, one papermill ran):
            # every part of the static view, its words too, not the first figure alone
            bundle.update(fallback(self.static()))
            display(bundle, raw=True)
        else:
            display_static(self.static())

    def _ipython_display_(self) -> None:
        self.show()


def fallback(parts: list) -> dict:
    """The static view's parts as one bundle: its pages and figures in order as HTML, the first figure as PNG."""
    figures = [base64.b64encode(p).decode() for p in parts if isinstance(p, bytes)]
    page = "".join(p if isinstance(p, str) else f'<img src="data:image/png;base64,{base64.b64encode(p).decode()}"/>'
                   for p in parts)  # fmt: skip
    return {**({"text/html": page} if page else {}), **({"image/png": figures[0]} if figures else {})}


def display_static(parts: list) -> None:
    from IPython.display import HTML, Image, display

    for p in parts:
        display(Image(data=p, format="png") if isinstance(p, bytes) else HTML(p))


def progress(total: int | None = None, desc: str = "", unit: str = "it"):
    """A progress bar that shows in the page: a widget bar live, a text bar (updated at most every 10 s)
    headless, where each redraw would otherwise add to the executed notebook."""
    if interactive():
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit)
    from tqdm.std import tqdm

    return tqdm(total=total, desc=desc, unit=unit, mininterval=10, file=sys.stdout, ascii=True)
