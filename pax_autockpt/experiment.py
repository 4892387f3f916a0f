"""A mixin that gives any Pax experiment the Autocheckpoint program hook.

Its two methods are the plugin's entry points under stock paxml/main.py too: Pax calls `validate()`
after jax.distributed is up and before it builds the checkpointer, and `executor()` for the program
executor. A bad setting ends the run here with one line and exit 2 (stock main would print a traceback).
"""

import sys

from pax_autockpt import settings as settings_lib
from pax_autockpt.hosts import hosts
from pax_autockpt.startup import startup_times


def _config_error(message: str) -> None:
  print(f'error: {message}', file=sys.stderr, flush=True)
  sys.exit(2)


class AutockptMixin:
  """Put first in the bases of a Pax experiment: `class MyExp(AutockptMixin, LmCloudSpmd2B)`.

  Each `AUTOCKPT_*` attribute is a field of `pax_autockpt.settings.Settings` with its default (set
  below, from that one declaration); a subclass overrides them and an `--autockpt_*` flag given to
  `python -m pax_autockpt.main` overrides both (docs/settings.md).
  """

  def autockpt_settings(self) -> settings_lib.Settings:
    return settings_lib.resolve(self)

  def validate(self) -> None:
    startup_times.mark(startup_times.VALIDATED)  # paxml's setup_jax (jax.distributed's initialize) just ended
    from pax_autockpt.signals import signals  # pylint: disable=g-import-not-at-top
    signals.take_sigterm_back_from_xla()  # a SIGTERM from here on is recorded on arrival, not only by XLA
    super().validate()
    try:
      settings = self.autockpt_settings()
    except settings_lib.ConfigError as e:
      _config_error(str(e))
    self._check_processes()
    self._check_mesh()
    from absl import logging  # pylint: disable=g-import-not-at-top

    from pax_autockpt.shared import internals  # pylint: disable=g-import-not-at-top  (orbax-heavy)
    warning = internals.version_warning()
    if warning:
      logging.warning('[autockpt] %s', warning)
    internals.keep_unrestorable_at_startup()  # before Pax builds the checkpoint manager
    internals.retry_listing(settings.restore_retry_secs)

  def _check_processes(self) -> None:
    """Several processes without jax.distributed's client (stock paxml main skips its initialize
    under --jax_fully_async_checkpoint=false): every barrier and broadcast of the saves would silently
    do nothing, and hosts would commit before their peers finished writing."""
    import jax  # pylint: disable=g-import-not-at-top

    from pax_autockpt.shared import coordination  # pylint: disable=g-import-not-at-top
    if jax.process_count() > 1 and coordination.client() is None:
      _config_error(f'{jax.process_count()} processes but no jax.distributed coordination service: pass '
                    '--jax_fully_async_checkpoint=true (python -m pax_autockpt.main does) or call '
                    'jax.distributed.initialize() before training')

  def _check_mesh(self) -> None:
    import jax  # pylint: disable=g-import-not-at-top
    model = self.task().model
    if model.ici_mesh_shape is None:
      return  # pmap model: no mesh
    try:
      hosts.check_mesh(num_hosts=jax.process_count(), devices_per_host=jax.local_device_count(),
                       ici_mesh_shape=model.ici_mesh_shape, dcn_mesh_shape=model.dcn_mesh_shape)
    except hosts.WiringError as e:
      _config_error(f'{type(self).__name__}: {e}')

  def executor(self):
    try:
      settings = self.autockpt_settings()
    except settings_lib.ConfigError as e:
      _config_error(str(e))
    from pax_autockpt import executor  # pylint: disable=g-import-not-at-top  (paxml-heavy)
    return executor.AutockptExecutor(settings)


for _name, _field in settings_lib.FIELDS.items():
  setattr(AutockptMixin, settings_lib.attribute(_name), _field.default)
