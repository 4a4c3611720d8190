"""Register the endpoint with a Restate server (force re-discovery) and validate it."""

from __future__ import annotations

import argparse
import asyncio

from effecthost.hosts.restate import register_deployment


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--admin", default="http://127.0.0.1:9070")
    parser.add_argument("--endpoint", default="http://127.0.0.1:9080")
    options = parser.parse_args()
    asyncio.run(register_deployment(options.admin, options.endpoint, force=True))
    print(f"registered {options.endpoint} with {options.admin}")


if __name__ == "__main__":
    main()
