"""Distributed data loading: sharded DataLoader and a device-resident tensor path for small data."""

from trainscale.data.loader import DeviceTensorLoader, DistributedLoader, check_shardable

__all__ = ["DistributedLoader", "DeviceTensorLoader", "check_shardable"]
