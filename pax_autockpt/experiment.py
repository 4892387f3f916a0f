"""A mixin that gives any Pax experiment the Autocheckpoint program hook."""

import math
import sys

from pax_autockpt import settings as settings_lib


def _config_error(message: str) -> None:
  """One line on stderr, exit 2 (stock paxml/main.py would print a traceback)."""
  print(f'error: {message}', file=sys.stderr, flush=True)
  sys.exit(2)


class AutockptMixin:
  """Put first in the bases of a Pax experiment: `class MyExp(AutockptMixin, LmCloudSpmd2B)`.

  The attributes below are the defaults; a subclass overrides them and an `--autockpt_*` flag given
  to `python -m pax_autockpt.main` overrides both (README, "Settings").
  """

  AUTOCKPT_EXIT_CODE = 143  # exit code after a committed on-demand checkpoint
  AUTOCKPT_CONTINUOUS = False  # start a new save as soon as the previous one committed
  AUTOCKPT_MIN_INTERVAL_SECS = 0.0  # continuous: no two saves closer than this
  AUTOCKPT_KEEP_LATEST = None  # preservation: keep the newest N checkpoints
  AUTOCKPT_KEEP_EVERY_SECS = None  # preservation: keep one checkpoint per this many seconds
  AUTOCKPT_SAVE_POLICY = None  # a pax_autockpt.policies save-decision policy (or Fiddle config)
  AUTOCKPT_PRESERVATION_POLICY = None  # a pax_autockpt.policies preservation policy (or Fiddle config)

  def autockpt_settings(self) -> settings_lib.Settings:
    return settings_lib.resolve(self)

  def validate(self) -> None:
    """Pax calls this after jax.distributed is up and before anything is written or trained."""
    super().validate()
    try:
      self.autockpt_settings()
    except settings_lib.ConfigError as e:
      _config_error(str(e))
    self._check_mesh()

  def _check_mesh(self) -> None:
    import jax  # pylint: disable=g-import-not-at-top
    model = self.task().model
    ici, dcn = model.ici_mesh_shape, model.dcn_mesh_shape or [1]
    if ici is None:
      return  # pmap model: no mesh
    need, have = math.prod(ici) * math.prod(dcn), jax.device_count()
    if need != have:
      _config_error(
          f'{type(self).__name__}: ICI_MESH_SHAPE={list(ici)} x DCN_MESH_SHAPE={list(dcn)} needs {need} '
          f'devices, this job has {have} ({jax.process_count()} host(s) x {jax.local_device_count()}): '
          'change the mesh shapes or the number of hosts/devices')

  def executor(self):
    """Pax's hook for the program executor (`BaseExperiment.executor`)."""
    try:
      settings = self.autockpt_settings()
    except settings_lib.ConfigError as e:
      _config_error(str(e))
    from pax_autockpt import executor  # pylint: disable=g-import-not-at-top  (paxml-heavy)
    return executor.AutockptExecutor(settings)
