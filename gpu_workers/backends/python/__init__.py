"""Triton's Python backend (``backend: "python"``): runs a ``model.py`` unchanged.

:mod:`.backend` holds the backend (:class:`~.backend.PythonBackend`), :mod:`.conversion`
turns Sluice's requests into ``pb_utils`` requests and the model's responses back, and
:mod:`.pb_utils` is the ``triton_python_backend_utils`` module the model imports.

Importing this package registers :mod:`.pb_utils` as ``triton_python_backend_utils`` in
``sys.modules``, before any ``model.py`` is imported: a Triton model.py does ``import
triton_python_backend_utils as pb_utils``, which Triton's stub process provides and
Sluice provides from inside its own package (installing Sluice adds no top-level module
of that name).
"""

import sys

from sluice.gpu_workers.backends.python import pb_utils

sys.modules.setdefault("triton_python_backend_utils", pb_utils)
