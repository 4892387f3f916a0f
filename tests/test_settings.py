"""Settings: class attributes, flag precedence, and one-line errors naming the attribute or flag."""

import datetime
import os

from absl import flags
import fiddle as fdl
import pytest

from pax_autockpt import policies
from pax_autockpt import settings as settings_lib
from pax_autockpt.experiment import AutockptMixin


class Exp(AutockptMixin):
  pass


def test_defaults():
  assert settings_lib.resolve(Exp()) == settings_lib.Settings(exit_code=143)


def test_subclass_attributes_are_used():
  class Mine(Exp):
    AUTOCKPT_EXIT_CODE = 42
    AUTOCKPT_CONTINUOUS = True
    AUTOCKPT_MIN_INTERVAL_SECS = 5
    AUTOCKPT_KEEP_LATEST = 3
  s = settings_lib.resolve(Mine())
  assert (s.exit_code, s.continuous, s.min_interval_secs, s.keep_latest) == (42, True, 5, 3)


@pytest.mark.parametrize('attr,value,needle', [
    ('AUTOCKPT_EXIT_CODE', 0, '3..255'),
    ('AUTOCKPT_EXIT_CODE', 256, '3..255'),
    ('AUTOCKPT_EXIT_CODE', 2, '3..255'),
    ('AUTOCKPT_EXIT_CODE', '143', '3..255'),
    ('AUTOCKPT_CONTINUOUS', 'yes', 'True or False'),
    ('AUTOCKPT_MIN_INTERVAL_SECS', -1, '>= 0'),
    ('AUTOCKPT_KEEP_LATEST', 0, 'N >= 1'),
    ('AUTOCKPT_KEEP_EVERY_SECS', 0, '> 0'),
    ('AUTOCKPT_MTBF_HOURS', 0, 'hours > 0'),
    ('AUTOCKPT_MTBF_HOURS', -2.5, 'hours > 0'),
    ('AUTOCKPT_KEEP_EVERY_STEPS', 0, 'N >= 1'),
    ('AUTOCKPT_KEEP_BEST', 0, 'N >= 1'),
    ('AUTOCKPT_BEST_METRIC', '', 'name of a metric'),
    ('AUTOCKPT_BEST_MODE', 'lowest', "'min'"),
])
def test_invalid_attribute_is_named(attr, value, needle):
  bad = type('Bad', (Exp,), {attr: value})
  with pytest.raises(settings_lib.ConfigError) as e:
    settings_lib.resolve(bad())
  message = str(e.value)
  assert f'Bad.{attr}={value!r}' in message and needle in message and '\n' not in message


@pytest.fixture
def autockpt_flags():
  """The --autockpt_* flags as pax_autockpt.main defines them, parsed from a command line."""
  fv = flags.FlagValues()
  settings_lib.define_flags(fv)
  saved = flags.FLAGS
  flags.FLAGS = fv
  yield fv
  flags.FLAGS = saved


def test_flag_given_on_command_line_wins(autockpt_flags):
  autockpt_flags(['prog', '--autockpt_exit_code=99'])
  class Mine(Exp):
    AUTOCKPT_EXIT_CODE = 42
    AUTOCKPT_KEEP_LATEST = 4
  s = settings_lib.resolve(Mine())
  assert s.exit_code == 99 and s.keep_latest == 4  # not given: the attribute stays


@pytest.mark.parametrize('given, named', [('--autockpt_keep_latest=0', '--autockpt_keep_latest=0'),
                                          ('--autockpt_grace_secs=-30', '--autockpt_grace_secs=-30.0'),
                                          ('--autockpt_grace_secs=inf', '--autockpt_grace_secs=inf')])
def test_bad_flag_is_named_as_flag(autockpt_flags, given, named):
  autockpt_flags(['prog', given])
  with pytest.raises(settings_lib.ConfigError, match=f'^{named} is invalid: use '):
    settings_lib.resolve(Exp())


INF, NAN = float('inf'), float('nan')
# Every numeric setting, with the values it must reject (what a flag can say: absl parses 'inf' and 'nan' too).
BAD_NUMBERS = {
    'exit_code': [0, 1, 2, 256, -1, 1.5],
    'min_interval_secs': [-1, -0.5, INF, NAN],
    'mtbf_hours': [0, -2.5, NAN],
    'keep_latest': [0, -1, 1.5],
    'keep_every_secs': [0, -1, NAN],
    'keep_every_steps': [0, -1, 1.5],
    'keep_best': [0, -1, 1.5],
    'restore_retry_secs': [-1, -0.5, INF, NAN],  # inf: a retry budget whose backoff never ends
    'grace_secs': [0, -1, -300.0, INF, NAN, 1e10, 7 * 24 * 3600 + 1],  # inf, 1e10: a wait no timeout can hold
    'background_nice': [-1, 20, 1.5],
    'local_min_interval_secs': [-1, NAN],
    'local_keep': [0, -1, 1.5],
    'local_peer_port': [-1, 65536, 1.5],
    'local_buddy_mb_per_sec': [0, -1, NAN],
}


def test_every_numeric_flag_has_its_bad_values_listed():
  """A new numeric setting comes with the values its rule must reject."""
  numeric = {n for n in settings_lib.FIELDS if settings_lib.flag_name(n) and settings_lib.flag_type(n) in (int, float)}
  assert numeric == set(BAD_NUMBERS)


@pytest.mark.parametrize('name, bad', [(n, v) for n, values in BAD_NUMBERS.items() for v in values])
def test_a_flag_fix_suggests_only_values_a_flag_accepts(name, bad):
  """Each out-of-range value gets a fix, as a flag and as an attribute; absl cannot set an integer or float flag to
  None: leaving the flag out is the way to "unset"."""
  flag = f'--{settings_lib.flag_name(name)}'
  fix = settings_lib.fix_for(name, bad, flag)
  assert fix and 'None' not in fix and '{unset}' not in fix, (name, bad, fix)
  assert settings_lib.fix_for(name, bad, f'Bad.{settings_lib.attribute(name)}'), (name, bad)
  with pytest.raises(settings_lib.ConfigError) as e:
    settings_lib.validate_values(settings_lib.Settings(**{name: bad}), {name: flag})
  assert str(e.value).startswith(f'{flag}={bad!r} is invalid: use ') and '\n' not in str(e.value)


def test_an_attribute_fix_may_still_suggest_none():
  assert settings_lib.fix_for('keep_latest', -1, 'Bad.AUTOCKPT_KEEP_LATEST') == (
      'use an integer N >= 1, or None to keep what Pax keeps')
  assert settings_lib.fix_for('keep_latest', -1, '--autockpt_keep_latest') == (
      'use an integer N >= 1, or leave the flag out to keep what Pax keeps')


def test_executor_exits_2_with_one_line_on_bad_attribute(capsys):
  bad = type('Bad', (Exp,), {'AUTOCKPT_EXIT_CODE': 1})
  with pytest.raises(SystemExit) as e:
    bad().executor()
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and 'Bad.AUTOCKPT_EXIT_CODE=1' in err[0]


def test_policy_objects_and_fiddle_configs_are_built():
  class Mine(Exp):
    AUTOCKPT_SAVE_POLICY = policies.ContinuousCheckpointingPolicy(minimum_interval_secs=30)
    AUTOCKPT_PRESERVATION_POLICY = fdl.Config(policies.LatestN, n=3)
  s = settings_lib.resolve(Mine())
  assert settings_lib.save_policy(s) == policies.ContinuousCheckpointingPolicy(minimum_interval_secs=30)
  assert settings_lib.preservation_policy(s) == policies.LatestN(3)


def test_simple_settings_become_policies():
  class Mine(Exp):
    AUTOCKPT_CONTINUOUS = True
    AUTOCKPT_MIN_INTERVAL_SECS = 5
    AUTOCKPT_KEEP_LATEST = 2
    AUTOCKPT_KEEP_EVERY_SECS = 60
  s = settings_lib.resolve(Mine())
  assert settings_lib.save_policy(s) == policies.AnySavePolicy(
      (policies.InitialSavePolicy(), policies.ContinuousCheckpointingPolicy(minimum_interval_secs=5)))
  assert settings_lib.preservation_policy(s) == policies.AnyPreservationPolicy(
      (policies.LatestN(2), policies.EveryNSeconds(60)))
  assert settings_lib.save_policy(settings_lib.resolve(Exp())) is None  # Pax's own interval


@pytest.mark.parametrize('attrs,needle', [
    ({'AUTOCKPT_SAVE_POLICY': 'continuous', 'AUTOCKPT_CONTINUOUS': False}, 'should_save'),
    ({'AUTOCKPT_PRESERVATION_POLICY': 42}, 'should_preserve'),
    ({'AUTOCKPT_MIN_INTERVAL_SECS': 10}, 'only applies to continuous'),
])
def test_bad_policy_settings(attrs, needle):
  bad = type('Bad', (Exp,), attrs)
  with pytest.raises(settings_lib.ConfigError, match=needle):
    settings_lib.resolve(bad())


def test_policy_object_and_simple_attribute_conflict():
  bad = type('Bad', (Exp,), {'AUTOCKPT_PRESERVATION_POLICY': policies.LatestN(3),
                             'AUTOCKPT_KEEP_LATEST': 5})
  with pytest.raises(settings_lib.ConfigError,
                     match=r'Bad.AUTOCKPT_PRESERVATION_POLICY and Bad.AUTOCKPT_KEEP_LATEST are both set'):
    settings_lib.resolve(bad())


def test_flag_replaces_policy_object(autockpt_flags):
  autockpt_flags(['prog', '--autockpt_keep_latest=7'])

  class Mine(Exp):
    AUTOCKPT_PRESERVATION_POLICY = policies.EveryNSeconds(60)
  s = settings_lib.resolve(Mine())
  assert settings_lib.preservation_policy(s) == policies.LatestN(7)


def test_each_setting_is_one_declaration_driving_attribute_flag_and_settings_page():
  """A new setting is one field of Settings: the mixin attribute, the flag and the docs/settings.md row follow."""
  fv = flags.FlagValues()
  settings_lib.define_flags(fv)
  for name, field in settings_lib.FIELDS.items():
    assert getattr(AutockptMixin, settings_lib.attribute(name)) == field.default
    flag = settings_lib.flag_name(name)
    if flag:
      assert fv[flag].default is None and field.metadata['doc'] in fv[flag].help
    assert field.metadata['rule'](field.default) is None, f'the default of {name} breaks its own rule'
  with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), 'docs', 'settings.md')) as f:
    page = f.read()
  assert settings_lib.markdown_table() in page, 'docs/settings.md settings table: paste settings.markdown_table()'


def test_default_exit_code_is_the_one_constant():
  assert settings_lib.Settings().exit_code == settings_lib.DEFAULT_EXIT_CODE == 143


def test_new_simple_settings_become_orbax_latest_policies():
  class Mine(Exp):
    AUTOCKPT_MTBF_HOURS = 0.5
    AUTOCKPT_KEEP_EVERY_STEPS = 1000
    AUTOCKPT_KEEP_BEST = 3
  s = settings_lib.resolve(Mine())
  assert settings_lib.save_policy(s) == policies.YoungDalyPolicy(mtbf_hours=0.5)
  assert settings_lib.continuous(s)
  assert settings_lib.preservation_policy(s) == policies.AnyPreservationPolicy(
      (policies.EveryNSteps(1000), policies.BestN(metric='train/loss', reverse=True, n=3)))

  class Highest(Exp):
    AUTOCKPT_KEEP_BEST = 2
    AUTOCKPT_BEST_METRIC = 'eval_test_test/metrics/fraction_of_correct_next_step_preds'
    AUTOCKPT_BEST_MODE = 'max'
  assert settings_lib.preservation_policy(settings_lib.resolve(Highest())) == policies.BestN(
      metric='eval_test_test/metrics/fraction_of_correct_next_step_preds', reverse=False, n=2)


def test_every_orbax_latest_policy_is_settable_as_object_and_fiddle_config():
  class Mine(Exp):
    AUTOCKPT_SAVE_POLICY = fdl.Config(policies.AnySavePolicy, policies=[
        fdl.Config(policies.FixedIntervalPolicy, 1000), policies.PreemptionCheckpointingPolicy()])
    AUTOCKPT_PRESERVATION_POLICY = fdl.Config(policies.AnyPreservationPolicy, policies=[
        fdl.Config(policies.BestN, get_metric_fn=len, n=2), policies.LatestN(None),
        fdl.Config(policies.EveryNSteps, 100, max_to_keep=3), policies.EveryNStepsClosest(500),
        fdl.Config(policies.LatestDuration, datetime.timedelta(hours=24))])
  s = settings_lib.resolve(Mine())
  assert settings_lib.save_policy(s).policies[0] == policies.FixedIntervalPolicy(1000)
  assert settings_lib.preservation_policy(s).policies[2] == policies.EveryNSteps(100, max_to_keep=3)


@pytest.mark.parametrize('attrs,needle', [
    ({'AUTOCKPT_PRESERVATION_POLICY': policies.EveryNSteps(0)},
     'Bad.AUTOCKPT_PRESERVATION_POLICY=EveryNSteps(interval_steps=0, exact_interval=True, max_to_keep=None) '
     'is invalid: EveryNSteps.interval_steps=0: use an integer >= 1'),
    ({'AUTOCKPT_PRESERVATION_POLICY': fdl.Config(policies.EveryNSteps, 10, max_to_keep=0)},
     'EveryNSteps.max_to_keep=0: use an integer >= 1, or None'),
    ({'AUTOCKPT_PRESERVATION_POLICY': policies.LatestDuration(60)}, 'datetime.timedelta > 0'),
    ({'AUTOCKPT_PRESERVATION_POLICY': policies.BestN(n=3)}, 'give exactly one'),
    ({'AUTOCKPT_PRESERVATION_POLICY': policies.AnyPreservationPolicy([policies.LatestN(-1)])},
     'AnyPreservationPolicy.policies[0]: LatestN.n=-1'),
    ({'AUTOCKPT_SAVE_POLICY': policies.FixedIntervalPolicy(0)}, 'FixedIntervalPolicy.interval=0'),
    ({'AUTOCKPT_SAVE_POLICY': fdl.Config(policies.ContinuousCheckpointingPolicy, minimum_interval_secs=-3)},
     'ContinuousCheckpointingPolicy.minimum_interval_secs=-3'),
    ({'AUTOCKPT_SAVE_POLICY': policies.YoungDalyPolicy(mtbf_hours=0)}, 'mtbf_hours=0'),
    ({'AUTOCKPT_MTBF_HOURS': 1, 'AUTOCKPT_CONTINUOUS': True, 'AUTOCKPT_MIN_INTERVAL_SECS': 5},
     'Bad.AUTOCKPT_MIN_INTERVAL_SECS and Bad.AUTOCKPT_MTBF_HOURS are both set'),
    ({'AUTOCKPT_BEST_METRIC': 'eval_test_x/metrics/loss'}, 'only applies to keep_best'),
    ({'AUTOCKPT_MTBF_HOURS': 1, 'AUTOCKPT_SAVE_POLICY': policies.InitialSavePolicy()},
     'AUTOCKPT_SAVE_POLICY and Bad.AUTOCKPT_MTBF_HOURS are both set'),
    ({'AUTOCKPT_KEEP_BEST': 2, 'AUTOCKPT_PRESERVATION_POLICY': policies.LatestN(2)}, 'both set'),
])
def test_invalid_policy_parameters_are_one_line_naming_the_attribute(attrs, needle):
  bad = type('Bad', (Exp,), attrs)
  with pytest.raises(settings_lib.ConfigError) as e:
    settings_lib.resolve(bad())
  assert needle in str(e.value) and '\n' not in str(e.value)


def test_a_multi_line_repr_is_shown_on_one_line():
  class Odd:
    def __repr__(self):
      return 'Odd(\n  a=1,\n)'

  bad = type('Bad', (Exp,), {'AUTOCKPT_SAVE_POLICY': Odd()})
  with pytest.raises(settings_lib.ConfigError, match=r'^Bad.AUTOCKPT_SAVE_POLICY=Odd\( a=1, \) is invalid'):
    settings_lib.resolve(bad())


def test_mtbf_and_keep_best_flags_replace_policy_objects(autockpt_flags):
  autockpt_flags(['prog', '--autockpt_mtbf_hours=2', '--autockpt_keep_best=4', '--autockpt_best_mode=max',
                  '--autockpt_best_metric=train/fraction_of_correct_next_step_preds'])

  class Mine(Exp):
    AUTOCKPT_SAVE_POLICY = policies.FixedIntervalPolicy(100)
    AUTOCKPT_PRESERVATION_POLICY = policies.LatestN(3)
  s = settings_lib.resolve(Mine())
  assert settings_lib.save_policy(s) == policies.YoungDalyPolicy(mtbf_hours=2.0)
  assert settings_lib.preservation_policy(s) == policies.BestN(
      metric='train/fraction_of_correct_next_step_preds', reverse=False, n=4)
