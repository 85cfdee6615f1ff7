"""The controller: one asyncio process per HSCHED_HOME, the only writer of the store."""
