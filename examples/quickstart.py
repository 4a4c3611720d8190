"""The README's example: all, race and a deadline on the reference host."""

import asyncio

from effecthost.combinators import Scope, all_, race, sleep, tool, with_deadline
from effecthost.contract import ToolRegistry, validate_deployment
from effecthost.hosts.memory import MemoryEffectHost

tools = ToolRegistry()


@tools.tool("search")
async def search(query):
    return {"query": query, "hits": 3}


async def main():
    host = MemoryEffectHost(tools)  # the resolver: the only way a host finds a runner
    validate_deployment(host)  # fails at start-up, not at the first group
    scope = Scope(scope_id="turn-42")  # save scope.to_json() with your continuation
    print(await all_(host, scope, [tool("search", "a"), tool("search", "b")]))
    print(await race(host, scope, [tool("search", "c"), sleep(5.0)]))
    print(await with_deadline(host, scope, tool("search", "d"), 1.0))
    await host.aclose()


if __name__ == "__main__":
    asyncio.run(main())
