#!/usr/bin/env python3
"""No function over 150 lines in core/ and kernels/ (docs/ARCHITECTURE.md, "Style").

Finds each function body (free functions, member functions, kernels; the lambdas inside a function count
as part of it) with a brace scanner that ignores comments, strings and character literals, and fails when
one is longer than the limit. Functions still waiting for their split are listed in ALLOWED with the length
they have now: such a function may not grow, and once it is short the entry must go (the list only
shrinks).

    function_length.py SOURCE_ROOT        check core/ and kernels/ under SOURCE_ROOT
    function_length.py --self-test        the scanner on made-up sources (it must catch what it should)
"""
import os
import re
import sys
import tempfile

LIMIT = 150
LAYERS = ("core", "kernels")
# CUDA engines: their split changes device code, which is accepted only with CUDA = CPU shown on a GPU
# (bench/identity_session.sh).
ALLOWED = {}

SCOPE = re.compile(r"\b(namespace|extern\s*\"\"|struct|class|union|enum)\b[^;()]*$")
FUNCTION_HEAD = re.compile(r"\)\s*(const|noexcept|override|final|mutable|->[^{]*|\s)*$")
CONSTRUCTOR_HEAD = re.compile(r"\)\s*:\s*[A-Za-z_]")  # S::S(int a) : a_(a), b_{a} {
NAME = re.compile(r"([A-Za-z_~][A-Za-z0-9_:~<>]*)\s*\(")


def strip(src):
    """Comments, string and character literals out; line breaks kept so that line numbers hold."""
    src = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), src, flags=re.S)
    src = re.sub(r"//[^\n]*", "", src)
    # a raw string's R is a token of its own (not the last letter of "OR" or of an identifier)
    src = re.sub(r'(?<![A-Za-z0-9_"])R"([^(]*)\(.*?\)\1"', lambda m: '""' + "\n" * m.group(0).count("\n"), src,
                 flags=re.S)
    src = re.sub(r'"(\\.|[^"\\\n])*"', '""', src)
    return re.sub(r"'(\\.|[^'\\\n])*'", "''", src)


def functions(text):
    """(first line, length in lines, name) of each outermost function body."""
    found, stack, head = [], [], ""
    for number, line in enumerate(strip(text).split("\n"), start=1):
        for ch in line:
            if ch == "{":
                inside = any(kind == "function" for kind, _, _ in stack)
                kind = "block"
                h = head.strip()
                if not inside and SCOPE.search(h):
                    kind = "scope"
                elif not inside and CONSTRUCTOR_HEAD.search(h) and re.search(r"[A-Za-z0-9_>]$", h):
                    kind = "initialiser"  # a member's brace initialiser: the head goes on after it
                elif not inside and (FUNCTION_HEAD.search(h) or CONSTRUCTOR_HEAD.search(h)):
                    kind = "function"
                names = NAME.findall(head)
                stack.append((kind, number, names[0] if names else "?"))
                if kind != "initialiser":
                    head = ""
            elif ch == "}":
                kind = "block"
                if stack:
                    kind, first, name = stack.pop()
                    if kind == "function" and not any(k == "function" for k, _, _ in stack):
                        found.append((first, number - first + 1, name.split("::")[-1]))
                head = head + "}" if kind == "initialiser" else ""
            elif ch == ";":
                head = ""
            else:
                head += ch
        head += " "
    return found


def check(root):
    problems, lengths = [], {}
    for layer in LAYERS:
        for folder, _, files in os.walk(os.path.join(root, layer)):
            for f in sorted(files):
                if not f.endswith((".cpp", ".hpp", ".h", ".cu", ".cuh")):
                    continue
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for first, length, name in functions(fh.read()):
                        key = (rel, name)
                        lengths[key] = max(length, lengths.get(key, 0))
                        allowed = ALLOWED.get(key)
                        if length > LIMIT and allowed is None:
                            problems.append(f"{rel}:{first}: {name} is {length} lines (limit {LIMIT})")
                        elif allowed is not None and length > allowed:
                            problems.append(f"{rel}:{first}: {name} grew to {length} lines (listed at {allowed})")
    for (rel, name), allowed in ALLOWED.items():
        if lengths.get((rel, name), 0) <= LIMIT:
            problems.append(f"{rel}: {name} is now within {LIMIT} lines: remove it from ALLOWED")
    return problems


def self_test():
    long_body = "\n".join(f"    x += {i};" for i in range(LIMIT))
    cases = {
        # (source, expected [(name, length)])
        "free": (f"int f(int x) {{\n{long_body}\n    return x;\n}}\n", [("f", LIMIT + 3)]),
        "member in class, lambda inside, braces in strings and comments": (
            "namespace a {\nstruct S {\n    void g() const {\n        auto l = [&]() { return \"}}\"; };\n"
            "        // }\n        /* { */\n        char c = '{';\n    }\n};\n}\n", [("g", 6)]),
        "constructor with initialisers, trailing return": (
            "S::S(int a) : a_(a), b_{a} {\n    a_ = 1;\n}\nauto h() -> int {\n    return 1;\n}\n",
            [("S", 3), ("h", 3)]),
        "kernel": ("__global__ void k(float* p) {\n    if (p) {\n        p[0] = 1;\n    }\n}\n", [("k", 5)]),
        "a string ending in R is not a raw string": (
            'int p(int t) {\n    return "OR" ? (t | 1) : 0;\n}\nconst char* q(int t) {\n    return (t) ? "x" : "y";\n}\n'
            'const char* r() {\n    return R"x(})x";\n}\n',
            [("p", 3), ("q", 3), ("r", 3)]),
    }
    failures = 0
    for what, (src, expected) in cases.items():
        got = [(name, length) for _, length, name in functions(src)]
        if got != expected:
            print(f"self-test {what}: got {got}, expected {expected}")
            failures += 1
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "core"))
        with open(os.path.join(root, "core", "long.cpp"), "w") as fh:
            fh.write(cases["free"][0])
        os.makedirs(os.path.join(root, "kernels"))
        if not any("f is 153 lines" in p for p in check(root)):
            print("self-test: a 153-line function in core/ was not reported")
            failures += 1
    return failures


def main():
    if sys.argv[1:] == ["--self-test"]:
        failures = self_test()
        print("self-test:", "ok" if failures == 0 else f"{failures} failures")
        return 1 if failures else 0
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    problems = check(sys.argv[1])
    for p in problems:
        print(p)
    print(f"function length: {len(problems)} problems (limit {LIMIT} lines, {len(ALLOWED)} listed exceptions)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
