"""Drop-in executors for agent frameworks, each behind its optional extra:
``palisade.executors.smolagents`` (``pip install 'palisade-sandbox[smolagents]'``),
``.deepagents``, ``.autogen``."""
