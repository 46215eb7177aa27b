#!/usr/bin/env python3
"""usage: check_calls.py BUILD_DIR LAYER... (lowest first)

The include paths keep a layer from seeing the headers above it; this checks
the linker's side: no object of a layer needs a symbol that only a layer
above it defines (a function declared in a public header, say, but
implemented higher up). Reads each layer's objects with nm; exit 1 naming
every such call."""
import pathlib
import subprocess
import sys


def symbols(objects, *flags):
    found = {}
    for obj in objects:
        out = subprocess.run(["nm", "-C", *flags, str(obj)], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            parts = line.split(maxsplit=2) if "--defined-only" in flags else ["", *line.split(maxsplit=1)]
            if len(parts) == 3 and (parts[1] in "TDBRVW" if parts[0] else parts[1] == "U"):
                found.setdefault(parts[2], set()).add(obj.name)
    return found


def main():
    build, layers = pathlib.Path(sys.argv[1]), sys.argv[2:]
    defined, needed = {}, {}
    for layer in layers:
        objects = sorted((build / "CMakeFiles" / f"asgd_{layer}.dir").rglob("*.o"))
        if not objects:
            print(f"check_calls: no objects for layer {layer} under {build}", file=sys.stderr)
            return 1
        defined[layer] = symbols(objects, "--defined-only", "-g")
        needed[layer] = symbols(objects, "-u")
    wrong = 0
    for i, layer in enumerate(layers):
        for above in layers[i + 1:]:
            for symbol, objects in sorted(needed[layer].items()):
                if symbol in defined[above] and not any(symbol in defined[l] for l in layers[:i + 1]):
                    print(f"{layer} calls {symbol}, which {above} (above it) defines; from {', '.join(sorted(objects))}",
                          file=sys.stderr)
                    wrong = 1
    if not wrong:
        print(f"ok: no call runs up the layers ({' -> '.join(layers)})")
    return wrong


sys.exit(main())
