"""One renderer for every table the harness prints or writes: a markdown table (GitHub's pipe form),
readable in a terminal as it is."""

from __future__ import annotations


def markdown_table(header: list[str], rows: list[list], align: str = "", pad: bool = False) -> str:
    """`rows` under `header`, one line each. `align`: a letter per column, l (default) or r (numbers);
    `pad`: cells padded to their column's width, for a table read in a terminal."""
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))] if pad else [0] * len(header)
    right = [i < len(align) and align[i] == "r" for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "| " + " | ".join((c.rjust(w) if rt and pad else c.ljust(w)) for c, w, rt in zip(r, widths, right)) + " |"

    if pad:
        rule = "|" + "|".join("-" * (w + 1) + (":" if rt else "-") for w, rt in zip(widths, right)) + "|"
    else:
        rule = "|" + "|".join("---:" if rt else "---" for rt in right) + "|"
    return "\n".join([line(cells[0]), rule, *map(line, cells[1:])])


def replace_between(text: str, block: str, begin: str, end: str) -> str:
    """`text` with what lies between the marker lines `begin` and `end` replaced by `block` (a generated table
    in a README); ValueError without both markers."""
    if begin not in text or end not in text:
        raise ValueError(f"no {begin} ... {end} block to replace")
    head, rest = text.split(begin, 1)
    return head + begin + "\n" + block.strip() + "\n" + end + rest.split(end, 1)[1]
