"""The one build step pyproject.toml cannot declare stably: the envelope codec's compiled fast path.

Optional: without a C compiler the install still succeeds and ``ferryman.envelope``
uses its pure-Python path (the services log which one they run). Everything else
about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("ferryman._batchcodec", ["clients/ferryman/_batchcodec.pyx"], optional=True)])
