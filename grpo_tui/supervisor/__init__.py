"""The process supervisor: UI-free, asyncio, importable and testable on its own."""
