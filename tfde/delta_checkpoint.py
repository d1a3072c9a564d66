"""Moved to `tfde.saving.delta_checkpoint`; this path is kept for one release.

`tfde.delta_checkpoint` (the attribute) keeps answering without a warning; importing
`tfde.delta_checkpoint` by its old module path warns.
"""

import sys
import warnings

from tfde.saving import delta_checkpoint as _moved

warnings.warn("tfde.delta_checkpoint moved to tfde.saving.delta_checkpoint; import it from there "
              "(the old path goes in the next release)", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
