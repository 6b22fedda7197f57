#!/usr/bin/env python3
"""Fail unless a WebAssembly module imports nothing and exports the given function.

usage: check-wasm-imports.py MODULE.wasm EXPORT

The core must not reach for a clock, randomness or I/O from its host: built for
wasm32-unknown-unknown, a module that links all of it must have an empty import section.
"""
import sys


def leb128(data, pos):
    result, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, pos


def name(data, pos):
    n, pos = leb128(data, pos)
    return data[pos:pos + n].decode("utf-8", "replace"), pos + n


def main():
    path, wanted = sys.argv[1], sys.argv[2]
    data = open(path, "rb").read()
    if data[:4] != b"\0asm":
        sys.exit(f"{path}: not a WebAssembly module")
    pos, imports, exports = 8, [], []
    while pos < len(data):
        section, pos = data[pos], pos + 1
        size, pos = leb128(data, pos)
        end = pos + size
        if section == 2:
            count, p = leb128(data, pos)
            for _ in range(count):
                module, p = name(data, p)
                field, p = name(data, p)
                kind = data[p]
                imports.append(f"{module}.{field} (kind {kind})")
                # Skip the import description.
                p += 1
                if kind == 0:
                    _, p = leb128(data, p)
                elif kind == 1:
                    p += 1
                    flags, p = leb128(data, p)
                    _, p = leb128(data, p)
                    if flags & 1:
                        _, p = leb128(data, p)
                elif kind == 2:
                    flags, p = leb128(data, p)
                    _, p = leb128(data, p)
                    if flags & 1:
                        _, p = leb128(data, p)
                elif kind == 3:
                    p += 2
        elif section == 7:
            count, p = leb128(data, pos)
            for _ in range(count):
                field, p = name(data, p)
                p += 1
                _, p = leb128(data, p)
                exports.append(field)
        pos = end
    if imports:
        sys.exit(f"{path}: the core imports from its host: {', '.join(imports)}")
    if wanted not in exports:
        sys.exit(f"{path}: export {wanted} missing (exports: {', '.join(exports)})")
    print(f"{path}: 0 imports, exports {wanted} ({len(data)} bytes)")


if __name__ == "__main__":
    main()
