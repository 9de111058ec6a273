"""Imports inside the package only point down the layers listed here.

A module may import modules of its own layer or of layers below it, never
above: function-level (deferred) imports count too. This list is the one
place the order is written down; a new module must be added to it.
"""

import ast
import fnmatch
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "keras_transformer"

# Lowest first. Names are module paths inside `keras_transformer`.
LAYERS = [
    [
        "version",
        "utils",
        "utils.*",
        "cli.startup",
        "generation",
        "generation.sentences",
        "generation.settings",
        "evaluation",
        "evaluation.bleu",
    ],
    ["layers", "layers.*"],
    # The layers' speed paths, attached where a search or a training step is built.
    [
        "speed_paths",
        "speed_paths.attachment",
        "speed_paths.bfloat16_products",
        "speed_paths.derived_tensors",
        "speed_paths.direct_calls",
        "speed_paths.eager_ops",
        "speed_paths.einsum_equations",
        "speed_paths.in_place_cache_writes",
        "speed_paths.openblas_products",
        "speed_paths.registry",
        "speed_paths.runtime",
        "speed_paths.tensorflow_eager_ops",
        "speed_paths.threefry_dropout",
        "speed_paths.torch_eager_ops",
        "speed_paths.torch_int8",
        "speed_paths.torch_linear",
    ],
    ["training.recipe"],  # its dropout is the layers' default
    ["generation.search"],
    ["models", "models.transformer_backbone"],
    # The search's speed paths, chosen where a search is built.
    ["speed_paths.*"],
    ["models.transformer_tokenizer", "models.transformer_preprocessor", "presets", "presets.catalog"],
    ["generation.decoding", "generation.search_runner", "generation.translation", "generation.batches"],
    ["presets.integrity", "presets.model_card"],
    ["presets.resolution", "presets.saving"],
    [
        "training",
        "training.losses",
        "training.metrics",
        "training.optimizer",
        "training.schedule",
        "training.callbacks",
        "training.checkpoints",
        "training.train_step",
    ],
    ["models.search_cache", "models.transformer_fitting", "models.transformer_generation", "models.transformer"],
    # Registered with KerasHub's loaders: the task class reaches it through them.
    ["marian", "marian.*"],
    [
        "training.data",
        "training.parallel_text",
        "training.shards_reading",
        "training.shards_writing",
        "training.distribution",
        "training_run",
        "training_run.folder",
        "training_run.trainer",
        "training_run.run",
        "evaluation.test_set",
        "generation.saved_model",
        "generation.attention_maps",
        "presets.precision",
    ],
    ["server", "server.*"],
    [""],  # the package itself: the public API, which the command line uses
    ["cli", "cli.*"],
]


def layer_of(module: str) -> int:
    for level, patterns in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(module, pattern) for pattern in patterns):
            return level
    raise AssertionError(f"keras_transformer.{module} is in no layer of tests/test_layering.py: add it.")


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def imported_modules(path: Path) -> set[str]:
    """`keras_transformer` modules imported anywhere in the file, by name inside the package."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from keras_transformer.x import y` imports the module x.y if
            # there is one, else the name y of the module x.
            submodules = [f"{node.module}.{alias.name}" for alias in node.names]
            names = [name for name in submodules if _is_module(name)] or [node.module]
        else:
            continue
        for name in names:
            if _is_module(name):
                found.add(name.removeprefix("keras_transformer").lstrip("."))
    return found


def _is_module(name: str) -> bool:
    """Whether `name` is `keras_transformer` or one of its modules."""
    if name == "keras_transformer":
        return True
    if not name.startswith("keras_transformer."):
        return False
    path = PACKAGE / name.removeprefix("keras_transformer.").replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def test_every_import_points_down():
    upward = []
    for module, path in modules():
        level = layer_of(module)
        for imported in imported_modules(path):
            if imported != module and layer_of(imported) > level:
                upward.append(f"keras_transformer.{module} imports keras_transformer.{imported}")
    assert not upward, "imports that point up the layers:\n" + "\n".join(upward)


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports in `graph` (module to the modules it imports), or None."""
    done, path = set(), []

    def visit(module):
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return None
        path.append(module)
        for imported in sorted(graph.get(module, ())):
            cycle = visit(imported)
            if cycle:
                return cycle
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module)
        if cycle:
            return cycle
    return None


def test_no_import_cycle():
    graph = {module: imported_modules(path) - {module} for module, path in modules()}
    cycle = import_cycle(graph)
    assert cycle is None, "modules that import each other: " + " -> ".join(cycle)


def test_the_check_finds_a_cycle():
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_check_finds_an_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from keras_transformer.cli import main\n")
    assert imported_modules(module) == {"cli.main"}
    assert layer_of("cli.main") > layer_of("models.transformer")


MAX_MODULE_LINES = 400  # a module one reader follows in one sitting


def test_no_module_is_over_the_line_limit():
    lengths = {module: len(path.read_text(encoding="utf-8").splitlines()) for module, path in modules()}
    long = [f"keras_transformer.{module}: {n} lines" for module, n in lengths.items() if n > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines; split them:\n" + "\n".join(long)


# The paper's layers and the task model are plain Keras (issue 55): the speed
# paths attach to them from outside, where a search or a training step is built.
PLAIN_MODULES = ["layers", "layers.*", "models.transformer", "models.transformer_*"]
MAX_FILES_CHECKING_THE_BACKEND = 6  # outside `cli/`


def _checks_the_backend(path: Path) -> bool:
    return any(
        isinstance(node, ast.Attribute)
        and node.attr == "backend"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "config"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
    )


def _names(path: Path) -> set[str]:
    return {
        node.id if isinstance(node, ast.Name) else node.attr
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, (ast.Name, ast.Attribute))
    }


def test_the_papers_layers_and_the_task_model_are_plain_keras():
    found = []
    for module, path in modules():
        if not any(fnmatch.fnmatchcase(module, pattern) for pattern in PLAIN_MODULES):
            continue
        speed = sorted(name for name in imported_modules(path) if name.split(".")[0] == "speed_paths")
        if speed:
            found.append(f"keras_transformer.{module} imports {speed}")
        if _checks_the_backend(path):
            found.append(f"keras_transformer.{module} checks the backend")
        if "ContextVar" in _names(path):
            found.append(f"keras_transformer.{module} uses a ContextVar")
    assert not found, "\n".join(found)


def test_few_files_outside_the_command_line_check_the_backend():
    checking = [module for module, path in modules() if module.split(".")[0] != "cli" and _checks_the_backend(path)]
    assert len(checking) <= MAX_FILES_CHECKING_THE_BACKEND, checking
