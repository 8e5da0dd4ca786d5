"""The wrapper service: source records to envelopes in the staging topic.

The service is ``ferryman_wrapper._wrapper.Wrapper``; this package imports
nothing, so its entry point (``cli.main``) decides when the service's modules load.
"""
