"""Assemble README.md from docs/readme/*.md (in file-name order). Run after editing a section."""
from pathlib import Path

root = Path(__file__).resolve().parents[1]
parts = sorted((root / "docs" / "readme").glob("*.md"))
text = "\n".join(p.read_text().rstrip() + "\n" for p in parts)
(root / "README.md").write_text(text)
print(f"README.md: {len(parts)} sections, {text.count(chr(10))} lines")
