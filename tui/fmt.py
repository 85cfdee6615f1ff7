"""Small renderers shared by the views: bars, sparklines, state codes, durations (Rich text only)."""

from __future__ import annotations

from rich.text import Text

from hsched.theme import LINK_COLOR, NODE_STYLE, link_color, load_color, state_code, state_color

SPARK = "▁▂▃▄▅▆▇█"

# Link classes as nvidia-smi's legend ranks them, best first. The colours belong in hsched/theme.py
# next to the state colours (asked for in the dashboard's report); kept here until then.
# LINK_COLOR and link_color come from hsched.theme: one table for the CLI and the dashboard
__all__ = ["LINK_COLOR", "NODE_STYLE", "bar", "link_color", "na", "state_code", "state_color"]


def na(value: object, unit: str = "") -> str:
    """An unreadable metric is a value: N/A (STYLE.md)."""
    return "N/A" if value is None else f"{value:g}{unit}" if isinstance(value, float) else f"{value}{unit}"


def printable(text: str) -> str:
    """Text as one screen line: a newline, a tab or an escape sequence in a name (from an older hsched, which
    let them in) is shown as its escape, never acted on."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def reading(value: float | None, unit: str) -> str:
    """A sensor reading in a narrow column: whole units, always with the unit (`68C`, `359W`), N/A if unread."""
    return "N/A" if value is None else f"{round(value)}{unit}"


def bar(fraction: float | None, width: int = 10, label: str = "") -> Text:
    """A coloured bar like nvitop's, with a label after it."""
    if fraction is None:
        return Text(" " * width + " N/A", style="bright_black")
    fraction = min(max(fraction, 0.0), 1.0)
    full = round(fraction * width)
    text = Text()
    text.append("█" * full, style=load_color(fraction))
    text.append("░" * (width - full), style="bright_black")
    text.append(f" {label}")
    return text


def sparkline(samples: tuple[float | None, ...], width: int = 20) -> Text:
    """The last samples (percent) in `width` cells, each the maximum of the samples it covers."""
    if not samples:
        return Text(" " * width)
    per = max(1, -(-len(samples) // width))
    cells: list[float | None] = []
    for i in range(0, len(samples), per):
        chunk = [s for s in samples[i:i + per] if s is not None]
        cells.append(max(chunk) if chunk else None)
    cells = cells[-width:]
    text = Text(" " * (width - len(cells)))
    for c in cells:
        if c is None:
            text.append(" ")
        else:
            f = min(max(c / 100.0, 0.0), 1.0)
            text.append(SPARK[min(len(SPARK) - 1, int(f * len(SPARK)))], style=load_color(f))
    return text


def state_text(state: str) -> Text:
    return Text(state_code(state), style=f"bold {state_color(state)}")


def node_state_text(state: str) -> Text:
    label, color = NODE_STYLE.get(state, (state.lower(), "white"))
    return Text(label, style=color)


def duration(seconds: float | None) -> str:
    """squeue's TIME: M:SS, H:MM:SS or D-HH:MM:SS."""
    if seconds is None or seconds < 0:
        return "0:00"
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:{s:02d}"
    if h:
        return f"{h}:{m:02d}:{s:02d}"
    return f"{m}:{s:02d}"


def gib(mib: int | None) -> str:
    return "N/A" if mib is None else f"{mib / 1024:.0f}G" if mib >= 10240 else f"{mib / 1024:.1f}G"


def short_model(model: str) -> str:
    return model.removeprefix("NVIDIA ").removeprefix("GeForce ").removeprefix("AMD ")
