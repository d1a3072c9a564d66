"""Deprecated: moved to `tfde.pipeline.batches`; this alias forwards to it
for one release."""

import warnings

from tfde.pipeline.batches import Carried  # noqa: F401
from tfde.pipeline.batches import as_one_batch  # noqa: F401
from tfde.pipeline.batches import map_tensors  # noqa: F401
from tfde.pipeline.batches import tensors_of  # noqa: F401

warnings.warn("tfde.group_step is deprecated and will be removed in the next release; "
              "use tfde.pipeline.batches", DeprecationWarning, stacklevel=2)
