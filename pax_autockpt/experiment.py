"""A mixin that gives any Pax experiment the Autocheckpoint program hook."""

import sys

from absl import logging

from pax_autockpt import settings as settings_lib


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

  def executor(self):
    """Pax's hook for the program executor (`BaseExperiment.executor`)."""
    try:
      settings = self.autockpt_settings()
    except settings_lib.ConfigError as e:
      # Stock paxml/main.py would print a traceback; one line and exit 2 is the contract.
      logging.error('[autockpt] %s', e)
      print(f'error: {e}', file=sys.stderr)
      sys.exit(2)
    from pax_autockpt import executor  # pylint: disable=g-import-not-at-top  (paxml-heavy)
    return executor.AutockptExecutor(settings)
