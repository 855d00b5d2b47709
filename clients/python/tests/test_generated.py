"""The blocking client is generated from the asyncio one (tools/gen_sync.py), so the two
cannot drift: _sync.py must be exactly a fresh generation, the generator must refuse sources it
would translate wrongly, and both clients must offer the same methods with the same signatures."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import pytest

import fencegate

ROOT = Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("gen_sync", ROOT / "tools" / "gen_sync.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gen = _generator()
SOURCE = (ROOT / "src" / "fencegate" / "_async.py").read_text(encoding="utf-8")


def test_sync_client_is_a_fresh_generation_of_the_async_one():
    fresh = gen.generate(SOURCE)
    shipped = (ROOT / "src" / "fencegate" / "_sync.py").read_text(encoding="utf-8")
    assert shipped == fresh, (
        "src/fencegate/_sync.py differs from a fresh generation of _async.py: edit _async.py "
        "(not _sync.py) and run python3 clients/python/tools/gen_sync.py")


def test_a_change_to_the_async_client_changes_the_generated_one():
    # The comparison above is not vacuous: the generation follows its source.
    changed = SOURCE.replace("async def get_fence(", "async def fence_of(", 1)
    assert changed != SOURCE
    out = gen.generate(changed)
    assert "    def fence_of(self, scope: str) -> Fence:" in out
    assert "def get_fence(" not in out


def test_the_generator_refuses_what_it_would_translate_wrongly():
    # asyncio left in the code (not covered by a rule) stops it, naming the line.
    with pytest.raises(gen.GenerationError, match="keeps 'asyncio'"):
        gen.generate(SOURCE.replace("await sleep(pause)", "await asyncio.sleep(pause)", 1))
    # So does a rule that no longer matches: reworded prose would otherwise slip through.
    with pytest.raises(gen.GenerationError, match="phrase rule no longer matches"):
        gen.generate(SOURCE.replace("An asyncio client of one fencegate server", "An asyncio client", 1))


def _public(cls):
    return {n: m for n, m in vars(cls).items() if not n.startswith("_") or n in ("__init__",)}


@pytest.mark.parametrize("sync_cls,async_cls", [(fencegate.Client, fencegate.AsyncClient),
                                                 (fencegate.Lease, fencegate.AsyncLease)])
def test_both_clients_offer_the_same_methods_and_signatures(sync_cls, async_cls):
    s, a = _public(sync_cls), _public(async_cls)
    renamed = {"close": "aclose"}
    assert sorted(renamed.get(n, n) for n in s) == sorted(a)
    for name, member in s.items():
        other = a[renamed.get(name, name)]
        if isinstance(member, property):
            assert isinstance(other, property), name
            continue
        fn = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
        afn = other.__func__ if isinstance(other, (classmethod, staticmethod)) else other
        sig = inspect.signature(fn)
        asig = inspect.signature(afn)
        assert list(sig.parameters) == list(asig.parameters), name
        for p, ap in zip(sig.parameters.values(), asig.parameters.values()):
            assert (p.kind, p.default) == (ap.kind, ap.default), f"{name}({p.name})"
        assert inspect.iscoroutinefunction(afn) != inspect.iscoroutinefunction(fn) or \
            name in ("lease", "__init__", "from_env", "__repr__"), name
