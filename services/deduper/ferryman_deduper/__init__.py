"""The deduper service: staging envelopes to destination records, exactly once.

The service is ``ferryman_deduper._deduper.Deduper``; this package imports
nothing, so its entry point (``cli.main``) decides when the service's modules load.
"""
