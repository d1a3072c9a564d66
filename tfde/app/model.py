"""The `tfde train` model: a DLRM-style ranking model over tfde's
Keras layer (bottom MLP over dense features, embeddings, pairwise dots,
top MLP), for a job config."""


def feature_configs(config, vocabulary, hotness=None):
  """The job's features, one table each (the model's width, combiner and
  table optimizer), by name; `tfde plan` plans these same tables.
  `hotness`: feature name -> the most ids of a sample, declared
  (`FeatureConfig.input_shape`): the layer picks its exchange by them,
  and the planner estimates that exchange."""
  import tfde  # pylint: disable=g-import-not-at-top
  m = config.model
  hotness = hotness or {}
  return {
      name: tfde.FeatureConfig(
          name=name, table=tfde.TableConfig(
              name=name, vocabulary_size=vocab, embedding_dim=m.embedding_dim,
              optimizer=tfde.optimizers.SparseOptimizer.from_config(
                  m.table_optimizer.get_config()),
              combiner=m.combiner, seed=config.seed + i),
          input_shape=(None, int(hotness[name])) if name in hotness else None)
      for i, (name, vocab) in enumerate(sorted(vocabulary.items()))}


def most_ids_per_sample(features, names):
  """Feature name -> the most ids a sample has (at least 1), for the
  sparse features `names` of a data set's `features` (name -> (values,
  lengths))."""
  return {name: max(1, int(features[name][1].max(initial=0))) for name in names}


def build_model(config, vocabulary, task, dense_features, plan=None, hotness=None):
  """The DLRM-style model, built in the current strategy's scope; `plan` (a
  `tfde.planner.ShardingPlan`) lays its tables out, or None: the layer's
  default placement. `hotness`: feature name -> the most ids of a sample,
  declared to the layer (`FeatureConfig.input_shape`), which picks the
  exchange by them."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import tfde  # pylint: disable=g-import-not-at-top
  from tfde.app import data as data_lib  # pylint: disable=g-import-not-at-top

  m = config.model
  features = feature_configs(config, vocabulary, hotness)

  class RankingModel(keras.Model):
    """Embeddings + bottom MLP -> pairwise dots -> top MLP."""

    def __init__(self):
      super().__init__()
      self.embedding = tfde.layers.DistributedEmbedding(features, plan=plan,
                                                        name="embedding")
      self.bottom = (keras.Sequential([keras.layers.Dense(u, activation="relu")
                                       for u in m.bottom_mlp])
                     if dense_features else None)
      self.top = keras.Sequential(
          [keras.layers.Dense(u, activation="relu") for u in m.top_mlp] +
          [keras.layers.Dense(1, activation="sigmoid" if task == "ctr" else None)])

    @property
    def _default_save_signature(self):
      # Keras would trace a serving function of its own for this subclassed
      # model, with float32 inputs (it knows their shapes only): the ids
      # are ints. tfde.export_for_serving writes the model's serving
      # function with the inputs' real types.
      return None

    def call(self, x):
      # Multi-hot features as ragged ids: their padding never reaches a table.
      emb = self.embedding(data_lib.embedding_inputs(x, features))
      vectors = [emb[k] for k in sorted(features)]
      if self.bottom is not None:
        vectors.append(self.bottom(x["dense"]))
      count = len(vectors)
      stacked = tf.stack(vectors, axis=1)                  # [B, F, D]
      dots = tf.matmul(stacked, stacked, transpose_b=True)  # [B, F, F]
      # Each pair once (i < j), at fixed positions so the width is static.
      pairs = [i * count + j for i in range(count) for j in range(i + 1, count)]
      pairs = tf.gather(tf.reshape(dots, [-1, count * count]), pairs, axis=1)
      # The top MLP sees every vector itself as well as the pairwise dots
      # (DLRM's "cat" interaction, as in DCN): a feature's first-order
      # effect (this id makes a click likelier, whatever else) is then one
      # linear read-out of its embedding. With the dots alone (DLRM's
      # default) it has to be routed through a dot with the dense vector,
      # which the generated data's hidden model, first-order by design,
      # showed to learn slowly (eval AUC 0.68 against the true 0.85).
      return self.top(tf.concat(vectors + [pairs], axis=1))

  model = RankingModel()
  dense_cls = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD,
               "adagrad": keras.optimizers.Adagrad}  # config.DENSE_OPTIMIZERS
  if task == "ctr":
    loss, metrics = "binary_crossentropy", [keras.metrics.AUC(name="auc")]
  else:
    loss, metrics = "mse", [keras.metrics.RootMeanSquaredError(name="rmse")]
  model.compile(optimizer=dense_cls[m.dense_optimizer.kind](m.dense_optimizer.learning_rate),
                loss=loss, metrics=metrics)
  return model
