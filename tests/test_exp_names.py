"""An --exp naming a class its existing module does not register: one line with "did you mean", before paxml, jax
or TensorFlow is imported (read from the module's source); unsure sources are left to paxml's import."""

import os
import subprocess
import sys
import textwrap

import pytest

from pax_autockpt.startup import experiment_names
from tests.test_bad_input import _heavy_imports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = 'experiments.lm_cloud_autockpt'


def test_a_misspelt_class_fails_before_tensorflow_with_did_you_mean(tmp_path):
  out = subprocess.run([sys.executable, '-X', 'importtime', '-m', 'pax_autockpt.main',
                        f'--exp={MODULE}.LmCloudSpmdTinyAutockt', f'--job_log_dir={tmp_path}/job'],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
  lines = [line for line in out.stderr.splitlines() if not line.startswith('import time:')]
  assert out.returncode == 2 and len(lines) == 1, lines
  assert lines[0] == (f'error: --exp={MODULE}.LmCloudSpmdTinyAutockt is not a registered experiment: did you mean '
                      f'--exp={MODULE}.LmCloudSpmdTinyAutockpt or --exp={MODULE}.LmCloudSpmdTinyShortAutockpt or '
                      f'--exp={MODULE}.LmCloudSpmd2BAutockpt?')
  assert not _heavy_imports(out.stderr), _heavy_imports(out.stderr)[:5]
  assert not (tmp_path / 'job').exists()


def test_registered_classes_are_read_from_the_source_and_a_registered_one_passes():
  assert experiment_names.unknown(experiment_names.EXAMPLE) is None
  assert experiment_names.unknown(MODULE) is None  # a module without its class: paxml's own line says so
  assert experiment_names.class_missing(f'{MODULE}.Nope').endswith(
      f'{MODULE} registers LmCloudSpmd2BAutockpt, LmCloudSpmd2BContinuousAutockpt, LmCloudSpmd2BMultislice16Autockpt, '
      'LmCloudSpmd2BMultisliceAutockpt, LmCloudSpmdTinyAutockpt, LmCloudSpmdTinyContinuousAutockpt, '
      'LmCloudSpmdTinyMultisliceAutockpt, LmCloudSpmdTinyShortAutockpt, LmCloudSpmdTinyTFRecordAutockpt')


@pytest.mark.parametrize('source,decided', [
    ('@experiment_registry.register\nclass Model:\n  pass\n', True),
    ('@experiment_registry.register(tags=["x"])\n@other\nclass Model:\n  pass\n', True),
    ('@register\nclass Model:\n  pass\nregister(type("Nope", (), {}))\n', False),  # registers what it does not name
    ('from elsewhere import *\n@register\nclass Model:\n  pass\n', False),
    ('@register\nclass Model:\n  pass\nNope = Model\n', False),  # binds the name
    ('from elsewhere import Nope\n@register\nclass Model:\n  pass\n', False),
    ('@my_experiment\nclass Model:\n  pass\n', False),  # its own decorator may register: unsure
    ('@register\nclass Model(:\n', False),  # does not parse: paxml's import says why
])
def test_only_a_source_that_shows_every_registration_decides(tmp_path, monkeypatch, source, decided):
  (tmp_path / 'userexp').mkdir()
  (tmp_path / 'userexp' / 'models.py').write_text(textwrap.dedent(source))
  monkeypatch.syspath_prepend(str(tmp_path))
  error = experiment_names.unknown('userexp.models.Nope')
  assert (error == '--exp=userexp.models.Nope is not a registered experiment: userexp.models registers Model'
          if decided else error is None), error
