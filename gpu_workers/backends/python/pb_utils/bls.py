"""BLS (business logic scripting): a model running a request on another model from
inside its ``execute`` with ``InferenceRequest.exec`` (python_backend
``src/request_executor.cc``).

The instance process has no inference executor: :data:`executor` stays None, and
``exec`` raises TritonModelException saying that BLS is not available. A process that
can run requests on other models installs its hook here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Runs one ``InferenceRequest`` on another model and returns its ``InferenceResponse``;
#: None when BLS is not available in this process.
executor: Callable[[Any], Any] | None = None
