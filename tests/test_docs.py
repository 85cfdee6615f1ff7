"""The documents a newcomer reads: README.md stays a front door (at most 300 lines), and every link in README.md and
docs/ resolves to a file inside the repository (the product never points outside it, e.g. to the shared data
folder beside a checkout)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def links(text: str) -> list[str]:
    # links inside code fences are examples, not links
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return LINK.findall(text)


def test_readme_is_a_front_door() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_every_link_resolves_inside_the_repository() -> None:
    bad = []
    for doc in DOCS:
        for target in links(doc.read_text()):
            if re.match(r"[a-z]+://", target) or target.startswith("#") or target.startswith("mailto:"):
                continue
            path = (doc.parent / target.split("#", 1)[0]).resolve()
            if not path.is_relative_to(ROOT) or not path.exists():
                bad.append(f"{doc.relative_to(ROOT)}: {target}")
    assert bad == []


SIBLING = "/".join(("..", "shared"))
"""The project's shared data folder beside a checkout (spelt in parts: this test reads no file there)."""


def test_no_document_points_outside_the_repository() -> None:
    for doc in DOCS:
        assert SIBLING not in doc.read_text(), doc


def test_the_check_can_fail(tmp_path: Path) -> None:
    assert links("see [x](nowhere.md) and ```\n[y](z.md)\n```") == ["nowhere.md"]


def test_the_version_is_the_changelogs_latest_release() -> None:
    import tomllib

    import hsched

    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert released and released[0] == project == hsched.__version__
