"""Every ```python block of the user guide (docs/**/*.md) runs.

A page's blocks run in order in one namespace (a later block may use an
earlier one's names), each page in its own; all pages in one fresh process
(TensorFlow starts once), except a page marked `<!-- docs-test: own-process -->`
(one that sets TensorFlow's devices, as the DTensor page does), which gets a
fresh process of its own. A failure names the page and the block's line.
"""

import glob
import importlib.util
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
OWN_PROCESS = "<!-- docs-test: own-process -->"


def python_blocks(path):
  """[(line, code)] of the ```python blocks of a Markdown file."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in BLOCK.finditer(text)]


def run_pages(paths):
  """Runs each page's blocks; returns [(page, line, error)]."""
  import traceback  # pylint: disable=g-import-not-at-top
  failures = []
  for path in paths:
    namespace = {"__name__": "__docs__"}
    for line, code in python_blocks(path):
      try:
        exec(compile(code, f"{path}:{line}", "exec"), namespace)  # pylint: disable=exec-used
      except Exception:  # pylint: disable=broad-except
        failures.append((path, line, traceback.format_exc(limit=-3)))
        break
  return failures


def test_the_guide_has_code_and_every_page_is_in_the_nav():
  pages = sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))
  with open(os.path.join(REPO, "mkdocs.yml"), encoding="utf-8") as f:
    nav = f.read()
  for page in pages:
    assert os.path.relpath(page, os.path.join(REPO, "docs")) in nav, page
  assert sum(len(python_blocks(p)) for p in pages) >= 10


def guide_pages():
  return sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))


def needs_own_process(path):
  with open(path, encoding="utf-8") as f:
    return OWN_PROCESS in f.read()


def run_in_fresh_process(pages):
  code = ("import sys\nfrom tests.unit import test_docs\n"
          f"failures = test_docs.run_pages({pages!r})\n"
          "for page, line, error in failures:\n"
          "  print(f'{page}:{line}:\\n{error}')\n"
          "sys.exit(1 if failures else 0)\n")
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
  return result


def test_every_python_block_runs():
  run_in_fresh_process([p for p in guide_pages() if not needs_own_process(p)])


def test_the_dtensor_page_runs_in_its_own_process():
  page = os.path.join(REPO, "docs", "doors", "dtensor.md")
  assert needs_own_process(page) and python_blocks(page)
  if importlib.util.find_spec("tf_keras") is None:
    pytest.skip("the DTensor page needs tf_keras (make installs it in .venv)")
  result = run_in_fresh_process([page])
  assert "loss after 3 steps:" in result.stdout, result.stdout


def test_every_own_process_page_is_run():
  own = [os.path.relpath(p, REPO) for p in guide_pages() if needs_own_process(p)]
  assert own == [os.path.join("docs", "doors", "dtensor.md")], own
