"""The import contract (docs/architecture.md): which part of nuro may import which, read from the source with ``ast``.

The layering only holds if something fails when it drifts, so this test reads every module's imports (top-level and
function-local alike) and names each forbidden edge as ``file:line: rule: what``:

- **devcluster**: the product never imports the dev wing (``nuro.devcluster``), except ``admin/admin_cli.py``
  mounting the ``nuro-admin devcluster`` command group.
- **core-up**: the core (the ``nuro/`` folder) never imports the runtime folders above it (``nuro.login``,
  ``nuro.wrappers``, ``nuro.slurm_plugins``, ``nuro.healthcheck``, ``nuro.prolog_epilog``, ``nuro.admin``).
- **cli**: no module imports a ``*_cli`` module or ``nuro.healthcheck.cli``; a CLI is an entry point, not a library.
  The click entry points that mount subcommands (``login/train_cli.py``, ``admin/admin_cli.py``) are the exception.
- **cycle**: no import cycles (function-local imports count: a cycle hidden in a function is still a cycle, it only
  fails later); ``if TYPE_CHECKING:`` imports do not, they never run.
- **contract**: ``nuro/protocol/contract.py`` imports only the standard library (the SDK imports it inside the
  training process, the renderer on login nodes).
- **floors**: the core (``nuro/``) is built in floors (``FLOORS``, docs/architecture.md): names → safeio → protocol
  → adapters (slurm, objectstore, remote, metrics, console) → domains (checkpoint, datasets, policy, cluster,
  lifecycle) → jobspec → runs → tracking. A package imports itself and the floors below its own, never a package
  above, nor another package of its own floor (so no two packages can import each other). ``nuro.names`` imports the
  standard library only. Every package of the core sits on a floor (``test_every_core_package_sits_on_a_floor``),
  so a new one is drawn the day it is added.
- **one-way**: runtime folders that depend on each other do so one way only: the hooks (``nuro.prolog_epilog``)
  run the health check's library, so ``nuro.healthcheck`` never imports ``nuro.prolog_epilog``.
- **lazy**: an import inside a function has a comment on its line or the line above saying why it must be lazy (a
  heavy import off a CLI's start-up path, an optional dependency); otherwise it belongs at the top. One comment above
  a block of consecutive imports covers the block; a bare linter pragma (``# noqa: PLC0415``) is no reason.
- **missing**: an import of a ``nuro.*`` module that does not exist (a lazy import left behind by a move fails only
  when its function runs).

Folders map to import names the way setup.cfg's ``package_dir`` says (``login/`` is ``nuro.login``), read from
setup.cfg itself, so a new top-level folder is covered the day it is added; a second test checks setup.cfg's
``packages`` against the folders on disk, so no module is left out of the wheel.
"""

from __future__ import annotations

import ast
import configparser
import functools
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = "nuro"
DEVCLUSTER = "nuro.devcluster"
CONTRACT = "nuro.protocol.contract"
#: The click entry points that mount other CLIs' command groups (and the only product file that mounts the dev wing).
MOUNTING_ENTRY_POINTS = {"nuro.login.train_cli", "nuro.admin.admin_cli"}
DEVCLUSTER_MOUNT = "nuro.admin.admin_cli"
#: The core's floors, lowest first: (floor, its packages). A package may import (besides the standard library,
#: third-party packages and itself) only packages of the floors below its own. ``nuro.names`` is stdlib only.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("names", ("nuro.names",)),
    ("safeio", ("nuro.safeio",)),
    ("protocol", ("nuro.protocol",)),
    ("adapters", ("nuro.slurm", "nuro.objectstore", "nuro.remote", "nuro.metrics", "nuro.console")),
    ("domains", ("nuro.checkpoint", "nuro.datasets", "nuro.policy", "nuro.cluster", "nuro.lifecycle")),
    # runevents: the old name of nuro.lifecycle.run_events (training code pinned to old commits imports it)
    ("jobspec", ("nuro.jobspec", "nuro.runevents")),
    ("runs", ("nuro.runs",)),
    ("tracking", ("nuro.tracking",)),
)
STDLIB_ONLY = "nuro.names"
#: (lower, upper): the lower runtime folder never imports the upper one.
ONE_WAY = (("nuro.healthcheck", "nuro.prolog_epilog"),)
#: What a comment may hold that is no reason: linter pragmas and rule codes (a bare suppression says nothing of why).
PRAGMA = re.compile(
    r"(?i:noqa|type:\s*ignore(\[[^\]]*\])?|pragma:\s*no\s*cover|pylint:\s*\S+|fmt:\s*\S+)|\b[A-Z]+[0-9]+\b"
)
#: The fields of statements (and except handlers, match cases) that hold statement lists.
BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


@dataclass(frozen=True)
class Edge:
    """One import statement's target, where it is written and whether it runs at import time of the module."""

    source: str
    target: str
    line: int
    local: bool
    type_only: bool
    written: str  # the dotted name as written (resolved if relative), for the "missing" rule


@dataclass
class Module:
    name: str
    path: Path
    lines: list[str]
    edges: list[Edge] = field(default_factory=list)
    unjustified_local: list[tuple[int, str]] = field(default_factory=list)

    @property
    def rel(self) -> str:
        return self.path.relative_to(ROOT).as_posix() if self.path.is_relative_to(ROOT) else str(self.path)

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


def _setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cfg


@functools.cache
def package_dir() -> dict[str, Path]:
    """setup.cfg's ``package_dir``: import prefix -> folder."""
    mapping = {}
    for line in _setup_cfg()["options"]["package_dir"].strip().splitlines():
        name, _, folder = line.partition("=")
        mapping[name.strip()] = ROOT / folder.strip()
    return mapping


def folder_of(package: str) -> Path:
    """Where an import name's package lives on disk, by the longest ``package_dir`` prefix."""
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        base = package_dir().get(".".join(parts[:n]))
        if base is not None:
            return base.joinpath(*parts[n:])
    return ROOT.joinpath(*parts)


def module_name(path: Path) -> str:
    """A file's import name, by the ``package_dir`` folder holding it most closely."""
    best = max((p for p in package_dir().items() if path.is_relative_to(p[1])), key=lambda p: len(p[1].parts))
    parts = [best[0], *path.relative_to(best[1]).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _source_files() -> list[Path]:
    roots = sorted(set(package_dir().values()))
    files = {p for root in roots for p in root.rglob("*.py") if "__pycache__" not in p.parts}
    return sorted(files)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _reason_in(comment: str) -> bool:
    """A comment that says something beyond linter pragmas and their codes (``# noqa: PLC0415`` alone is no reason)."""
    return any(ch.isalpha() for ch in PRAGMA.sub("", comment.lstrip("#")))


def _justified(mod: Module, node: ast.stmt, previous: dict[int, ast.stmt]) -> bool:
    """A comment on the import's own lines, on the line above, or above the block of imports it continues."""
    first = mod.lines[node.lineno - 1][node.col_offset :]
    own = [first, *mod.lines[node.lineno : node.end_lineno]]
    if any("#" in text and _reason_in(text[text.index("#") :]) for text in own):  # imports hold no string literals
        return True
    above = mod.lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
    if above.startswith("#") and _reason_in(above):
        return True
    prev = previous.get(node.lineno - 1)
    return prev is not None and _justified(mod, prev, previous)


def _target(written: str, known: set[str]) -> str:
    """The most specific known module a dotted name falls in (``nuro.metrics.sink.SinkError`` -> the sink)."""
    parts = written.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in known:
            return name
    return written


def _read(path: Path, known: set[str], name: str | None = None) -> Module:
    """One file's imports; ``name``: its import name when it lies outside the tree (a planted copy)."""
    text = path.read_text()
    mod = Module(name or module_name(path), path, text.splitlines())
    tree = ast.parse(text, filename=str(path))
    package = mod.name if mod.is_package else mod.name.rpartition(".")[0]
    # import statement ending on line N, per function, so a block of lazy imports under one comment is justified once
    local_ends: dict[int, ast.stmt] = {}

    def visit(stmts: list[ast.AST], in_function: bool, type_only: bool) -> None:
        for child in stmts:
            if isinstance(child, ast.Import | ast.ImportFrom):
                if isinstance(child, ast.Import):
                    written = [(a.name, a.name) for a in child.names]
                else:
                    base = child.module or ""
                    if child.level:
                        anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                        base = ".".join([*anchor, *([base] if base else [])])
                    # `from pkg import sub` imports the submodule when there is one, else an attribute of pkg
                    written = [(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base, base) for a in child.names]
                for full, checked in written:
                    target = _target(full, known)
                    mod.edges.append(Edge(mod.name, target, child.lineno, in_function, type_only, checked))
                if in_function:
                    if not _justified(mod, child, local_ends):
                        mod.unjustified_local.append((child.lineno, ast.unparse(child)))
                    local_ends[child.end_lineno] = child
                continue
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.If) and _is_type_checking(child):
                visit(child.body, inner, True)
                visit(child.orelse, inner, type_only)
                continue
            for block in BLOCKS:  # an import is a statement: only statement lists can hold one, not expressions
                visit(getattr(child, block, None) or [], inner, type_only)

    visit(tree.body, False, False)
    return mod


@functools.cache
def modules() -> dict[str, Module]:
    files = _source_files()
    known = {module_name(p) for p in files}
    return {m.name: m for m in (_read(p, known) for p in files)}


def _in(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _core(name: str) -> bool:
    """A module of the ``nuro/`` folder itself (not one of the folders mapped under ``nuro.*``)."""
    return _in(name, CORE) and not any(_in(name, p) for p in package_dir() if p != CORE)


def _is_cli(name: str) -> bool:
    return name.rpartition(".")[2].endswith("_cli") or name == "nuro.healthcheck.cli"


def _edge_text(mod: Module, edge: Edge) -> str:
    where = "function-local " if edge.local else ""
    return f"{mod.rel}:{edge.line}: {mod.name} {where}imports {edge.target}"


def floor_of(name: str) -> tuple[int, str] | None:
    """(floor number, package) of a core module, None for one on no floor (a runtime folder, or an undrawn one)."""
    for level, (_, packages) in enumerate(FLOORS):
        for package in packages:
            if _in(name, package):
                return level, package
    return None


def floor_breach(source: str, target: str) -> bool:
    """Whether ``source`` sits on a floor (``FLOORS``) and imports a core package on its own floor or above."""
    here = floor_of(source)
    if here is None:
        return False
    if here[1] == STDLIB_ONLY:
        return target.partition(".")[0] not in sys.stdlib_module_names
    there = floor_of(target)
    if there is None:
        return _in(target, CORE) and target != CORE  # a core module on no floor: above every floor
    return there[1] != here[1] and there[0] >= here[0]


def violations(rule: str, mods: dict[str, Module] | None = None) -> list[str]:
    """Each import that breaks ``rule``, as ``file:line: [rule] what: why``; ``mods``: the tree read (default)."""
    found = []
    mods = mods if mods is not None else modules()
    for mod in mods.values():
        if rule == "lazy":
            found += [
                (
                    mod.rel,
                    line,
                    f"{mod.rel}:{line}: [lazy] function-local `{stmt}` has no comment saying why it is lazy "
                    f"(move it to the top, or say why on its line or the line above)",
                )
                for line, stmt in mod.unjustified_local
            ]
            continue
        for edge in mod.edges:
            target = edge.target
            if rule == "devcluster":
                bad = _in(target, DEVCLUSTER) and not _in(mod.name, DEVCLUSTER) and mod.name != DEVCLUSTER_MOUNT
                why = "the product never imports the dev wing (only admin/admin_cli.py mounts it)"
            elif rule == "core-up":
                bad = _core(mod.name) and not _core(target) and _in(target, CORE) and not _in(target, DEVCLUSTER)
                why = "the core (nuro/) never imports the folders that run above it"
            elif rule == "cli":
                bad = _is_cli(target) and target != mod.name and mod.name not in MOUNTING_ENTRY_POINTS
                why = "a CLI module is an entry point, not a library: move what is shared into a library module"
            elif rule == "contract":
                top = target.partition(".")[0]
                bad = mod.name == CONTRACT and top not in sys.stdlib_module_names
                why = "the job<->platform contract stays dependency-free (stdlib only)"
            elif rule == "floors":
                bad = floor_breach(mod.name, target)
                why = "a floor of the core imports a package on its own floor or above (FLOORS, docs/architecture.md)"
            elif rule == "one-way":
                bad = any(_in(mod.name, lower) and _in(target, upper) for lower, upper in ONE_WAY)
                why = "the hooks depend on the health check's library, never the other way"
            elif rule == "missing":
                bad = _in(edge.written, CORE) and edge.written not in mods
                why = "no such module (left behind by a move?)"
                target = edge.written
            else:
                raise AssertionError(rule)
            if bad:
                text = f"{mod.rel}:{edge.line}: [{rule}] {mod.name} imports {target}: {why}"
                found.append((mod.rel, edge.line, text))
    return [text for *_, text in sorted(set(found))]  # one line per import statement, by file and line number


def cycles() -> list[str]:
    """One cycle per strongly connected component of the runtime import graph, each edge with its file:line."""
    mods = modules()
    graph: dict[str, dict[str, Edge]] = {name: {} for name in mods}
    for mod in mods.values():
        for edge in mod.edges:
            if not edge.type_only and edge.target in mods and edge.target != mod.name:
                graph[mod.name].setdefault(edge.target, edge)

    # Tarjan's SCC, iterative (no recursion limit worries however deep the graph grows)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    if len(comp) > 1:
                        components.append(sorted(comp))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    found = []
    for comp in components:
        members = set(comp)
        start = comp[0]
        # shortest path start -> ... -> start inside the component (BFS)
        parent: dict[str, str] = {}
        queue = [start]
        while queue and start not in parent:
            nxt = []
            for node in queue:
                for child in sorted(graph[node]):
                    if child in members and child not in parent:
                        parent[child] = node
                        nxt.append(child)
            queue = nxt
        path = [start]
        while len(path) == 1 or path[-1] != start:
            path.append(parent[path[-1]])
        path.reverse()
        hops = [_edge_text(mods[a], graph[a][b]) for a, b in zip(path, path[1:], strict=False)]
        others = f" (component of {len(comp)}: {', '.join(comp)})" if len(comp) > len(path) - 1 else ""
        found.append(f"[cycle] {' -> '.join(path)}{others}:\n    " + "\n    ".join(hops))
    return found


RULES = ["devcluster", "core-up", "cli", "contract", "floors", "one-way", "lazy", "missing"]


@pytest.mark.parametrize("rule", RULES)
def test_import_rule(rule: str) -> None:
    found = violations(rule)
    assert not found, f"{len(found)} import(s) break rule {rule!r}:\n" + "\n".join(found)


def test_a_planted_upward_import_breaks_the_floors() -> None:
    """The floor rule itself: an upward import from a floor is caught, a downward one and stdlib ones are not."""
    assert floor_breach("nuro.protocol.jobrecord", "nuro.checkpoint.layout")
    assert floor_breach("nuro.safeio.credfile", "nuro.protocol.contract")
    assert floor_breach("nuro.names", "nuro.safeio")
    assert floor_breach("nuro.names", "yaml"), "stdlib only"
    assert not floor_breach("nuro.protocol.jobrecord", "nuro.safeio.safefs")
    assert not floor_breach("nuro.protocol.jobrecord", "nuro.names")
    assert not floor_breach("nuro.safeio.credfile", "os")
    # the floors above protocol: a domain never imports jobspec, runs or another domain; runs never tracking
    assert floor_breach("nuro.checkpoint.retention", "nuro.jobspec.options")
    assert floor_breach("nuro.checkpoint.layout", "nuro.runs.report")
    assert floor_breach("nuro.datasets.manifest", "nuro.checkpoint.layout"), "two packages of one floor"
    assert floor_breach("nuro.slurm.backend", "nuro.objectstore"), "two adapters"
    assert floor_breach("nuro.runs.report", "nuro.tracking.bridge")
    assert floor_breach("nuro.metrics.sink", "nuro.newpackage"), "an undrawn package counts as above"
    assert not floor_breach("nuro.tracking.bridge", "nuro.runs.report")
    assert not floor_breach("nuro.jobspec.spec", "nuro.datasets.manifest")
    assert not floor_breach("nuro.checkpoint.retention", "nuro.protocol.contract")
    assert not floor_breach("nuro.slurm.cli_reads", "nuro.slurm.parse"), "inside one package"


@pytest.mark.parametrize(
    ("module", "planted"),
    [
        ("nuro.checkpoint.retention", "from nuro.jobspec.options import OPTIONS_BY_NAME"),  # domain -> jobspec
        ("nuro.runs.report", "    from nuro.tracking import bridge  # lazy: planted"),  # runs -> tracking, lazily
        ("nuro.slurm.parse", "from nuro.objectstore import ObjectStore"),  # an adapter -> another adapter
        ("nuro.protocol.contract", "import nuro.checkpoint.layout"),  # protocol -> a domain
    ],
)
def test_a_planted_upward_import_inside_nuro_fails_the_floors_rule(tmp_path: Path, module: str, planted: str) -> None:
    """The real tree with one module replaced by a copy holding one more import: the floors rule names it."""
    mods = dict(modules())
    assert violations("floors", mods) == []
    source = folder_of(module).with_suffix(".py")
    text = source.read_text()
    if planted.startswith(" "):  # a function-local import: appended inside a new function
        text += f"\n\ndef _planted() -> None:\n{planted}\n"
    else:
        text += f"\n{planted}\n"
    copy = tmp_path / source.name
    copy.write_text(text)
    mods[module] = _read(copy, set(mods), name=module)
    found = violations("floors", mods)
    assert len(found) == 1 and f"{copy}:{len(text.splitlines())}: [floors] {module} imports" in found[0], found


def test_every_core_package_sits_on_a_floor() -> None:
    """A package added to nuro/ must be drawn on a floor (else the floors rule could not place it)."""
    undrawn = sorted({".".join(m.split(".")[:2]) for m in modules() if _core(m) and m != CORE and floor_of(m) is None})
    assert not undrawn, f"core packages on no floor (add them to FLOORS and docs/architecture.md): {undrawn}"


def test_no_import_cycles() -> None:
    found = cycles()
    assert not found, f"{len(found)} import cycle(s):\n" + "\n".join(found)


def test_setup_cfg_packages_match_folders() -> None:
    """Every package setup.cfg lists exists, and every folder holding .py files is listed (else the wheel lacks it)."""
    listed = set(_setup_cfg()["options"]["packages"].split())
    problems = [
        f"setup.cfg lists package {pkg}, but {folder_of(pkg).relative_to(ROOT)}/__init__.py does not exist"
        for pkg in sorted(listed)
        if not (folder_of(pkg) / "__init__.py").is_file()
    ]
    folders = {p.parent for p in _source_files()}
    for folder in sorted(folders):
        pkg = module_name(folder / "__init__.py")
        if pkg not in listed:
            problems.append(f"{folder.relative_to(ROOT)}/ holds .py files but setup.cfg's packages lacks {pkg}")
        elif not (folder / "__init__.py").is_file():
            problems.append(f"{folder.relative_to(ROOT)}/ is package {pkg} but has no __init__.py")
    assert not problems, "\n".join(problems)


def test_contract_reads_every_folder() -> None:
    """The reader itself: each package_dir folder yields modules, and a known edge is seen (guards a silent no-op)."""
    mods = modules()
    for prefix, folder in package_dir().items():
        assert any(_in(name, prefix) for name in mods), f"no modules read under {folder} ({prefix})"
    assert any(e.target == "nuro.metrics.base" for e in mods["nuro.metrics.sink"].edges)
