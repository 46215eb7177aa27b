#!/usr/bin/env python3
"""Generates docs/api.md, the API reference, from the public headers in
include/asgd/: each header's opening comment, then every declaration that
carries a /// comment (classes, structs, functions, members), with that
comment, and every field documented with ///<.

    scripts/api_docs.py            rewrite docs/api.md
    scripts/api_docs.py --check    exit 1 when docs/api.md is out of date

The headers are the source of truth; a test runs --check so the reference
cannot drift from the code."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
HEADERS = ROOT / "include" / "asgd"
OUT = ROOT / "docs" / "api.md"
TYPE = re.compile(r"^\s*(?:template\s*<[^>]*>\s*)?(class|struct|enum class|enum)\s+(\w+)")


def code_of(line):
    return line.split("//")[0].rstrip()


def body_end(lines, i):
    """The last line of the body that opens on line i (i when none does or
    it closes there)."""
    depth = 0
    while i < len(lines):
        text = code_of(lines[i])
        depth += text.count("{") - text.count("}")
        if depth <= 0:
            return i
        i += 1
    return i


def declaration(lines, i, skip_body=True):
    """The declaration starting at line i, up to its ';' or '{', one line,
    and the line it ends on (an inline body's last line). An enum keeps its
    values."""
    parts, start = [], i
    while i < len(lines):
        text = code_of(lines[i])
        parts.append(text.strip())
        opens_body = "{" in text.replace("{}", "")  # "= {}" is a default argument, not a body
        if opens_body or text.endswith(";") or text.endswith("{}") or text.endswith(")") and i + 1 < len(lines) and lines[i + 1].strip().startswith("{"):
            break
        i += 1
    decl = " ".join(p for p in parts if p)
    enum = TYPE.match(lines[start])
    if enum and enum.group(1).startswith("enum"):
        end = body_end(lines, i)
        values = " ".join(code_of(l).strip() for l in lines[i + 1:end + 1]) if end > i else ""
        decl = re.sub(r"\s+", " ", decl + " " + values).strip().rstrip(";")
        return decl.replace(",}", " }").replace(", }", " }"), end
    decl = re.split(r"\{(?!\})", decl, maxsplit=1)[0].rstrip()
    decl = re.sub(r"\s*\{\}$", "", decl)  # an empty inline body
    decl = re.sub(r"\)(\s*const)?(\s*override)?\s*=\s*0\s*;?$", r")\1\2", decl)  # pure virtual marker
    decl = re.sub(r"\s*:\s*\w+\(.*$", "", decl) if ") :" in decl else decl  # a constructor's initialisers
    return re.sub(r"\s+", " ", decl).rstrip(";").strip(), body_end(lines, i) if skip_body else i


def group(lines, i):
    """The declaration at line i and those right below it that the same
    comment covers (no blank line, comment or access label between)."""
    decls = []
    while True:
        decl, i = declaration(lines, i)
        decls.append(decl)
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if (not nxt or nxt.startswith("//") or nxt.startswith("}") or nxt.endswith(":") or "///<" in nxt
                or TYPE.match(lines[i + 1])):
            return decls, i
        i += 1


def intro_doc(intro):
    """A header's opening comment as markdown: its paragraphs (split at
    empty comment lines) joined into lines, and its indented lines (an
    example) kept as a code block."""
    out, words, code = [], [], []

    def flush():
        if words:
            out.extend([" ".join(words), ""])
            words.clear()
        if code:
            out.extend(["```cpp"] + code + ["```", ""])
            code.clear()

    for line in intro:
        if line.startswith("  "):
            if words:
                flush()
            code.append(line[2:].rstrip())
        elif line.strip() == "":
            flush()
        else:
            if code:
                flush()
            words.append(line.strip())
    flush()
    return out


def header_doc(path):
    lines = path.read_text().splitlines()
    out = [f"## `<asgd/{path.name}>`", ""]
    intro = []
    for line in lines:
        s = line.strip()
        if s.startswith("#pragma"):
            continue
        if s.startswith("//") and not s.startswith("///"):
            intro.append(s[3:] if s.startswith("// ") else s[2:])
        elif s == "" and not intro:
            continue
        else:
            break
    out += intro_doc(intro)
    doc, fields, owner = [], [], None

    def flush_fields():
        nonlocal fields
        if fields:
            out.extend(["| field | meaning |", "| --- | --- |"] + fields + [""])
            fields = []

    i = 0
    while i < len(lines):
        s = lines[i].strip()
        if s.startswith("///") and not s.startswith("///<"):
            doc.append(s[3:].strip())
            i += 1
            continue
        m = TYPE.match(lines[i])
        if not m and s.startswith("template") and i + 1 < len(lines):
            m = TYPE.match(s + " " + lines[i + 1].strip())
        if "///<" in s:
            code, note = s.split("///<", 1)
            code = code.split("//")[0].strip().rstrip(";")
            name = re.sub(r"\s*=.*$", "", code).split()[-1] if code else ""
            cell = note.strip().replace("|", "\\|")  # a | inside a table cell ends it
            fields.append(f"| `{code}` | {cell} |" if name else f"| | {cell} |")
            doc = []
            i += 1
            continue
        if doc and s and not s.startswith("//"):
            flush_fields()
            commented_values = m and "///<" in "".join(lines[i:body_end(lines, i) + 1])
            if m and (not m.group(1).startswith("enum") or commented_values):
                decl, i = declaration(lines, i, skip_body=False)
                owner = m.group(2)
                out += [f"### `{owner}`", "", "```cpp", decl, "```", "", " ".join(doc), ""]
            else:
                decls, i = group(lines, i)
                if m:  # an enum: a heading of its own when it has one line
                    out += [f"### `{m.group(2)}`", ""]
                out += ["```cpp"] + [d + ";" for d in decls] + ["```", "", " ".join(doc), ""]
            doc = []
        elif m and m.group(1).startswith("enum") and "{" in lines[i] and not doc and "///<" not in "".join(lines[i:body_end(lines, i) + 1]):
            flush_fields()  # an enum without comments: its values, under the type it is in
            decl, i = declaration(lines, i)
            out += ["```cpp", decl + ";", "```", ""]
        elif m and "{" in lines[i] and not doc:
            flush_fields()
            owner = m.group(2)
            out += [f"### `{owner}`", ""]
        else:
            doc = [] if s and not s.startswith("//") else doc
        i += 1
    flush_fields()
    return out


def render():
    out = ["# API reference", "",
           "Generated by `scripts/api_docs.py` from the public headers in `include/asgd/`;",
           "do not edit by hand (a test fails when this file is out of date). Include",
           "`<asgd/asgd.hpp>` for all of it; link `asgd::asgd` (see the user guide's",
           "Embedding section).", ""]
    order = ["asgd.hpp", "job.hpp", "runtime.hpp", "dataset.hpp", "model_spec.hpp", "predictor.hpp", "status.hpp"]
    names = sorted(p.name for p in HEADERS.glob("*.hpp"))
    for name in [n for n in order if n in names] + [n for n in names if n not in order]:
        out += header_doc(HEADERS / name)
    return "\n".join(out).rstrip() + "\n"


def main():
    args = sys.argv[1:]
    if args not in ([], ["--check"]):
        print("usage: scripts/api_docs.py [--check]  (writes docs/api.md; --check: exit 1 when it is out of date)",
              file=sys.stderr)
        return 2
    text = render()
    if args == ["--check"]:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date with include/asgd/: run scripts/api_docs.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
