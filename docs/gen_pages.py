"""Generated pages of the documentation site (mkdocs-gen-files runs this during every build).

The API reference: one page per public module of the packages ``cdc``, ``sinks`` and ``udfs``, found by
walking the source tree (never a hand-kept list, so a module renamed or added shows up by itself), and a
``reference/SUMMARY.md`` that literate-nav turns into the section's navigation. A module is public when no
part of its dotted name starts with ``_`` (``__init__`` stands for its package); ``cdc.testing`` is public
(backend authors use it), the stand-in servers' internals are documented through their packages.
"""

from __future__ import annotations

from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cdc", "sinks", "udfs")


def public_modules() -> list[tuple[str, ...]]:
    """Dotted names (as tuples) of every public module of :data:`PACKAGES`, sorted."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if parts[-1] == "__main__" or any(p.startswith("_") for p in parts):
                continue
            found.append(parts)
    return sorted(found)


def main() -> None:
    nav = mkdocs_gen_files.Nav()
    for parts in public_modules():
        page = Path("reference", *parts).with_suffix(".md")
        if (ROOT / Path(*parts)).is_dir():
            page = Path("reference", *parts, "index.md")
        nav[parts] = page.relative_to("reference").as_posix()
        with mkdocs_gen_files.open(page, "w") as fd:
            fd.write(f"# `{'.'.join(parts)}`\n\n::: {'.'.join(parts)}\n    options:\n      show_root_heading: false\n")
    with mkdocs_gen_files.open("reference/SUMMARY.md", "w") as fd:
        fd.writelines(nav.build_literate_nav())


main()
