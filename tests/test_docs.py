"""The documentation: README.md stays a short newcomer's page with the two commands, and every
relative link or image in README.md and docs/*.md points at a file in the repository, so the
links work in a fresh clone (README links nowhere outside the repository)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))

# [text](target "title"), ![alt](target), [label]: target, <img src="...">, <a href="...">
_INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^\"']*[\"'])?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
_HTML = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)\s*=\s*[\"']([^\"']+)[\"']", re.I)
_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)


def links(path: Path) -> list[str]:
    """Every link and image target in a markdown file, outside code blocks and code spans."""
    text = _FENCE.sub("", path.read_text())
    text = _CODE_SPAN.sub("", text)
    return [m.group(1) for rx in (_INLINE, _REFERENCE, _HTML) for m in rx.finditer(text)]


def broken_links(path: Path, *, allow_external: bool, root: Path = ROOT) -> list[str]:
    """The targets that do not resolve to a file or folder inside `root`, anchors stripped."""
    bad = []
    for target in links(path):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, https:, mailto:, ...
            if not allow_external:
                bad.append(f"{target} (outside the repository)")
            continue
        rel = target.split("#", 1)[0].split("?", 1)[0]
        if not rel:  # an anchor in the same file
            continue
        resolved = (root / rel.lstrip("/")) if rel.startswith("/") else (path.parent / rel)
        resolved = resolved.resolve()
        if not resolved.is_relative_to(root.resolve()):
            bad.append(f"{target} (outside the repository)")
        elif not resolved.exists():
            bad.append(f"{target} (no such file)")
    return bad


def test_the_link_check_can_fail(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "a.md").write_text("# a\n")
    (repo / "docs" / "fig.png").write_bytes(b"")
    (repo / "README.md").write_text(
        "[ok](docs/a.md#part) ![fig](docs/fig.png) [here](#top)\n"
        "[missing](docs/b.md) [escape](../shared/x.md) [web](https://example.org)\n"
        "`[in a span](nowhere.md)`\n"
        "```\n[in a fence](nowhere.md)\n```\n"
        "[ref]: docs/gone.md\n"
    )
    readme = repo / "README.md"
    assert "nowhere.md" not in links(readme)
    bad = broken_links(readme, allow_external=False, root=repo)
    assert bad == ["docs/b.md (no such file)", "../shared/x.md (outside the repository)",
                   "https://example.org (outside the repository)",
                   "docs/gone.md (no such file)"], bad
    assert "https://example.org (outside the repository)" not in broken_links(
        readme, allow_external=True, root=repo)


def test_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into docs/"


def test_readme_gives_the_two_commands() -> None:
    text = README.read_text()
    assert "bash scripts/demo.sh" in text
    assert "bash scripts/test.sh" in text


def test_readme_links_resolve_inside_the_repository() -> None:
    bad = broken_links(README, allow_external=False)
    assert not bad, f"README.md: broken or external links: {bad}"


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_doc_links_resolve(doc: Path) -> None:
    bad = broken_links(doc, allow_external=True)
    assert not bad, f"docs/{doc.name}: broken links: {bad}"


def test_every_doc_is_reachable_from_the_readme() -> None:
    linked = {(README.parent / t.split("#", 1)[0]).resolve() for t in links(README)}
    orphans = [d.name for d in DOCS if d.resolve() not in linked]
    assert not orphans, f"docs not linked from README.md: {orphans}"


def test_readme_has_no_bare_urls() -> None:
    # GitHub turns a bare http(s) URL into a link, which the link patterns above do not see.
    urls = re.findall(r"https?://\S+", README.read_text())
    assert not urls, f"README.md points outside the repository: {urls}"
