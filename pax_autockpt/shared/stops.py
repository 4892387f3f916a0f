"""How training ends early: the checkpointer raises, the executor alone turns it into an exit code.

As MaxText's StopTraining: the code that notices (the checkpointer, inside Pax's loop) does not decide
how the process ends; `AutockptExecutor.start` catches these, writes the `exit` event and exits.
"""

import dataclasses


@dataclasses.dataclass
class StopTraining(Exception):
  """The training loop ends at `step`."""

  step: int | None
  message: str

  def __str__(self) -> str:
    return self.message


@dataclasses.dataclass
class Preempted(StopTraining):
  """A preemption signal was handled: the agreed step is committed (or saving is off); exit with the
  configured preemption code (143 by default) so that the scheduler restarts the job, or with 130 when
  the signal was Ctrl-C on any host (a person stopped it: no scheduler should take it for a preemption)."""

  signal: str = 'SIGTERM'


class SaveFailed(StopTraining):
  """The on-demand save did not commit; a restart resumes from the newest committed checkpoint."""


class RestoreMismatch(StopTraining):
  """The checkpoint to restore is whole but does not fit this run (a changed config): exit 2, nothing
  moved; the same checkpoint restores once the config is right."""


class RestoreFailed(StopTraining):
  """The checkpoint could not be restored for a reason that is not damage (storage errors that outlasted
  the retries, or an error not recognised): exit 1, nothing moved."""
