"""Moved to `tfde.saving.checkpoint`; this path is kept for one release.

`tfde.checkpoint` (the attribute) keeps answering without a warning; importing
`tfde.checkpoint` by its old module path warns.
"""

from tfde import lazy_modules

lazy_modules.moved(__name__, "tfde.saving.checkpoint")
