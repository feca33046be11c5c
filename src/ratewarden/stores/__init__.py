from .base import AsyncBound, AsyncStore, Bound, Store
from .memory import AsyncMemoryStore, MemoryStore

__all__ = ["AsyncBound", "AsyncMemoryStore", "AsyncStore", "Bound", "MemoryStore", "Store"]
