"""Drop-in executors for agent frameworks, each behind its optional extra
(``pip install 'palisade-sandbox[smolagents]'``, ``[deepagents]``, ``[openai-agents]``,
``[autogen]``):

- ``palisade.executors.smolagents.PalisadeExecutor``: a smolagents ``RemotePythonExecutor``;
- ``palisade.executors.deepagents.PalisadeSandbox``: a deepagents ``BaseSandbox`` backend;
- ``palisade.executors.openai_agents.PalisadeSandboxClient``: an OpenAI Agents SDK
  ``BaseSandboxClient`` whose sessions are palisade sessions;
- ``palisade.executors.autogen.PalisadeCodeExecutor``: an AutoGen ``CodeExecutor``."""
