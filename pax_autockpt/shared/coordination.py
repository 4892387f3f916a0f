"""The one place that touches JAX's coordination service, and every key the job keeps in it.

Hosts agree with each other (a save decision, a restore's plan, a signal) through the key-value store and the
barriers of the coordination service `jax.distributed.initialize` starts on host 0, never a device collective.
Its client is only reachable through JAX's private `jax._src.distributed`; reading it here alone keeps that
dependency, and the workarounds jaxlib 0.4.26 needs, in one file, and gives one list to read of what the
job keeps in host 0's memory (a key is set once: a second set fails with ALREADY_EXISTS; nothing expires).

Every key family (name: prefix — written by; read by; deleted):
  SAVE_DECISIONS         autockpt/decision/<n>            host 0 (agreement.PrimaryDecides, the job directory's save);
                                                          every other host; by host 0 at exchange n + 2
  LOCAL_SAVE_DECISIONS   autockpt/local-decision/<n>      the same for the local tier's save (local.saving)
  NOTICES                autockpt/notice/<generation>     the host that saw a notice, or `stop` at the exit
                         (+ /step/<host>, /barrier)       (notices.NoticeAgreement); every host's listener; never
  STARTUP_EXIT           autockpt/startup-exit            the first host to claim it, `exit` or `trained`
                                                          (startup_exit); every host's waiting thread; never
  CTRL_C_HOSTS           autockpt/interrupt/<process>     each host that got a Ctrl-C (preemption); every host at
                                                          the agreed step; never
  ORBAX_SYNC             autockpt/orbax/<kind>/<name>/<n> orbax's barriers and broadcasts (internals): process 0
                                                          the broadcast's value, the others read it; never
  BUDDY_ADDRESSES        autockpt/buddy/<host>            each host its server's address and secret, or its
                                                          error (local.buddy); its keeper; never
  LOCAL_INPUT_POSITIONS  autockpt/local/<step>/<host>     each host its input position at a local save
                                                          (local.saving); every host, before the commit; by
                                                          each host, its own, once two newer steps were saved
  LOCAL_RESTORE          autockpt/local-restore/          plan/<n> and fill/<plan>/<step>/done: reports (below);
                                                          fill/<plan>/<step>/<donor>/<buddy>/peer: a donor's
                                                          address and secret (local.restoring), read by the
                                                          hosts it serves, deleted by the donor after the fill
  SIGNAL_BEFORE_TRAINING autockpt/signal-before-training  reports (preemption, at the loop's first iteration)
  FREE_NAME              autockpt/free-name/<step>/<try>  reports (checkpointer: a damaged step moved aside)
  RESTORE                autockpt/restore/<attempt>/<step>/<tries>/<phase>  reports (restore's checks)
  SET_ASIDE              autockpt/set-aside/<step>        reports (restore: a damaged checkpoint set aside)
  LINEAGE_IDS            autockpt/lineage/ids             reports (local.lineage: the job's and the run's ids)
  EXIT_PLAN, EXIT_REPLAN autockpt/exit-plan/<step>, autockpt/exit-replan/<step>  reports (exit_path); before the
                                                          plan, autockpt/exit-plan/<step>/deadline: each host's own
  OWED_WORK              autockpt/owed-work               reports (executor: host 0's answer, owed_work)

Reports (agreement.reports, each key used once): <key>/host/<host> every host's finding, <key>/outcome the
first host's verdict (ok or a timeout), both read by every host and never deleted; <key>/progress/<host>/<n>
a working host's signs of progress, each deleted by it once it sets the next.
"""

from typing import Any

from jax._src import distributed

SAVE_DECISIONS = 'autockpt/decision/'
LOCAL_SAVE_DECISIONS = 'autockpt/local-decision/'
NOTICES = 'autockpt/notice/'
STARTUP_EXIT = 'autockpt/startup-exit'
CTRL_C_HOSTS = 'autockpt/interrupt/'
ORBAX_SYNC = 'autockpt/orbax/'
BUDDY_ADDRESSES = 'autockpt/buddy/'
LOCAL_INPUT_POSITIONS = 'autockpt/local/'
LOCAL_RESTORE = 'autockpt/local-restore/'
SIGNAL_BEFORE_TRAINING = 'autockpt/signal-before-training'
FREE_NAME = 'autockpt/free-name/'
RESTORE = 'autockpt/restore/'
SET_ASIDE = 'autockpt/set-aside/'
LINEAGE_IDS = 'autockpt/lineage/ids'
EXIT_PLAN = 'autockpt/exit-plan/'
EXIT_REPLAN = 'autockpt/exit-replan/'
OWED_WORK = 'autockpt/owed-work'


def client() -> Any:
  """jax.distributed's coordination client; None when it was not initialised (one process started without it).
  A job initialised with one process has one: callers that need peers also check `jax.process_count()`."""
  return distributed.global_state.client


def coordinator_address() -> str | None:
  """"host:port" of the coordination service (host 0), as jax.distributed was given it; None without it."""
  return distributed.global_state.coordinator_address


def process_id() -> int | None:
  """This process's id in jax.distributed; None when it was not initialised."""
  return distributed.global_state.process_id


def preemption_sync_manager() -> Any:
  """XLA's preemption sync manager (it owns SIGTERM once jax.distributed is up); None without jax.distributed."""
  return distributed.global_state.preemption_sync_manager


def claim(service: Any, key: str, value: str) -> bool:
  """Sets `key` if no host did yet: first writer wins (a key is set once; a later set fails with
  ALREADY_EXISTS). False when it was there already (or the service refused: the caller reads what is there)."""
  try:
    service.key_value_set(key, value)
    return True
  except Exception:  # pylint: disable=broad-except  (ALREADY_EXISTS: another host wrote first)
    return False


def delete(service: Any, key: str) -> None:
  """Deletes `key` and every key under `key/`. Any error but jaxlib 0.4.26's harmless one is the caller's."""
  try:
    service.key_value_delete(key)
  except TypeError:
    pass  # jaxlib 0.4.26 deletes, then cannot convert the returned absl::Status
