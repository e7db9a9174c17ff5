"""listen.event_loop: what proxy.server.event_loop runs a serving process's coroutine on."""

from __future__ import annotations

import asyncio
import inspect
import sys

import pytest

from proxy.config import ConfigError
from proxy.server.event_loop import run


async def _loop_module() -> str:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__


@pytest.mark.parametrize(("name", "module"), [("uvloop", "uvloop"), ("asyncio", "asyncio")])
def test_run_uses_the_named_loop(name: str, module: str) -> None:
    assert run(_loop_module(), name).partition(".")[0] == module


def test_an_unloadable_uvloop_is_a_config_error_naming_the_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A platform without uvloop: a one-line config error (exit 2 in serve), the coroutine
    closed unrun (no 'never awaited' warning)."""
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    main = _loop_module()
    with pytest.raises(ConfigError) as raised:
        run(main, "uvloop")
    assert inspect.getcoroutinestate(main) == inspect.CORO_CLOSED
    assert raised.value.key == "listen.event_loop"
    assert "set it to asyncio" in str(raised.value)
