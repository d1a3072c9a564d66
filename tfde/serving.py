"""Moved to `tfde.saving.serving`; this path is kept for one release.

`tfde.serving` (the attribute) keeps answering without a warning; importing
`tfde.serving` by its old module path warns.
"""

from tfde import lazy_modules

lazy_modules.moved(__name__, "tfde.saving.serving")
