"""The one build step pyproject.toml cannot declare stably: the compiled fast paths.

Optional: without a C compiler the install still succeeds; ``ferryman.envelope``
uses its pure-Python codec, the deduper calls ``produce()`` per record and the
auditor's span reader reads through ``consume()`` (the services log which paths
they run). Everything else about the package is in
pyproject.toml.
"""

import os

from setuptools import Extension, setup

setup(
    # The extensions compile one per core (the editable install on a clean 2-core machine: 59 s -> 46 s).
    options={"build_ext": {"parallel": os.cpu_count() or 1}},
    ext_modules=[
        Extension("ferryman._batchcodec", ["clients/ferryman/_batchcodec.pyx"], optional=True),
        Extension("ferryman._rdproduce", ["clients/ferryman/_rdproduce.pyx"], optional=True),
        Extension("ferryman.metrics._latencycount", ["clients/ferryman/metrics/_latencycount.pyx"], optional=True),
        Extension("ferryman.tracing._spanwire", ["clients/ferryman/tracing/_spanwire.pyx"], optional=True),
        Extension("ferryman.tracing._tracepath", ["clients/ferryman/tracing/_tracepath.pyx"], optional=True),
        Extension("ferryman_auditor._codes", ["services/auditor/ferryman_auditor/_codes.pyx"], optional=True),
        Extension("ferryman_auditor._pairs", ["services/auditor/ferryman_auditor/_pairs.pyx"], optional=True),
        Extension(
            "ferryman_auditor.kafka_source._spanread",
            ["services/auditor/ferryman_auditor/kafka_source/_spanread.pyx"],
            optional=True,
        ),
    ],
)
