"""Issue #31: ``admin.listen`` serves the admin API and the console on an address of their
own, through the real proxy: there only them (nothing forwarded, no Messages), and on the
main listener neither (404, nothing forwarded)."""

from __future__ import annotations

import json

import aiohttp
import pytest

from proxy.config import ConfigError
from tests.conftest import TEST_API_KEY, ProxyFactory, UpstreamServer, user_text
from tests.proxy.admin.test_admin_paths_and_headers import raw_request

TOKEN = "listener-admin-token-2d6f8a0c4e1b3d5f7a9c"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BODY = {"model": "claude-sonnet-4-5", "max_tokens": 16,
        "messages": [{"role": "user", "content": user_text("hello")}]}


async def test_admin_is_served_only_on_its_own_listener(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """Main listener: /admin and /admin/ui are 404, Messages work. Admin listener: the admin
    API and the console work, Messages, /healthz and near-misses are 404; the provider sees
    only the main listener's Messages request."""
    proxy = proxy_factory({"admin": {"listen": {"port": 0}}}, admin_token=TOKEN)
    admin_url = proxy.extras["admin_url"]
    assert admin_url != proxy.base_url
    async with aiohttp.ClientSession() as http:
        for path in ("/admin/sessions", "/admin/sessions/s1/state", "/admin/ui/login",
                     "/admin/ui/"):
            async with http.get(f"{proxy.base_url}{path}", headers=AUTH,
                                allow_redirects=False) as resp:
                assert resp.status == 404, path
                assert (await resp.json())["error"]["type"] == "not_found_error"
        async with http.post(f"{proxy.base_url}/v1/messages", json=BODY,
                             headers={"x-api-key": TEST_API_KEY}) as resp:
            assert resp.status == 200
        async with http.get(f"{admin_url}/admin/sessions", headers=AUTH) as resp:
            assert resp.status == 200 and "sessions" in await resp.json()
        async with http.get(f"{admin_url}/admin/sessions", headers={}) as resp:
            assert resp.status == 401
        async with http.get(f"{admin_url}/admin/ui/login") as resp:
            assert resp.status == 200 and 'name="token"' in await resp.text()
        for method, path in (("POST", "/v1/messages"), ("GET", "/v1/models"),
                             ("GET", "/healthz"), ("GET", "/metrics")):
            async with http.request(method, f"{admin_url}{path}", json=BODY,
                                    headers={"x-api-key": TEST_API_KEY}) as resp:
                assert resp.status == 404, path
    for target in ("//admin/sessions", "/ADMIN/sessions", "/admin%2fsessions"):
        for url in (proxy.base_url, admin_url):
            status, body = await raw_request(url, "GET", target, AUTH)
            assert status == 404 and body["error"]["type"] == "not_found_error", (url, target)
    assert [(r.method, r.path) for r in upstream_server.upstream.requests] == [
        ("POST", "/v1/messages")]
    assert TOKEN not in json.dumps([dict(r.headers) for r in upstream_server.upstream.requests])


def test_a_taken_admin_port_is_a_config_error(proxy_factory: ProxyFactory) -> None:
    """The admin listener's port already taken: ConfigError naming admin.listen.port."""
    first = proxy_factory({"admin": {"listen": {"port": 0}}}, admin_token=TOKEN)
    taken = int(first.extras["admin_url"].rsplit(":", 1)[1])
    with pytest.raises(ConfigError) as caught:
        proxy_factory({"admin": {"listen": {"port": taken}}}, admin_token=TOKEN)
    assert caught.value.key == "admin.listen.port"
