"""What a warm zygote imports before it forks a job's workers, and the check that it stays
safe to fork.

A warm worker skips ``import torch`` because the zygote it is forked from already did
it (decision 0310). A job built on a framework pays far more for the framework:
``from transformers import Trainer`` alone takes 10–25 s on a loaded machine, and a
restart's workers paid it again. So the zygote also imports what the *job's script*
imports (decision 0498):

* :func:`script_imports` reads the script the attempt runs (and the modules of its own
  directory that it imports, a few levels down) and lists its absolute imports with the
  names taken from each (``from transformers import Trainer`` → ``transformers`` and
  ``Trainer``: frameworks load lazily, the name is what pulls in the heavy part). The
  standard library, ``__future__`` and the script's own modules are left out: the latter
  run the job's code, which must run in the worker, once.
* :func:`preload` (in the zygote) imports each, touches the names, and after each checks
  that the zygote is still safe to fork: no new operating-system thread (a fork copies
  only the calling thread; a lock another thread held stays locked in the child forever)
  and CUDA not initialised (a forked CUDA context is unusable). The first module that
  breaks either is named, and the zygote then starts no worker: that attempt's workers
  start cold and the attempt log says why.

Run by the zygote inside the job's interpreter, this file imports only the standard
library, as ``zygote.py`` does; the standby loads it by path.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence

# The environment variable that carries the plan to the parked standby: one module per
# line, ``module`` or ``module:Name,Other``.
PRELOAD_VAR = "TRAINGUARD_WARM_PRELOAD"
# Imported before everything else: what nearly every training script pays for after
# `import torch`. Creating the first optimizer imports torch._dynamo (and sympy: some
# 800 modules, 2.5 s unloaded, 4-5 s on a loaded machine); it starts no thread and does
# not initialise CUDA.
BASE = ("torch._dynamo",)
MAX_MODULES = 64  # a script importing more is read no further: a bound on the zygote's work
MAX_FILES = 32  # the script plus its own modules read, at most
MAX_BYTES = 4 << 20  # a "script" larger than this is not read
# torchrun's options that take no value (``torch.distributed.run.get_args_parser``).
_TORCHRUN_FLAGS = frozenset({
    "-h", "--help", "--standalone", "-m", "--module", "--no-python", "--no_python",
    "--run-path", "--run_path", "--virtual-local-rank", "--virtual_local_rank",
})  # fmt: skip


def torchrun_target(args: Sequence[str]) -> tuple[str, bool] | None:
    """``(script or module, is a module)`` of torchrun's arguments ``args``; None when
    there is none or the workers are no Python script (``--no-python``)."""
    module = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("--no-python", "--no_python"):
            return None
        if arg in ("-m", "--module"):
            module = True
        elif arg.startswith("-") and arg != "-":
            if arg not in _TORCHRUN_FLAGS and "=" not in arg:
                i += 1  # its value
        else:
            return arg, module
        i += 1
    return None


def _read_tree(path: str) -> ast.Module | None:
    try:
        if os.path.getsize(path) > MAX_BYTES:
            return None
        with open(path, "rb") as fh:
            return ast.parse(fh.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None


def _local_file(root: str, module: str) -> str | None:
    """The file of ``module`` when it is one of the script directory's own."""
    base = os.path.join(root, *module.split("."))
    for candidate in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _is_local(root: str, module: str) -> bool:
    top = module.split(".")[0]
    return os.path.exists(os.path.join(root, top + ".py")) or os.path.isdir(os.path.join(root, top))


def script_imports(script: str, root: str | None = None) -> list[str]:
    """The preload plan of ``script``: its absolute third-party imports and those of the
    modules of ``root`` (its directory) it imports, in the order first met, as
    ``module`` or ``module:Name,Other`` (see the module's docstring)."""
    root = root if root is not None else os.path.dirname(os.path.abspath(script))
    found: dict[str, list[str]] = {}
    queue: list[str] = [os.path.abspath(script)]
    seen: set[str] = set()
    while queue and len(seen) < MAX_FILES:
        path = queue.pop(0)
        if path in seen:
            continue
        seen.add(path)
        tree = _read_tree(path)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                pairs = [(alias.name, "") for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                pairs = [(node.module, alias.name) for alias in node.names]
            else:
                continue
            for module, name in pairs:
                top = module.split(".")[0]
                if top == "__future__" or top in sys.stdlib_module_names:
                    continue
                if _is_local(root, module):
                    local = _local_file(root, module)
                    if local is not None:
                        queue.append(local)
                    continue
                if module not in found and len(found) >= MAX_MODULES:
                    continue
                names = found.setdefault(module, [])
                if name and name != "*" and name not in names:
                    names.append(name)
    return [m + (":" + ",".join(n) if n else "") for m, n in found.items()]


def plan_for(args: Sequence[str], cwd: str) -> list[str]:
    """The preload plan for a torchrun launch with arguments ``args`` run in ``cwd``."""
    target = torchrun_target(args)
    if target is None:
        return []
    name, module = target
    if module:
        path = _local_file(cwd, name)
        return script_imports(path, cwd) if path is not None else []
    path = name if os.path.isabs(name) else os.path.join(cwd, name)
    return script_imports(path) if os.path.isfile(path) else []


def _threads() -> int:
    """This process's operating-system threads (Python's count misses native ones)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    import threading

    return threading.active_count()


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    is_initialized = getattr(cuda, "is_initialized", None)
    return bool(is_initialized()) if callable(is_initialized) else False


def preload(specs: Sequence[str]) -> str | None:
    """Import :data:`BASE` and then ``specs`` (``module`` or ``module:Name,...``), best
    effort; None while the process stays safe to fork, else why not (the first module
    that started a thread or initialised CUDA), after which nothing more is imported."""
    for spec in BASE:
        with contextlib.suppress(Exception):  # an optimisation, never a failure
            importlib.import_module(spec)
    threads = _threads()
    for spec in specs:
        module, _, names = spec.partition(":")
        try:
            loaded = importlib.import_module(module)
            for name in filter(None, names.split(",")):
                with contextlib.suppress(Exception):
                    getattr(loaded, name)
        except (Exception, SystemExit):  # a module that fails to import is not preloaded
            pass
        if _threads() > threads:
            return f"preloading {module} started a thread, so the zygote may not fork"
        if _cuda_initialised():
            return f"preloading {module} initialised CUDA, so the zygote may not fork"
    return None


def specs_from_env(env: dict[str, str] | os._Environ[str]) -> list[str]:
    """The plan the parent put in ``env`` (and removes it: the job must not see it)."""
    return [line for line in env.pop(PRELOAD_VAR, "").splitlines() if line.strip()]


def describe(specs: Sequence[str], most: int = 6) -> str:
    """``", preloading a, b (+3 more)"`` for a start note; empty without a plan."""
    modules = [spec.partition(":")[0] for spec in specs]
    if not modules:
        return ""
    more = f" (+{len(modules) - most} more)" if len(modules) > most else ""
    return ", preloading " + ", ".join(modules[:most]) + more
