"""Moved to `tfde.saving.delta_manifest`; this path is kept for one release.

`tfde.delta_manifest` (the attribute) keeps answering without a warning; importing
`tfde.delta_manifest` by its old module path warns.
"""

import sys
import warnings

from tfde.saving import delta_manifest as _moved

warnings.warn("tfde.delta_manifest moved to tfde.saving.delta_manifest; import it from there "
              "(the old path goes in the next release)", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
