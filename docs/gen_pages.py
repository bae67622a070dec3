"""Generated pages of the documentation site (mkdocs-gen-files runs this during every build).

The API reference: one page per public package of ``cdc``, ``sinks`` and ``udfs`` with each of its public
modules, found by walking the source tree (never a hand-kept list, so a module renamed or added shows up by
itself), and a ``reference/SUMMARY.md`` that literate-nav turns into the section's navigation. A module is
public when no part of its dotted name starts with ``_``; ``cdc.testing`` is public (backend authors use it).
A deprecated alias left at a moved module's old path (:func:`cdc.lazy.moved_module`) gets no entry: the module
it names is documented.
"""

from __future__ import annotations

from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cdc", "sinks", "udfs")


def public_packages() -> list[tuple[str, ...]]:
    """Dotted names (as tuples) of every public package of :data:`PACKAGES` (a folder with ``__init__.py``)."""
    found = []
    for package in PACKAGES:
        for init in sorted((ROOT / package).rglob("__init__.py")):
            parts = init.parent.relative_to(ROOT).parts
            if not any(p.startswith("_") for p in parts):
                found.append(parts)
    return sorted(found)


def public_modules(package: tuple[str, ...]) -> list[str]:
    """The package's own public modules (not those of its sub-packages), by name."""
    folder = ROOT.joinpath(*package)
    return sorted(
        p.stem for p in folder.glob("*.py")
        if not p.stem.startswith("_") and p.stem != "__main__" and "moved_module(" not in p.read_text()
    )


def main() -> None:
    """One page per package: the package's docstring, then each of its modules (a page per module made the
    navigation of every page list a hundred modules, which cost the build more than the pages themselves)."""
    nav = mkdocs_gen_files.Nav()
    for parts in public_packages():
        page = Path("reference", *parts, "index.md")
        nav[parts] = page.relative_to("reference").as_posix()
        name = ".".join(parts)
        lines = [f"# `{name}`\n", f"::: {name}\n    options:\n      show_root_heading: false\n      members: false\n"]
        for module in public_modules(parts):
            lines.append(f"::: {name}.{module}\n    options:\n      heading_level: 2\n")
        with mkdocs_gen_files.open(page, "w") as fd:
            fd.write("\n".join(lines))
    with mkdocs_gen_files.open("reference/SUMMARY.md", "w") as fd:
        fd.writelines(nav.build_literate_nav())


main()
