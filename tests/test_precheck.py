"""What pax_autockpt.main decides before paxml is imported: unknown --autockpt_* flags, required flags,
an --exp whose module does not exist, and --help. docs/bad-input.md runs the same cases as commands."""

import os
import subprocess
import sys

import pytest

from pax_autockpt import settings as settings_lib
from pax_autockpt.startup import experiment_names
from pax_autockpt.startup import precheck

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = f'--exp={experiment_names.EXAMPLE}'
JOB = '--job_log_dir=/nonexistent/job'


def _error(*args: str) -> str:
  with pytest.raises(settings_lib.ConfigError) as e:
    precheck.run(['main', *args])
  assert '\n' not in str(e.value)
  return str(e.value)


@pytest.mark.parametrize('flag,expected', [
    ('--autockpt_keep_lastest=3', 'unknown flag --autockpt_keep_lastest: did you mean --autockpt_keep_latest?'),
    ('--noautockpt_checksum', 'unknown flag --noautockpt_checksum: did you mean --noautockpt_checksums?'),
    ('--autockpt_exit_cod', 'unknown flag --autockpt_exit_cod: did you mean --autockpt_exit_code?'),
    ('--autockpt_zzz=1', 'unknown flag --autockpt_zzz: .venv/bin/python -m pax_autockpt.main --help lists the flags'),
])
def test_an_unknown_autockpt_flag_names_the_closest(flag, expected):
  assert _error(TINY, JOB, flag) == expected


def test_unknown_autockpt_flags_are_caught_even_where_the_rest_cannot_be_read():
  assert _error('--flagfile=/nonexistent', '--autockpt_keep_lastest=3').startswith('unknown flag')


def test_other_unknown_names_and_what_follows_a_double_dash_wait_for_absl():
  precheck.run(['main', TINY, JOB, '--num_hosst=1', '--', '--autockpt_zzz'])


def test_exp_and_job_log_dir_are_required_and_a_near_miss_is_named():
  assert _error(JOB) == precheck.EXP_REQUIRED
  assert _error(TINY) == precheck.JOB_REQUIRED
  assert _error(TINY, '--job_log_dri=/x') == f'{precheck.JOB_REQUIRED}; --job_log_dri was given: a misspelling?'
  assert _error('--exps=x', JOB) == f'{precheck.EXP_REQUIRED}; --exps was given: a misspelling?'


@pytest.mark.parametrize('args', [['--fdl_config=x.y'], ['--fdl_config_file', 'x.py'], ['--fdl=config:x()'],
                                  ['--autockpt_print_wiring'], ['--flagfile=/nonexistent'], ['--helpfull']])
def test_paxml_decides_without_exp_for_fiddle_configs_print_wiring_flagfiles_and_helpfull(args):
  precheck.run(['main', *args, *([] if args[0] in ('--autockpt_print_wiring', '--helpfull') else [JOB])])


@pytest.mark.parametrize('exp,expected', [
    ('LmCloudSpmdTinyAutockpt', f'--exp=LmCloudSpmdTinyAutockpt names a class without its module: use {TINY}'),
    ('LmCloudSpmdTinyAutockt', f'did you mean {TINY}?'),
    ('experiments.lm_cloud_autockp.LmCloudSpmdTinyAutockpt', f'no module experiments.lm_cloud_autockp on the '
     f'Python path; did you mean {TINY}?'),
    ('nope.Missing', f'--exp=nope.Missing: there is no module nope on the Python path; use '
     f'--exp=<module>.<Class>, e.g. {TINY}'),
    ('.Missing', 'is not a module and class name'),
])
def test_an_exp_whose_module_does_not_exist_is_said_before_paxml(exp, expected):
  assert expected in _error(f'--exp={exp}', JOB)


def test_modules_are_looked_up_without_running_them():
  before = set(sys.modules)
  assert experiment_names.module_found('experiments.lm_cloud_autockpt')
  assert experiment_names.module_found('tests.bad_experiments')  # a namespace package
  assert experiment_names.module_found('experiments.nope') is False
  assert experiment_names.module_found('pax_autockpt.nope') is False
  assert not {'experiments.lm_cloud_autockpt', 'tests.bad_experiments'} & (set(sys.modules) - before)


def test_registered_names_paxml_did_not_find_get_the_closest():
  registered = experiment_names.registered_in_sources()
  closest = lambda exp: experiment_names.closest(exp, registered)
  assert closest('experiments.lm_cloud_autockpt.LmCloudSpmdTinyAutockt').startswith(f'did you mean {TINY} or ')
  assert closest('experiments.lm_cloud_autockpt').startswith('it is a module: add the class, e.g. --exp=')
  assert closest('experiments.lm_cloud_autockpt.Nope').startswith(
      'experiments.lm_cloud_autockpt registers LmCloudSpmd2BAutockpt, ')
  assert closest('nothing.Like') == f'use --exp=<module>.<Class>, e.g. {TINY}'


def test_a_module_that_fails_on_its_own_import_is_not_called_missing():
  error = ValueError('Could not find experiment `experiments.lm_cloud_autockpt.X` because ...')
  error.__cause__ = ModuleNotFoundError("No module named 'seqio'", name='seqio')
  assert experiment_names.not_registered('experiments.lm_cloud_autockpt.X', error, []) == (
      "--exp=experiments.lm_cloud_autockpt.X: importing its module failed: No module named 'seqio'")


def test_help_lists_every_setting_flag_with_its_default_and_meaning():
  with pytest.raises(precheck.PrintHelp) as e:
    precheck.run(['main', '--autockpt_zzz', '--help'])
  text = str(e.value)
  for name, field in settings_lib.FIELDS.items():
    flag = settings_lib.flag_name(name)
    assert (flag or settings_lib.attribute(name)) in text
    assert not flag or ' '.join(field.metadata['doc'].split()) in ' '.join(text.split())
  assert '--autockpt_exit_code=INT  (default 143)' in text
  assert '--autockpt_keep_latest=INT  (default not set)' in text


def test_help_exits_0_without_importing_paxml():
  out = subprocess.run([sys.executable, '-X', 'importtime', '-m', 'pax_autockpt.main', '--help'], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.startswith('Drop-in for paxml/main.py')
  assert '--autockpt_keep_latest=INT  (default not set)' in out.stdout
  assert all(settings_lib.flag_name(f) in out.stdout for f in settings_lib.FIELDS if settings_lib.flag_name(f))
  imported = [line.rsplit('|', 1)[1].strip() for line in out.stderr.splitlines() if line.startswith('import time:')]
  assert imported and not [m for m in imported if m.split('.')[0] in ('paxml', 'jax', 'tensorflow')]


def test_a_local_dir_that_is_a_file_or_on_object_storage_is_one_line_before_paxml(tmp_path):
  (tmp_path / 'local-0').write_text('not a directory')
  assert _error(TINY, JOB, f'--autockpt_local_dir={tmp_path}/local-{{host}}') == (
      f"--autockpt_local_dir={tmp_path}/local-{{host}} is not writable ({tmp_path}/local-0 is a file): choose a "
      "directory on this host's own disk.")
  assert 'use a path on the host\'s own disk' in _error(TINY, JOB, '--autockpt_local_dir=gs://b/local')
  precheck.run(['main', TINY, JOB, f'--autockpt_local_dir={tmp_path}/new-{{host}}'])  # fine: made at start


@pytest.mark.parametrize('local', ['/proc/autockpt-local-{host}', '/proc/x'])
def test_a_local_dir_that_cannot_be_made_is_one_line_before_paxml(local):
  """Made at the first local save, after paxml started and wrote the job directory: a 47-line traceback."""
  assert _error(TINY, JOB, f'--autockpt_local_dir={local}').startswith(
      f'--autockpt_local_dir={local} is not writable (')
  assert _error(TINY, JOB, f'--autockpt_local_dir={local}').endswith(
      "): choose a directory on this host's own disk.")


def test_several_hosts_on_one_machine_need_host_in_the_local_dir(tmp_path):
  """A coordinator on loopback means every host runs on this machine (`pax-autockpt launch`): without
  `{host}` they would all write one directory."""
  wiring = ['--host_idx=1', '--num_hosts=2', '--server_addr=127.0.0.1:8476']
  assert _error(TINY, JOB, *wiring, f'--autockpt_local_dir={tmp_path}/local') == (
      f'--autockpt_local_dir={tmp_path}/local has no {{host}} and the 2 hosts share this machine '
      f'(--server_addr=127.0.0.1:8476): each would write the same directory; put {{host}} in it, e.g. '
      f'{tmp_path}/local-{{host}}')
  precheck.run(['main', TINY, JOB, *wiring, f'--autockpt_local_dir={tmp_path}/local-{{host}}'])
  precheck.run(['main', TINY, JOB, '--host_idx=1', '--num_hosts=2', '--server_addr=10.0.0.2:8476',
                f'--autockpt_local_dir={tmp_path}/local'])  # hosts on other machines: each its own disk
  assert sorted(os.listdir(tmp_path)) == ['local', 'local-1']  # made and held by this process from now on
