"""The local directory is this user's alone, and a lock error says what it is (issue 57).

A local step passes every check a restart makes (the job id and the event log are world-readable, xxh3 is not
keyed), so a directory another user can write into lets that user plant the weights this job restores. Another
user is simulated as root does: chown to uid 65534 (nobody). A run on such a directory exits 2 in one line
naming --autockpt_local_dir and the fix, before paxml (a real process); the directories the job makes are 0700.
"""

import errno
import os
import stat
import subprocess
import sys

import pytest

from pax_autockpt import settings as settings_lib
from pax_autockpt.local import lock
from pax_autockpt.startup import experiment_names

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOBODY = 65534


def _mode(path) -> int:
  return stat.S_IMODE(os.stat(path).st_mode)


def _needs_root():
  if os.geteuid() != 0:
    pytest.skip('simulating another user (chown) needs root')


def test_a_run_on_a_local_directory_another_user_owns_exits_2_in_one_line_before_paxml(tmp_path):
  """Was: accepted and trained on. Now a real `main` exits 2, one `error:` line naming the flag, the owner and the
  fix, and writes nothing into that directory or the job directory."""
  _needs_root()
  planted = tmp_path / 'local-0'
  planted.mkdir(mode=0o700)
  os.chown(planted, NOBODY, NOBODY)
  done = subprocess.run([sys.executable, '-m', 'pax_autockpt.main', f'--exp={experiment_names.EXAMPLE}',
                         f'--job_log_dir={tmp_path}/job', f'--autockpt_local_dir={tmp_path}/local-{{host}}'],
                        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
  errors = [line for line in done.stderr.splitlines() if line.startswith('error:')]
  assert done.returncode == 2, done.stderr[-3000:]
  assert len(errors) == 1, done.stderr[-3000:]
  assert errors[0].startswith(f'error: --autockpt_local_dir {planted}: {planted} is owned by uid {NOBODY}') or \
      errors[0].startswith(f'error: --autockpt_local_dir {planted}: {planted} is owned by nobody (uid {NOBODY})')
  assert 'choose a directory of your own, or remove it so that the job makes it (mode 0700)' in errors[0]
  assert os.listdir(planted) == [] and not (tmp_path / 'job').exists()


@pytest.mark.parametrize('mode', [0o777, 0o775, 0o757, 0o1777], ids=oct)
def test_a_local_directory_group_or_others_can_write_is_refused_in_one_line(tmp_path, mode):
  folder = tmp_path / 'local'
  folder.mkdir()
  folder.chmod(mode)
  with pytest.raises(settings_lib.ConfigError) as refused:
    lock.hold(folder, tmp_path / 'job', 0)
  assert str(refused.value) == (
      f'--autockpt_local_dir {folder}: {folder} is writable by group or others (mode {mode:o}): another user could '
      f'put a step in it that this job would restore: run chmod go-w {folder}, or choose another directory (the job '
      'makes its own with mode 0700)')
  assert not (folder / lock.LOCK_FILE).exists()


def test_a_symlink_another_user_planted_to_a_directory_of_ours_is_refused(tmp_path):
  """Whoever owns the link can point it elsewhere between two runs."""
  _needs_root()
  (tmp_path / 'ours').mkdir(mode=0o700)
  link = tmp_path / 'local'
  link.symlink_to(tmp_path / 'ours')
  os.lchown(link, NOBODY, NOBODY)
  with pytest.raises(settings_lib.ConfigError, match=f'{link} is owned by .*uid {NOBODY}'):
    lock.hold(link, tmp_path / 'job', 0)


def test_the_directories_the_job_makes_for_its_local_tier_are_mode_0700_its_lock_file_0600(tmp_path):
  """Was 0755 (os.makedirs: 0777 less the umask): anyone could list and read the steps. The parents the job makes
  for the tier are its own too; a parent that was there keeps its mode."""
  tmp_path.chmod(0o755)
  folder = tmp_path / 'shm' / 'pax' / 'autockpt-0'
  lock.hold(folder, tmp_path / 'job', 0)
  assert [_mode(p) for p in (folder, folder.parent, folder.parent.parent)] == [0o700, 0o700, 0o700]
  assert _mode(tmp_path) == 0o755
  assert _mode(folder / lock.LOCK_FILE) == 0o600


def test_a_directory_of_this_user_not_writable_by_others_is_taken_as_it_is(tmp_path):
  folder = tmp_path / 'local'
  folder.mkdir(mode=0o755)
  lock.hold(folder, tmp_path / 'job', 0)
  assert _mode(folder) == 0o755 and (folder / lock.LOCK_FILE).exists()


@pytest.mark.parametrize('code', [errno.ENOLCK, errno.EINVAL, errno.EBADF])
def test_a_lock_error_other_than_held_says_the_filesystem_cannot_lock(tmp_path, monkeypatch, code):
  """NFS without lock support answers ENOLCK: that read 'held by a live process (pid N ...)', often this job's own
  dead previous run, and told the user to stop it."""
  folder = tmp_path / 'local'
  folder.mkdir()
  (folder / lock.LOCK_FILE).write_text('{"pid": 4242, "machine": "vm", "job_log_dir": "/j", "host": 0}')

  def flock(fd, operation):
    raise OSError(code, os.strerror(code))

  monkeypatch.setattr(lock.fcntl, 'flock', flock)
  with pytest.raises(settings_lib.ConfigError) as refused:
    lock.hold(folder, tmp_path / 'job', 0)
  assert not isinstance(refused.value, lock.InUse)
  assert str(refused.value) == (
      f'--autockpt_local_dir {folder}: its filesystem cannot lock (OSError: [Errno {code}] {os.strerror(code)}), so '
      "one job per directory cannot be enforced: choose a directory on the host's own disk (/dev/shm, a local SSD), "
      'not a network filesystem')
  assert '4242' not in str(refused.value)


def test_a_lock_held_elsewhere_still_names_its_holder(tmp_path, monkeypatch):
  """EWOULDBLOCK is the one answer that means another live process holds it."""
  folder = tmp_path / 'local'
  folder.mkdir()
  (folder / lock.LOCK_FILE).write_text('{"pid": 4242, "machine": "vm", "job_log_dir": "/j", "host": 0}')

  def flock(fd, operation):
    raise BlockingIOError(errno.EWOULDBLOCK, os.strerror(errno.EWOULDBLOCK))

  monkeypatch.setattr(lock.fcntl, 'flock', flock)
  with pytest.raises(lock.InUse, match=r'is held by a live process \(pid 4242 on vm'):
    lock.hold(folder, tmp_path / 'job', 0)
