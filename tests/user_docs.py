"""The documents users read: README.md and the guides in docs/guide/ (the README links each)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDES = ROOT / "docs" / "guide"


def guide(stem: str) -> str:
    """The text of ``docs/guide/<stem>.md``."""
    return (GUIDES / f"{stem}.md").read_text(encoding="utf-8")


def every_document() -> str:
    """README.md and every guide, one after the other."""
    return "\n\n".join(path.read_text(encoding="utf-8") for path in [README, *sorted(GUIDES.glob("*.md"))])
