"""The import graph of the gdn_trt packages, with its circles and its upward arrows.

    python -m gdn_trt.app.imports              # package arrows, module circles, upward imports, exit 1 if any
    python -m gdn_trt.app.imports --modules    # every module-to-module arrow as well

Layers, bottom to top: plugins, model, export, runtime, app. A module may import modules of its own package and of
the packages below it; from export the runtime takes only the GraphSpec (`gdn_trt.export.spec`), the file
digests its plan checks share with the build (`gdn_trt.export.digest`, hashlib only) and the engine config it
cross-checks at load (`gdn_trt.export.engine_config`), so it never pulls in the engine build, the comparison or
Polygraphy. Every import statement counts, those inside functions and under
`TYPE_CHECKING` too: a lazy import is still an arrow. The modules are read as source (their ASTs), nothing is
imported, so the command runs without torch.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = "gdn_trt"
LAYERS = ("plugins", "model", "export", "runtime", "app")  # bottom to top
NARROW = {("runtime", "export"): ("gdn_trt.export.spec", "gdn_trt.export.digest",  # (importer, imported) -> allowed
                                  "gdn_trt.export.engine_config")}


@dataclass(frozen=True)
class Graph:
    """Module name -> the gdn_trt modules it imports (each import statement of its source, wherever it stands)."""

    edges: dict[str, frozenset[str]]

    def cycles(self) -> list[list[str]]:
        """Strongly connected components of more than one module (or a module importing itself), sorted."""
        index, low, stack, on, out = {}, {}, [], set(), []

        def visit(v: str) -> None:  # Tarjan, iterative over each node's arrows
            index[v] = low[v] = len(index)
            stack.append(v)
            on.add(v)
            work = [(v, iter(sorted(self.edges.get(v, ()))))]
            while work:
                node, it = work[-1]
                for w in it:
                    if w not in index:
                        index[w] = low[w] = len(index)
                        stack.append(w)
                        on.add(w)
                        work.append((w, iter(sorted(self.edges.get(w, ())))))
                        break
                    if w in on:
                        low[node] = min(low[node], index[w])
                else:
                    work.pop()
                    if work:
                        low[work[-1][0]] = min(low[work[-1][0]], low[node])
                    if low[node] == index[node]:
                        comp = []
                        while True:
                            w = stack.pop()
                            on.discard(w)
                            comp.append(w)
                            if w == node:
                                break
                        if len(comp) > 1 or node in self.edges.get(node, ()):
                            out.append(sorted(comp))

        for v in sorted(self.edges):
            if v not in index:
                visit(v)
        return sorted(out)

    def upward(self) -> list[tuple[str, str]]:
        """Arrows from a lower package to a higher one, and narrow-rule breaches (runtime -> export but the spec)."""
        bad = []
        for src, dsts in sorted(self.edges.items()):
            for dst in sorted(dsts):
                a, b = package_of(src), package_of(dst)
                allowed = NARROW.get((a, b))
                if LAYERS.index(b) > LAYERS.index(a) or (allowed is not None and dst not in allowed):
                    bad.append((src, dst))
        return bad

    def packages(self) -> dict[tuple[str, str], int]:
        """(package, package) -> module arrows between them (within a package excluded)."""
        out: dict[tuple[str, str], int] = {}
        for src, dsts in self.edges.items():
            for dst in dsts:
                key = (package_of(src), package_of(dst))
                if key[0] != key[1]:
                    out[key] = out.get(key, 0) + 1
        return out


def package_of(module: str) -> str:
    return module.split(".")[1]


def modules() -> dict[str, Path]:
    """Every module of the gdn_trt packages that exist (found without importing them) -> its source file."""
    out = {}
    for pkg in LAYERS:
        spec = importlib.util.find_spec(f"{ROOT}.{pkg}")
        if spec is None or not spec.submodule_search_locations:
            continue
        base = Path(next(iter(spec.submodule_search_locations)))
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((ROOT, pkg, *parts))] = path
    return out


def _targets(node: ast.AST, module: str, is_pkg: bool, known: set[str]) -> set[str]:
    """The gdn_trt modules one import statement loads (`from a import b` counts `a.b` when b is a module)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".") if is_pkg else module.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            stem = ".".join(base + ([node.module] if node.module else []))
        else:
            stem = node.module or ""
        # `from a import b`: the module a.b when b is one, else a (a name defined in a)
        names = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in known else stem for a in node.names]
    out = set()
    for n in names:
        while n and n not in known:  # `import gdn_trt.model.layer` -> the module; an attribute -> its module
            n = n.rpartition(".")[0]
        if n.startswith(ROOT + ".") and n.count(".") >= 1:
            out.add(n)
    return out


def build() -> Graph:
    mods = modules()
    known = set(mods)
    edges = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        dsts = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                dsts |= _targets(node, name, path.name == "__init__.py", known)
        edges[name] = frozenset(d for d in dsts if d != name)
    return Graph(edges)


def report(g: Graph, all_modules: bool) -> str:
    lines = [f"gdn_trt import graph: {len(g.edges)} modules, layers (bottom to top) {' < '.join(LAYERS)}", "",
             "package arrows (module imports):"]
    for (a, b), n in sorted(g.packages().items(), key=lambda kv: (LAYERS.index(kv[0][0]), LAYERS.index(kv[0][1]))):
        up = LAYERS.index(b) > LAYERS.index(a)
        lines.append(f"  {a:>8} -> {b:<8} {n:>3}{'   UPWARD' if up else ''}")
    cyc = g.cycles()
    lines += ["", f"circles: {len(cyc)}"]
    lines += [f"  {' <-> '.join(c)}" for c in cyc]
    up = g.upward()
    lines += ["", f"upward or forbidden arrows: {len(up)}"]
    lines += [f"  {a} -> {b}" for a, b in up]
    if all_modules:
        lines += ["", "module arrows:"]
        lines += [f"  {m} -> {', '.join(sorted(d)) or '-'}" for m, d in sorted(g.edges.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gdn_trt.app.imports", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modules", action="store_true", help="print every module's arrows too")
    g = build()
    print(report(g, p.parse_args(argv).modules))
    return 1 if g.cycles() or g.upward() else 0


if __name__ == "__main__":
    sys.exit(main())
