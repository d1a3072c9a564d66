"""Moved to `tfde.saving.delta_checkpoint`; this path is kept for one release.

`tfde.delta_checkpoint` (the attribute) keeps answering without a warning; importing
`tfde.delta_checkpoint` by its old module path warns.
"""

from tfde import lazy_modules

lazy_modules.moved(__name__, "tfde.saving.delta_checkpoint")
