#!/usr/bin/env python3
"""Functions of the scheduling core stay short: none over MAX_LINES lines unless the comment above it says why.

A function is a brace block opened at namespace scope or directly inside a class / struct whose opening line
(or the lines just before, up to the previous `;`, `}` or blank line) ends a parameter list. Its length counts
from its first signature line to its closing brace. A long function passes when the comment block right above
it contains "Long because". Prints `file:line: name is N lines` for the others and exits 1.

  python3 tools/check_function_size.py [repo root] [--list]   # ctest: function_size (shared/ only)
  python3 tools/check_function_size.py --self-test
"""
import os
import re
import sys

MAX_LINES = 80
REASON = "Long because"
TREE = "shared"


def strip(text):
    """Comments and string / char literals blanked out, line structure kept."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


SCOPE = re.compile(r"\b(namespace|class|struct|union|enum)\b[^;(]*$")


def functions(text):
    """(first line, last line, name) of every function body at namespace or class scope (1-based lines)."""
    code = strip(text).split("\n")
    found = []
    stack = []  # per open brace: "scope" (namespace / class / extern) or "function" or "block"
    for no, line in enumerate(code):
        for col, ch in enumerate(line):
            if ch == "{":
                head = head_before(code, no, col)
                in_scope = all(kind == "scope" for kind, _ in stack)
                if SCOPE.search(head) or re.search(r'\bextern\b\s*$', head):
                    stack.append(("scope", None))
                elif in_scope and re.search(r"\)\s*(const|override|final|noexcept|->[^{]*|:[^{]*)*\s*$", head):
                    name = re.search(r"([~\w:]+)\s*\(", head)
                    first = no - head.lstrip().count("\n")
                    stack.append(("function", (first, name.group(1) if name else "?")))
                else:
                    stack.append(("block", None))
            elif ch == "}" and stack:
                kind, info = stack.pop()
                if kind == "function":
                    found.append((info[0] + 1, no + 1, info[1]))
    return found


def head_before(code, no, col):
    """The text before a `{`: back to the previous `;`, `{`, `}` or preprocessor line."""
    parts = [code[no][:col]]
    k = no
    while not re.search(r"[;{}]", parts[0]) and k > 0 and k > no - 12:
        k -= 1
        prev = code[k]
        if prev.lstrip().startswith("#") or not prev.strip():
            break
        parts.insert(0, prev)
    head = "\n".join(parts)
    cut = max(head.rfind(";"), head.rfind("{"), head.rfind("}"))
    return head[cut + 1:] if cut >= 0 else head


def has_reason(lines, first):
    k = first - 2  # the line above the signature (0-based)
    while k >= 0 and lines[k].strip().startswith("//"):
        if REASON in lines[k]:
            return True
        k -= 1
    return False


def check(root, listing=False):
    errors = []
    for folder, _, files in os.walk(os.path.join(root, TREE)):
        for name in sorted(files):
            if not name.endswith((".h", ".cc")):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            lines = text.split("\n")
            rel = os.path.relpath(path, root)
            for first, last, fname in functions(text):
                size = last - first + 1
                if listing and size > MAX_LINES // 2:
                    print(f"{size:5d} {rel}:{first} {fname}")
                if size > MAX_LINES and not has_reason(lines, first):
                    errors.append(f"{rel}:{first}: {fname} is {size} lines (over {MAX_LINES}: split it, or say "
                                  f"why above it with \"{REASON}\")")
    return errors


def self_test():
    body = "\n".join(["  x += 1;"] * (MAX_LINES + 5))
    text = ("namespace hzp {\nnamespace {\nstruct S {\n  int f() const {\n" + body + "\n  }\n};\n}  // namespace\n"
            "// Long because: a table.\nint g(int a,\n      int b) {\n" + body + "\n}\n"
            "int h() {\n  if (x) {\n" + body + "\n  }\n  return \"}\"[0];\n}\nint k() { return 1; }\n}\n")
    found = {name: (first, last) for first, last, name in functions(text)}
    lines = text.split("\n")
    ok = set(found) == {"f", "g", "h", "k"} and has_reason(lines, found["g"][0]) and not has_reason(
        lines, found["h"][0]) and found["k"][0] == found["k"][1]
    print("self-test " + ("passed" if ok else f"failed: {found}"))
    return 0 if ok else 1


def main():
    if "-h" in sys.argv[1:] or "--help" in sys.argv[1:]:
        print(__doc__.strip())
        return 0
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    unknown = [a for a in sys.argv[1:] if a.startswith("-") and a not in ("--self-test", "--list")]
    if unknown or len(args) > 1 or (args and not os.path.isdir(args[0])):
        print(f"check_function_size: expected [ROOT] (a folder), --list or --self-test, got "
              f"{' '.join(sys.argv[1:])[:80]}", file=sys.stderr)
        return 2
    if "--self-test" in sys.argv:
        return self_test()
    root = args[0] if args else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    errors = check(root, "--list" in sys.argv)
    for e in errors:
        print(e)
    if errors:
        print(f"{len(errors)} function(s) too long", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
