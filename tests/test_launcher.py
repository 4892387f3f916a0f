"""`pax-autockpt launch`'s restart rule and its standby processes' environment check (pure; the restart itself,
from standby processes, runs end to end in tests/test_e2e_multihost.py)."""

import json

import pytest

from pax_autockpt import standby
from pax_autockpt.tools import launcher


@pytest.mark.parametrize('codes, first_failed, stopped_by, restarts, expected', [
    ([137, 134], 0, None, 0, 'host 0 ended with exit 137'),  # a crash: the host that failed first is named
    ([134, 137], 1, None, 0, 'host 1 ended with exit 137'),
    ([1, 1], None, None, 0, 'host 0 ended with exit 1'),  # a failure exit a rerun may cure
    ([143, 143], None, None, 0, 'host 0 ended with exit 143'),  # a SIGTERM from elsewhere: a preempted VM
    ([137, 134], 0, None, 1, None),  # restarts used up
    ([143, 143], None, 'SIGTERM', 0, None),  # the launcher's own stop is honoured, not undone
    ([130, 130], None, 'SIGINT', 0, None),
    ([0, 0], None, None, 0, None),  # finished
    ([2, 2], 1, None, 0, None),  # bad input: a rerun fails the same way
])
def test_a_failed_job_restarts_until_the_budget_but_never_after_a_stop_success_or_bad_input(
    codes, first_failed, stopped_by, restarts, expected):
  assert launcher.restart_reason(codes, first_failed, stopped_by, restarts, max_restarts=1) == expected


def test_max_restarts_below_zero_is_bad_input():
  cfg = launcher.LaunchConfig(num_hosts=2, max_restarts=-1, args=('--exp=x', '--job_log_dir=/tmp/j'))
  with pytest.raises(launcher.LaunchError, match=r'^--max_restarts=-1: use 0 \(no restart\) or more$'):
    launcher.validate(cfg)


def test_a_standby_takes_only_an_environment_its_imports_saw_but_the_runtime_variables_may_differ():
  imported_with = {'PATH': '/usr/bin', 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': '--a', 'AUTOCKPT_X': '1'}
  runtime_only = {**imported_with, 'XLA_FLAGS': '--b', 'JAX_COORDINATOR_BIND_ADDRESS': '127.0.0.1:5',
                  'AUTOCKPT_Y': '2'}
  assert standby.stale(imported_with, runtime_only) == []
  assert standby.stale(imported_with, {**runtime_only, 'JAX_PLATFORMS': 'tpu', 'TF_CPP_MIN_LOG_LEVEL': '3'}) == [
      'JAX_PLATFORMS', 'TF_CPP_MIN_LOG_LEVEL']
  assert standby.stale(imported_with, {k: v for k, v in imported_with.items() if k != 'PATH'}) == ['PATH']


def test_the_request_is_one_line_of_the_hosts_arguments_and_environment():
  line = standby.request(['--exp=x', '--host_idx=1'], {'A': 'b'})
  assert line.endswith(b'\n') and line.count(b'\n') == 1
  assert json.loads(line) == {'argv': ['--exp=x', '--host_idx=1'], 'env': {'A': 'b'}}
