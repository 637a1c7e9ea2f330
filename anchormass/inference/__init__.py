"""Inference engine (`anchormass.inference.generate`): chunked prefill through a session cache,
the one decode loop, and `generate`.

The model never imports this package or the caches: it consumes the cache it is given.
"""
