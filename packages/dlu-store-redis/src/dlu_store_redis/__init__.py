"""Redis implementation of the DLU state store, registered as `redis`."""

from dlu_store_redis.store import RedisStateStore

__version__ = "0.1.0"

__all__ = ["RedisStateStore"]
