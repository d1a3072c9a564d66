"""The `tfde train` job config: one schema, checked as a whole before any work.

Each section is a small dataclass whose fields carry their type and range
(`Spec`s); `__post_init__` checks every field against its spec, then the
section's cross-field rules, so a config object is valid however it is
made. `from_config` builds one from plain dicts (unknown and missing keys
are errors) and `get_config` gives them back:

>>> from tfde.app import config
>>> job = config.JobConfig.from_config({
...     "name": "x", "data": {"sparse_features": [
...         {"name": "a", "vocabulary_size": 100}]}})
>>> job.model.bottom_mlp, job.training.batch_size
([64, 16], 1024)
>>> config.JobConfig.from_config(job.get_config()) == job
True
>>> config.ModelConfig(bottom_mlp=8)
Traceback (most recent call last):
...
tfde.app.config.ConfigError: bottom_mlp: must be a list of positive ints, got 8

`load_config` reads a YAML file; every problem, in the YAML or in a
value, is one `ConfigError` whose message is one line naming the file and
the key (`configs/x.yaml: model.bottom_mlp: must be ...`) or the file, line
and column (`configs/x.yaml:3:5: YAML syntax error: ...`).
"""

import dataclasses
import difflib
import math
import re
from typing import List
from typing import Optional

import yaml

from tfde.config import COMBINERS

TABLE_OPTIMIZERS = ("adagrad", "adam", "ftrl", "rowwise_adagrad", "sgd")   # tfde.optimizers kinds
DENSE_OPTIMIZERS = ("adagrad", "adam", "sgd")           # Keras optimizers
DATA_KINDS = ("synthetic", "movielens")
# The dense features' input; a sparse feature may not take its name.
RESERVED_FEATURE_NAMES = ("dense",)
MAX_SEED = 2**31 - 1


class ConfigError(ValueError):
  """A bad job config: one line naming where and what.

  Attributes:
    key: Dotted path of the offending key ("model.bottom_mlp",
      "data.sparse_features[1].name"), a command-line option ("--data"), or
      None for a problem with the file itself.
    problem: What is wrong, e.g. "must be a positive int, got 0".
    file: The config file (or None).
    line, column: 1-based position in the file, for YAML errors.
  """

  def __init__(self, key, problem, file=None, line=None, column=None):
    self.key, self.problem = key, problem
    self.file, self.line, self.column = file, line, column
    super().__init__(str(self))

  def __str__(self):
    where = [str(p) for p in (self.file, self.line, self.column) if p is not None]
    parts = [":".join(where)] if where else []
    if self.key:
      parts.append(self.key)
    return ": ".join(parts + [self.problem])

  def within(self, prefix):
    """The same error for the key as seen from `prefix` (a section's key)."""
    key = self.key or ""
    if prefix and key:
      key = prefix + key if key.startswith("[") else f"{prefix}.{key}"
    return ConfigError(key or prefix, self.problem, self.file, self.line, self.column)

  def in_file(self, file):
    return ConfigError(self.key, self.problem, file, self.line, self.column)


# ----------------------------------------------------------------- specs
# A field's spec checks (and may normalise) a value, and says in words what
# it accepts: "must be {spec.what}, got {value!r}".


class Invalid(Exception):
  """Raised by a spec for a value it does not accept."""


class Spec:
  what = "valid"

  def check(self, value):
    raise NotImplementedError

  def dump(self, value):
    """The value as plain data for `get_config`."""
    return value


def _is_int(value):
  return isinstance(value, int) and not isinstance(value, bool)


class Int(Spec):
  """An int (not a bool) in [low, high]; either bound may be None."""

  def __init__(self, low=None, high=None):
    self.low, self.high = low, high
    if low == 1 and high is None:
      self.what = "a positive int"
    elif low == 0 and high is None:
      self.what = "a non-negative int"
    elif high is None:
      self.what = f"an int >= {low}"
    else:
      self.what = f"an int in [{low}, {high}]"

  def check(self, value):
    if not _is_int(value) or (self.low is not None and value < self.low) or (
        self.high is not None and value > self.high):
      raise Invalid
    return value


class Float(Spec):
  """A finite number (an int is taken as a float) greater than `above`."""

  def __init__(self, above):
    self.above = above
    self.what = "a positive finite number" if above == 0 else f"a finite number > {above}"

  def check(self, value):
    if not (_is_int(value) or isinstance(value, float)):
      raise Invalid
    value = float(value)
    if not math.isfinite(value) or value <= self.above:
      raise Invalid
    return value


class Choice(Spec):

  def __init__(self, options):
    self.options = tuple(options)
    self.what = f"one of {', '.join(self.options)}"

  def check(self, value):
    if not isinstance(value, str) or value not in self.options:
      raise Invalid
    return value


class Text(Spec):
  what = "a non-empty string"

  def check(self, value):
    if not isinstance(value, str) or not value:
      raise Invalid
    return value


class Name(Spec):
  """A feature name: it names a table, its variables and its saved weights."""
  what = ("a name of letters, digits and _ not starting with a digit, other "
          f"than {', '.join(RESERVED_FEATURE_NAMES)}")
  _pattern = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

  def check(self, value):
    if (not isinstance(value, str) or not self._pattern.match(value) or
        value in RESERVED_FEATURE_NAMES):
      raise Invalid
    return value


class OptionalOf(Spec):

  def __init__(self, spec):
    self.spec = spec
    self.what = f"{spec.what} or null"

  def check(self, value):
    return None if value is None else self.spec.check(value)


class ListOf(Spec):
  """A list whose items all meet `spec`; `what` words it ("a list of ...")."""

  def __init__(self, spec, what):
    self.spec, self.what = spec, what

  def check(self, value):
    if not isinstance(value, (list, tuple)):
      raise Invalid
    return [self.spec.check(v) for v in value]

  def dump(self, value):
    return [self.spec.dump(v) for v in value]


class Section(Spec):
  """A nested config: a mapping (built with `from_config`) or an instance."""

  def __init__(self, cls):
    self.cls = cls
    self.what = "a mapping"

  def check(self, value):
    if isinstance(value, self.cls):
      return value
    if not isinstance(value, dict):
      raise Invalid
    return self.cls.from_config(value)

  def dump(self, value):
    return value.get_config()


class Sections(Spec):
  """A list of nested configs; errors name the entry ("[2].name")."""

  def __init__(self, cls):
    self.section = Section(cls)
    self.what = "a list of mappings"

  def check(self, value):
    if not isinstance(value, (list, tuple)):
      raise Invalid
    out = []
    for i, v in enumerate(value):
      try:
        out.append(self.section.check(v))
      except Invalid:
        raise ConfigError(f"[{i}]", f"must be a mapping, got {v!r}") from None
      except ConfigError as e:
        raise e.within(f"[{i}]") from None
    return out

  def dump(self, value):
    return [self.section.dump(v) for v in value]


def field(spec, default=dataclasses.MISSING, default_factory=dataclasses.MISSING):
  """A config field with its spec."""
  return dataclasses.field(default=default, default_factory=default_factory,
                           metadata={"spec": spec})


class ConfigSection:
  """Base of the config dataclasses: the checks, from_config, get_config."""

  def __post_init__(self):
    for f in dataclasses.fields(self):
      spec = f.metadata["spec"]
      value = getattr(self, f.name)
      try:
        setattr(self, f.name, spec.check(value))
      except Invalid:
        raise ConfigError(f.name, f"must be {spec.what}, got {value!r}") from None
      except ConfigError as e:
        raise e.within(f.name) from None
    self.check()

  def check(self):
    """Rules across fields (overridden); raises ConfigError."""

  @classmethod
  def from_config(cls, config):
    """From a dict of plain values; unknown and missing keys are errors."""
    if not isinstance(config, dict):
      raise ConfigError(None, f"must be a mapping, got {config!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in sorted(config, key=str):
      if key not in fields:
        close = difflib.get_close_matches(str(key), list(fields), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ConfigError(str(key), f"unknown key; {hint}known keys: "
                          f"{', '.join(sorted(fields))}")
    for name, f in fields.items():
      if name not in config and f.default is dataclasses.MISSING and (
          f.default_factory is dataclasses.MISSING):
        raise ConfigError(name, "required key is missing")
    return cls(**config)

  def get_config(self):
    return {f.name: f.metadata["spec"].dump(getattr(self, f.name))
            for f in dataclasses.fields(self)}


# ---------------------------------------------------------------- schema


@dataclasses.dataclass
class SparseFeatureConfig(ConfigSection):
  """A categorical feature of the generated data, with its own table.

  Attributes:
    name: Names the feature and its table: letters, digits and _, not
      starting with a digit, not "dense" (the dense features' input).
      Unique among the features.
    vocabulary_size: Number of distinct ids (rows of its table), >= 1.
    hotness: Most ids per sample, >= 1; each sample draws 1 to `hotness`.
  """
  name: str = field(Name())
  vocabulary_size: int = field(Int(1))
  hotness: int = field(Int(1), default=1)


@dataclasses.dataclass
class DataConfig(ConfigSection):
  """The training data.

  Attributes:
    kind: "synthetic" (generated Criteo-like clicks with a hidden true
      model) or "movielens" (a ratings CSV at `path`). `tfde train --data
      PATH` trains on a MovieLens CSV whatever the kind.
    path: The MovieLens ratings CSV (userId,movieId,rating,...); required
      for kind movielens, relative to the working directory.
    train_samples: Training samples, >= 1 (MovieLens: at most this many).
    eval_samples: Held-out evaluation samples, >= 1.
    dense_features: Number of generated dense (float) features, >= 0.
    zipf_alpha: Skew of the generated ids' Zipf distribution, > 1.
    sparse_features: The generated categorical features
      (`SparseFeatureConfig`s), at least one for kind synthetic; names
      unique.
  """
  kind: str = field(Choice(DATA_KINDS), default="synthetic")
  path: Optional[str] = field(OptionalOf(Text()), default=None)
  train_samples: int = field(Int(1), default=100000)
  eval_samples: int = field(Int(1), default=20000)
  dense_features: int = field(Int(0), default=13)
  zipf_alpha: float = field(Float(above=1), default=1.1)
  sparse_features: List[SparseFeatureConfig] = field(
      Sections(SparseFeatureConfig), default_factory=list)

  def check(self):
    if self.kind == "movielens" and not self.path:
      raise ConfigError("path", "required when data.kind is movielens")
    if self.kind == "synthetic" and not self.sparse_features:
      raise ConfigError("sparse_features", "must list at least one feature "
                        "when data.kind is synthetic")
    first = {}
    for i, feature in enumerate(self.sparse_features):
      if feature.name in first:
        raise ConfigError(f"sparse_features[{i}].name", f"duplicate feature "
                          f"name {feature.name!r} (also sparse_features"
                          f"[{first[feature.name]}])")
      first[feature.name] = i


@dataclasses.dataclass
class TableOptimizerConfig(ConfigSection):
  """The tables' sparse optimizer (each table gets its own, which updates
  only the rows a step looked up).

  Attributes:
    kind: adagrad, adam (lazy Adam), ftrl, rowwise_adagrad or sgd.
    learning_rate: A finite number > 0.
  """
  kind: str = field(Choice(TABLE_OPTIMIZERS))
  learning_rate: float = field(Float(above=0))


@dataclasses.dataclass
class DenseOptimizerConfig(ConfigSection):
  """The dense layers' Keras optimizer (given to `model.compile`; it never
  sees a table).

  Attributes:
    kind: adagrad, adam or sgd.
    learning_rate: A finite number > 0.
  """
  kind: str = field(Choice(DENSE_OPTIMIZERS))
  learning_rate: float = field(Float(above=0))


_UNITS = ListOf(Int(1), "a list of positive ints")


@dataclasses.dataclass
class ModelConfig(ConfigSection):
  """The DLRM-style model.

  Attributes:
    embedding_dim: Width of every table's rows, >= 1.
    combiner: How a sample's ids combine: one of mean, sum, sqrtn.
    bottom_mlp: Units of the dense features' MLP, positive ints ending in
      `embedding_dim` (its output joins the pairwise dot interaction); not
      empty when there are dense features.
    top_mlp: Units of the MLP over the interactions (then one output unit).
    table_optimizer: The tables' sparse optimizer (`TableOptimizerConfig`).
    dense_optimizer: The dense layers' Keras optimizer
      (`DenseOptimizerConfig`).
  """
  embedding_dim: int = field(Int(1), default=16)
  combiner: str = field(Choice(COMBINERS), default="mean")
  bottom_mlp: List[int] = field(_UNITS, default_factory=lambda: [64, 16])
  top_mlp: List[int] = field(_UNITS, default_factory=lambda: [128, 64])
  table_optimizer: TableOptimizerConfig = field(
      Section(TableOptimizerConfig),
      default_factory=lambda: TableOptimizerConfig("adagrad", 0.05))
  dense_optimizer: DenseOptimizerConfig = field(
      Section(DenseOptimizerConfig),
      default_factory=lambda: DenseOptimizerConfig("adam", 0.001))

  def check(self):
    if self.bottom_mlp and self.bottom_mlp[-1] != self.embedding_dim:
      raise ConfigError("bottom_mlp", f"must end in embedding_dim "
                        f"({self.embedding_dim}) for the dot interaction, got "
                        f"{self.bottom_mlp}")


@dataclasses.dataclass
class TrainingConfig(ConfigSection):
  """The training loop.

  Attributes:
    batch_size: Global batch (split over the replicas): at least
      `replicas`, at most the train and the eval samples.
    epochs: Passes over the training data, >= 1.
  """
  batch_size: int = field(Int(1), default=1024)
  epochs: int = field(Int(1), default=1)


@dataclasses.dataclass
class JobConfig(ConfigSection):
  """A `tfde train` job. Every field is checked; unknown keys are errors.

  Attributes:
    name: The job's name, for the report.
    data: The data (`DataConfig`).
    model: The model (`ModelConfig`).
    training: The training loop (`TrainingConfig`).
    replicas: Number of replicas (GPUs, or logical CPU devices), >= 1.
    seed: Seeds the data, the tables and Keras, in [0, 2**31 - 1].
    report_dir: Where the report goes (`--report-dir` overrides); must be
      writable, which is checked before training.
  """
  name: str = field(Text())
  data: DataConfig = field(Section(DataConfig))
  model: ModelConfig = field(Section(ModelConfig), default_factory=ModelConfig)
  training: TrainingConfig = field(Section(TrainingConfig),
                                   default_factory=TrainingConfig)
  replicas: int = field(Int(1), default=1)
  seed: int = field(Int(0, MAX_SEED), default=0)
  report_dir: str = field(Text(), default="reports/job")

  def check(self):
    batch, d = self.training.batch_size, self.data
    if batch < self.replicas:
      raise ConfigError("training.batch_size", f"must be at least replicas "
                        f"({self.replicas}), got {batch}")
    if batch > d.train_samples or batch > d.eval_samples:
      raise ConfigError("training.batch_size", f"must be at most "
                        f"data.train_samples ({d.train_samples}) and "
                        f"data.eval_samples ({d.eval_samples}), got {batch}")
    if d.kind == "synthetic" and d.dense_features and not self.model.bottom_mlp:
      raise ConfigError("model.bottom_mlp", "must not be empty when "
                        "data.dense_features > 0")


# ------------------------------------------------------------------ YAML


class _DuplicateKey(yaml.MarkedYAMLError):
  pass


class _Loader(yaml.SafeLoader):
  """Safe YAML, but a key given twice is an error (not "last one wins"),
  and 1e-3 is a float as in YAML 1.2 (YAML 1.1 wants 1.0e-3)."""

  def construct_mapping(self, node, deep=False):
    seen = {}
    merges = any(k.tag == "tag:yaml.org,2002:merge" for k, _ in node.value)
    for key_node, _ in [] if merges else node.value:  # merged keys may repeat
      key = self.construct_object(key_node, deep=True)
      try:
        first = seen.get(key)
      except TypeError:
        continue  # unhashable: SafeLoader reports it
      if first is not None:
        raise _DuplicateKey(problem=f"duplicate key {key!r} (first on line "
                            f"{first.line + 1})", problem_mark=key_node.start_mark)
      seen[key] = key_node.start_mark
    return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def _position(text, index):
  """1-based (line, column) of a character index."""
  line = text.count("\n", 0, index) + 1
  return line, index - (text.rfind("\n", 0, index) + 1) + 1


def load_config(path):
  """A JobConfig from a YAML file; any problem raises one ConfigError."""
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise ConfigError(None, f"cannot read the config: {e.strerror or e}",
                      file=path) from None
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ConfigError(None, f"not a YAML text file (byte 0x{data[e.start]:02x} "
                      f"at offset {e.start} is not UTF-8)", file=path) from None
  try:
    raw = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
  except yaml.reader.ReaderError as e:
    line, column = _position(text, e.position)
    character = e.character if isinstance(e.character, int) else ord(e.character)
    raise ConfigError(None, f"not a YAML text file (character #x{character:04x} "
                      f"is not allowed)", path, line, column) from None
  except yaml.MarkedYAMLError as e:
    mark = e.problem_mark or e.context_mark
    syntax = (yaml.scanner.ScannerError, yaml.parser.ParserError,
              yaml.composer.ComposerError)
    kind = "YAML syntax error" if isinstance(e, syntax) else "YAML error"
    context = e.context
    if context and e.context_mark and e.context_mark is not mark:
      context += (f" (from line {e.context_mark.line + 1}, column "
                  f"{e.context_mark.column + 1})")
    problem = ": ".join(p for p in (context, e.problem) if p) or "invalid YAML"
    raise ConfigError(None, f"{kind}: {problem}", path,
                      mark.line + 1 if mark else None,
                      mark.column + 1 if mark else None) from None
  except yaml.YAMLError as e:
    raise ConfigError(None, f"YAML error: {str(e).splitlines()[0]}",
                      file=path) from None
  if raw is None:
    raise ConfigError(None, "the config is empty", file=path)
  if not isinstance(raw, dict):
    raise ConfigError(None, f"the config must be a mapping of keys (name, "
                      f"data, model, ...), got {type(raw).__name__} {raw!r:.60}",
                      file=path)
  try:
    return JobConfig.from_config(raw)
  except ConfigError as e:
    raise e.in_file(path) from None
