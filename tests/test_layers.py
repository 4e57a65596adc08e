"""Issue 20, item 6: what may import what, checked on every module's imports.

docs/architecture.md explains the layers; :data:`LAYERS` below is the one table
that assigns each module to one, and this test holds the code to it.  A module
may import its own layer and the layers below it; the four roles (publisher,
subscriber, simulator, dashboard) share a layer but never import one another;
nothing in rsnotify imports the tests.  Imports are read with :mod:`ast`, so a
function-level (lazy) import counts as much as a top-level one; an import under
``if TYPE_CHECKING:`` does not, since it never runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "rsnotify"

# (layer, module prefixes), lowest first.  A module belongs to the layer of its
# longest matching prefix: "rsnotify.publisher.command" is app, the rest of
# "rsnotify.publisher" is the publisher role.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # The pure core: documents, notifications, tracking, errors.  No I/O of its own.
    (
        "core",
        (
            "rsnotify.errors",
            "rsnotify.w3cdt",
            "rsnotify.model",
            "rsnotify.collection",
            "rsnotify.sitemap",
            "rsnotify.sitemapwriter",
            "rsnotify.pullparsers",  # lxml parsers reused per thread, for sitemap (no I/O)
            "rsnotify.envelope",
            "rsnotify.tracker",
            "rsnotify.framework",
            "rsnotify.validators",
            "rsnotify.links",  # Link-header parsing (RFC 8288), used by fetch and discovery
            "rsnotify.__version__",  # a constant of rsnotify/__init__.py, read by cli, httppolicy
        ),
    ),
    # Infrastructure every role shares, knowing nothing of ResourceSync.
    (
        "support",
        (
            "rsnotify.backoff",
            "rsnotify.cancellation",
            "rsnotify.runtime",
            "rsnotify.logs",
            "rsnotify.metrics",
            "rsnotify.sqlitedb",
            "rsnotify.durable",  # atomic, durable small-file writes
            "rsnotify.spare",
            "rsnotify.options",  # declarative command-line options (argparse, no ResourceSync)
            "rsnotify.configfile",  # TOML with line numbers
            "rsnotify.memtrace",  # opt-in memory growth report (RSNOTIFY_TRACEMALLOC)
        ),
    ),
    # Thin adapters: HTTP, the notification log, push transports, telemetry.
    (
        "adapters",
        (
            "rsnotify.fetch",
            "rsnotify.httppolicy",
            "rsnotify.httpoptions",
            "rsnotify.discovery",
            "rsnotify.changes",  # Change List reading, shared by publisher and subscriber
            "rsnotify.log",
            "rsnotify.redisurl",  # Redis, Sentinel and Cluster URLs to clients, for every component
            "rsnotify.outbound",
            "rsnotify.transport",
            "rsnotify.report",
            "rsnotify.argtypes",
            "rsnotify.commonoptions",  # options several commands share (log, metrics, MQTT)
            "rsnotify.configvalues",  # option values from TOML and the environment
        ),
    ),
    # The roles: peers that never import one another (see ROLE_LAYER).
    (
        "roles",
        (
            "rsnotify.publisher",
            "rsnotify.subscriber",
            "rsnotify.simulator",
            "rsnotify.dashboard",
        ),
    ),
    # Commands: the CLI, its configuration, each role's command module.
    (
        "app",
        (
            "rsnotify.cli",
            "rsnotify.config",
            "rsnotify.commands",
            "rsnotify.publisher.command",
            "rsnotify.subscriber.command",
            "rsnotify.simulator.command",
            "rsnotify.dashboard.command",
        ),
    ),
    # The public API (rsnotify/__init__.py) re-exports from any layer.
    ("api", ("rsnotify",)),
]
ROLE_LAYER = "roles"

# Edges that break the rules today, each with what removes it.  A listed edge that
# no longer exists fails the test too, so this list only shrinks.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}

RANK = {name: rank for rank, (name, _) in enumerate(LAYERS)}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> str:
    best, length = None, -1
    for name, prefixes in LAYERS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = name, len(prefix)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")
    return best


def role_of(module: str) -> str:
    return ".".join(module.split(".")[:2])  # rsnotify.publisher, rsnotify.subscriber, ...


def _runtime_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement except those under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def imports_of(module: str) -> set[str]:
    """The modules ``module`` imports (absolute names; ``from pkg import sub`` -> ``pkg.sub``)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        if node.level:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        for alias in node.names:
            submodule = f"{source}.{alias.name}"
            metadata = alias.name == "__version__"
            targets.add(submodule if submodule in MODULES or metadata else source)
    return targets


EDGES = {
    (module, target)
    for module in MODULES
    for target in imports_of(module)
    if target.split(".")[0] in ("rsnotify", "tests") and target != module
}


def allowed(module: str, target: str) -> bool:
    mine, theirs = layer_of(module), layer_of(target)
    if RANK[theirs] > RANK[mine]:
        return False
    return not (mine == theirs == ROLE_LAYER and role_of(module) != role_of(target))


def test_every_module_is_in_one_layer():
    for module in MODULES:
        layer_of(module)


def test_the_import_parser_sees_relative_lazy_and_submodule_imports():
    assert ("rsnotify.sitemap", "rsnotify.errors") in EDGES  # from .errors import ...
    assert ("rsnotify.sitemap", "rsnotify.w3cdt") in EDGES  # from . import w3cdt
    assert ("rsnotify.httppolicy", "rsnotify.fetch") in EDGES  # inside a function
    assert ("rsnotify.errors", "rsnotify.config") not in EDGES  # under TYPE_CHECKING


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_layers(module):
    wrong = sorted(
        f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})"
        for source, target in EDGES
        if source == module
        and target.startswith("rsnotify")
        and (module, target) not in KNOWN_EXCEPTIONS
        and not allowed(module, target)
    )
    assert not wrong, "\n".join(wrong)


def test_core_imports_nothing_outside_the_core():
    for module, target in EDGES:
        if layer_of(module) == "core" and target.startswith("rsnotify"):
            assert layer_of(target) == "core", f"{module} imports {target}"


def test_the_subscriber_never_imports_the_publisher():
    edges = {
        (m, t)
        for m, t in EDGES
        if m.startswith("rsnotify.subscriber") and t.startswith("rsnotify.publisher")
    }
    assert edges <= set(KNOWN_EXCEPTIONS), sorted(edges - set(KNOWN_EXCEPTIONS))


def test_nothing_in_rsnotify_imports_the_tests():
    assert not [(m, t) for m, t in EDGES if t.split(".")[0] == "tests"]


def test_known_exceptions_still_exist():
    gone = [
        f"{m} -> {t} ({why})" for (m, t), why in KNOWN_EXCEPTIONS.items() if (m, t) not in EDGES
    ]
    assert not gone, "drop these from KNOWN_EXCEPTIONS, the edge is gone: " + "; ".join(gone)
