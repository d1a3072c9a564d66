"""`import tfde` with or without Keras 3 (TF 2.15 bundles Keras 2)."""

import pytest

import tfde


def test_layers_need_keras3_and_say_so():
  if tfde.keras_support.has_keras3():
    assert tfde.layers.DistributedEmbedding.__name__ == "DistributedEmbedding"
    return
  with pytest.raises(ImportError, match="needs Keras 3.*TensorFlow 2.16 or newer"):
    _ = tfde.layers.DistributedEmbedding
  with pytest.raises(ImportError, match="needs Keras 3"):
    from tfde.layers import TableConfig  # noqa: F401 pylint: disable=unused-import,g-import-not-at-top
  # The graph-mode path is all there.
  assert tfde.lookup.ShardedLookup and tfde.nn.group_embedding_lookup_sparse
