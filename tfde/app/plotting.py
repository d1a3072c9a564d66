"""matplotlib for the `tfde` commands' plots, where it is installed.

matplotlib is optional (`pip install tfde[plots]` brings it): a job or a plan
without it still writes its numbers, and says that it drew no plot.

>>> plt = pyplot("tfde example")
>>> plt is None or plt.get_backend().lower() == "agg"
True
"""


def pyplot(command):
  """`matplotlib.pyplot` on the file-only Agg backend, or None (after a line
  saying `command` draws no plots) where matplotlib is not installed."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    print(f"{command}: matplotlib is not installed; no plots")
    return None
  return plt
