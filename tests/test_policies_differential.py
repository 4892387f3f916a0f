"""Differential tests: our save and preservation decisions, through the product's entry points (`preserve()`,
`wants_save`), against orbax-latest (orbax-checkpoint 0.12.8) on generated policies and histories.

The fast profile replays tests/data/orbax_differential_cases.json (cases with orbax's recorded answers; no second
interpreter). The live profile (`make soak`) generates new cases with Hypothesis and asks orbax-latest in
.venv-orbax (tests/orbax_latest/make_venv.sh) for AUTOCKPT_DIFFERENTIAL_MINUTES (default 5); a disagreement's case
is appended to the recorded file, so that it stays in the fast profile. tests/orbax_latest/differential.py has the
generator, the product's side and the documented differences.
"""

import collections
import json
import os
import time

from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
import pytest

from tests.orbax_latest import differential as D

RECORDED = D.load_recorded()


def replay(entry):
  def ask(query):
    return entry['answers'][D.key(query)]
  return D.expected(entry['case'], ask)


def test_the_recorded_cases_cover_every_policy_and_every_documented_difference():
  kinds, triggers = collections.Counter(), collections.Counter()
  for entry in RECORDED:
    case = entry['case']
    specs = [case['policy'], *case['policy'].get('policies', ())]
    kinds.update(s['type'] for s in specs)
    rows = case['rows']
    triggers['unknown time'] += any(us is None for _, us, _, _ in rows)
    triggers['time from storage'] += any(src == 'storage' for *_, src in rows)
    triggers['non-finite metric'] += any(m and any(v in ('nan', 'inf', '-inf') for v in m.values())
                                         for _, _, m, _ in rows)
    triggers['save in flight'] += case.get('saving', False)
    triggers['clock jumped back'] += bool(rows and rows[-1][1] is not None and case['now_us'] < rows[-1][1])
  assert set(kinds) == {'FixedIntervalPolicy', 'SpecificStepsPolicy', 'ContinuousCheckpointingPolicy',
                        'PreemptionCheckpointingPolicy', 'InitialSavePolicy', 'AnySavePolicy', 'PreserveAll',
                        'LatestN', 'EveryNSeconds', 'EveryNSteps', 'EveryNStepsClosest', 'CustomSteps', 'BestN',
                        'LatestDuration', 'AnyPreservationPolicy'}, kinds
  assert all(triggers[t] >= 5 for t in ('unknown time', 'time from storage', 'non-finite metric', 'save in flight',
                                        'clock jumped back')), triggers


@pytest.mark.parametrize('index', range(len(RECORDED)))
def test_the_product_decides_as_orbax_latest_on_recorded_cases(index):
  entry = RECORDED[index]
  assert D.product(entry['case']) == replay(entry), entry['case']


def test_a_documented_difference_is_what_the_comparison_allows():
  """The transforms are the documented differences, no more: an answer that only orbax's raw view would
  give (EveryNSeconds dating an unknown time 1970) is a disagreement."""
  case = {'kind': 'preserve', 'policy': {'type': 'EveryNSeconds', 'interval_secs': 60}, 'now_us': 10**9,
          'rows': [[1, 0, None, 'event'], [2, None, None, 'unknown'], [3, None, None, 'unknown'],
                   [4, 10**8, None, 'event']]}
  raw = {'unknown kept': [True, True, True, True], 'dated 1970': [True, False, False, True]}
  assert D.product(case) == [] == D.expected(case, lambda q: [True] * len(q['rows']))
  assert [r[0] for r, keep in zip(case['rows'], raw['dated 1970']) if not keep] == [2, 3] != D.product(case)


MINUTES = float(os.environ.get('AUTOCKPT_DIFFERENTIAL_MINUTES', '5'))


@pytest.mark.soak
@pytest.mark.timeout(MINUTES * 60 + 600)  # the run's own length, past the suite's per-test timeout
def test_live_against_orbax_latest():
  """Generated cases against orbax-latest itself, for MINUTES; a disagreement's (shrunk) case is recorded."""
  if not os.path.exists(D.ORBAX_PYTHON):
    pytest.fail(f'{D.ORBAX_PYTHON} missing: run tests/orbax_latest/make_venv.sh (make soak does)')
  oracle, tried, failing = D.Oracle(), [0], []

  @settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
  @given(D.cases())
  def agree(case):
    tried[0] += 1
    entry = D.with_answers(case, oracle)
    ours, theirs = D.product(case), replay(entry)
    if ours != theirs:
      failing[:] = [entry]
    assert ours == theirs, (case, ours, theirs)

  end = time.time() + MINUTES * 60
  try:
    while time.time() < end:
      agree()
  except AssertionError:
    D.record(failing)  # the last failing case Hypothesis ran: its shrunk example
    raise
  finally:
    oracle.close()
    print(json.dumps({'histories_tried': tried[0], 'minutes': MINUTES, 'disagreements': len(failing)}))
