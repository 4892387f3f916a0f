"""Tests of `pax_autockpt.tools.report` on synthetic job directories (no training, no JAX)."""

import io
import json
import math
import os

import pytest

from pax_autockpt.tools import report
from pax_autockpt.tools.report import json_report

T0 = 1_700_000_000.0
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


class Job:
  """Builds JOB_LOG_DIR/autockpt/events.host<IDX>.jsonl and JOB_LOG_DIR/checkpoints/."""

  def __init__(self, root):
    self.root = root
    self.lines: dict[int, list[str]] = {}

  def ev(self, host, t, event, **fields):
    self.lines.setdefault(host, []).append(
        json.dumps({'t': T0 + t, 'host': host, 'event': event, **fields}))

  def raw(self, host, text):
    self.lines.setdefault(host, []).append(text)

  def start(self, host, t, restored=None, num_hosts=1):
    self.ev(host, t, 'start', num_hosts=num_hosts, pid=1000 + host, restored_step=restored)

  def save(self, host, t, step, reason='interval', blocking=0.5, duration=1.0, commit=True):
    self.ev(host, t, 'save_started', step=step, reason=reason, blocking_s=blocking)
    if commit:
      self.ev(host, t + duration, 'save_committed', step=step, duration_s=duration)

  def write(self, checkpoints=(), tmp=(), torn_tail=None):
    log = self.root / 'autockpt'
    log.mkdir(parents=True, exist_ok=True)
    for host, lines in self.lines.items():
      text = ''.join(line + '\n' for line in lines)
      if torn_tail is not None:
        text += torn_tail  # a killed writer: no newline
      (log / f'events.host{host}.jsonl').write_text(text)
    ckpt = self.root / 'checkpoints'
    ckpt.mkdir(exist_ok=True)
    for step in checkpoints:
      (ckpt / f'checkpoint_{step:08d}').mkdir()
    for step in tmp:
      (ckpt / f'checkpoint_{step:08d}.orbax-checkpoint-tmp-1700000000').mkdir()
    return str(self.root)


def single_run(tmp_path, **write_kwargs):
  """(a) One host, one run: interval saves every 100 steps, start intervals 10, 10, 10, 12, 20 s."""
  job = Job(tmp_path)
  job.start(0, 0.0)
  for step, t in zip(range(100, 600, 100), (10.0, 20.0, 30.0, 40.0, 52.0)):
    job.save(0, t, step)
  job.save(0, 72.0, 600, reason='final')
  job.ev(0, 74.0, 'exit', code=0, step=600)
  return job.write(**write_kwargs)


def preempted_then_restarted(tmp_path, hosts=(0,)):
  """(b) Preemption at 1234, exit 143 0.5 s later; a restart restores 1234 and finishes at 1500."""
  job = Job(tmp_path)
  for h in hosts:
    off = 0.01 * h  # other hosts log slightly later
    job.start(h, 0.0 + off, num_hosts=len(hosts))
    for i, step in enumerate(range(100, 1300, 100)):
      job.save(h, 10.0 * (i + 1) + off, step)
    job.ev(h, 123.4 + off, 'preemption', step=1234, signal='SIGTERM')
    job.save(h, 123.4 + off, 1234, reason='preemption', blocking=0.3, duration=0.4)
    job.ev(h, 123.9 + off, 'exit', code=143, step=1234)
    # Restart: 16.1 s of downtime; 2 s of startup, then 66 steps at 0.1 s/step before the first save.
    job.start(h, 140.0 + off, restored=1234, num_hosts=len(hosts))
    job.save(h, 148.6 + off, 1300)
    job.save(h, 158.6 + off, 1400)
    job.ev(h, 158.8 + off, 'deleted', step=100, policy='keep_latest')
    job.save(h, 168.6 + off, 1500, reason='final')
    job.ev(h, 170.0 + off, 'exit', code=0, step=1500)
  return job.write(checkpoints=(1300, 1400, 1500))


def test_single_run_interval_percentiles(tmp_path):
  r = report.load(single_run(tmp_path, checkpoints=(500, 600), tmp=(700,)))
  assert r.hosts == [0]
  assert r.starts_per_host == {0: 1}
  assert r.restarts == 0
  assert r.restored_steps == [None]
  assert r.saves_started == 6 and r.saves_committed == 6
  assert r.saves_by_reason == {'final': 1, 'interval': 5}
  assert r.steps_saved == [100, 200, 300, 400, 500, 600]
  assert r.interval_steps.p50 == 100 and r.interval_steps.p90 == 100
  # Intervals 10, 10, 10, 12, 20 s: P50 = 10; P90 = 12 + 0.6 * (20 - 12) (linear interpolation).
  assert r.interval_s.p50 == pytest.approx(10.0)
  assert r.interval_s.p90 == pytest.approx(16.8)
  assert r.interval_s.max == pytest.approx(20.0)
  assert r.blocking_s['all'].mean == pytest.approx(0.5)
  assert r.duration_s['interval'].p90 == pytest.approx(1.0)
  assert r.exit_codes == {0: 1}
  assert r.preemptions == []
  assert r.steps_lost_total == 0 and not r.steps_lost_lower_bound
  assert r.checkpoints_complete == [500, 600]
  assert r.checkpoints_incomplete == 1
  assert r.newest_checkpoint == 600
  assert r.unparsable_lines == 0
  text = report.format_text(r)
  assert 'saves: 6 (final 1, interval 5), committed 6' in text
  assert 'interval P50/P90: 100/100 steps, 10.0/16.8 s' in text
  assert 'checkpoints: 2 complete, newest 600, 1 incomplete' in text


def test_preempted_run_and_restart(tmp_path):
  r = report.load(preempted_then_restarted(tmp_path))
  assert r.starts_per_host == {0: 2}
  assert r.restarts == 1
  assert r.restored_steps == [None, 1234]
  assert len(r.preemptions) == 1
  p = r.preemptions[0]
  assert (p.step, p.signal, p.exit_codes) == (1234, 'SIGTERM', [143])
  assert p.exit_after_s == pytest.approx(0.5)
  assert r.exit_codes == {0: 1, 143: 1}
  assert r.saves_by_reason == {'final': 1, 'interval': 14, 'preemption': 1}
  (restart,) = r.restart_details
  assert (restart.reached_step, restart.restored_step, restart.steps_lost) == (1234, 1234, 0)
  assert not restart.lower_bound
  assert r.steps_lost_total == 0 and r.steps_lost_max == 0
  # R = downtime (140 - 123.9) + startup (148.6 - 140 - 66 steps * 0.1 s/step).
  assert r.seconds_per_step == pytest.approx(0.1)
  assert restart.downtime_s == pytest.approx(16.1)
  assert restart.startup_s == pytest.approx(2.0)
  assert r.restart_cost_s == pytest.approx(18.1)
  # The intervals are those within a run: 1234 -> 1300 spans the restart's downtime (25.2 s), counted in R.
  assert r.interval_s.max == pytest.approx(10.0) and r.interval_steps.n == 14
  assert r.deletions == 1 and r.deletions_by_policy == {'keep_latest': 1}
  # delta excludes the preemption save.
  assert r.save_cost_s == pytest.approx(0.5)
  text = report.format_text(r)
  assert 'preemptions: 1 at step 1234 (SIGTERM -> exit 0.50 s)' in text
  assert 'steps lost: 0 total, max 0' in text
  assert 'restarts: 1 (restored: step 1234 from the job directory)' in text
  assert 'hosts: 1, started 2 times' in text  # not 'hosts: 1, 1 declared (starts per host 0:2)'
  assert 'save blocking ms mean/p50/p90/max: ' in text and 'save duration s mean/p50/p90/max: ' in text
  assert ("restart cost R: 18.1 s per restart (the mean over 1 restart: from the last event of a run to the next "
          "run's first save, less the time it spent training before that save)") in text
  assert "(between checkpoints of one run; a restart's downtime is in R)" in text


def test_blocking_under_a_second_reads_in_ms_and_hosts_in_words(tmp_path):
  from pax_autockpt.tools.report import model  # pylint: disable=g-import-not-at-top
  from pax_autockpt.tools.report import text  # pylint: disable=g-import-not-at-top
  stats = {'all': model.Stats(n=3, mean=0.0034, p50=0.0031, p90=0.005, max=0.0092)}
  assert text._stats_line('save blocking', stats) == (  # pylint: disable=protected-access
      'save blocking ms mean/p50/p90/max: all 3.4/3.1/5.0/9.2')


def test_sigkilled_run_is_a_lower_bound(tmp_path):
  job = Job(tmp_path)
  job.start(0, 0.0)
  job.save(0, 10.0, 100)
  job.save(0, 20.0, 200)
  job.save(0, 25.0, 250, reason='continuous', commit=False)  # then SIGKILL: no commit, no exit
  job.start(0, 40.0, restored=200)
  job.save(0, 50.0, 300)
  job.ev(0, 51.5, 'exit', code=0, step=300)
  r = report.load(job.write(checkpoints=(100, 200, 300)))
  (restart,) = r.restart_details
  assert (restart.reached_step, restart.restored_step) == (250, 200)
  assert restart.steps_lost == 50 and restart.lower_bound
  assert r.steps_lost_total == 50 and r.steps_lost_max == 50 and r.steps_lost_lower_bound
  assert r.saves_started == 4 and r.saves_committed == 3
  assert not r.runs[0].exited and r.runs[1].exited
  text = report.format_text(r)
  assert ('steps lost: 50 total, max 50 (run 1 was killed at step ~250, run 2 restored step 200 from the job '
          'directory: 50 lost)') in text
  assert '1 run(s) without an exit event' in text


def test_restore_null_counts_everything_lost(tmp_path):
  job = Job(tmp_path)
  job.start(0, 0.0)
  job.save(0, 10.0, 100, commit=False)
  job.ev(0, 12.0, 'exit', code=1, step=120)
  job.start(0, 20.0, restored=None)
  job.ev(0, 21.0, 'restore_skipped', step=100, error='corrupt')
  r = report.load(job.write())
  assert r.restart_details[0].steps_lost == 120
  assert not r.steps_lost_lower_bound
  assert r.restore_skipped == 1 and r.restore_skipped_steps == [100]


def test_two_hosts_count_each_save_once(tmp_path):
  job = Job(tmp_path)
  for h in (0, 1):
    job.start(h, 0.1 * h, num_hosts=2)
    for i, step in enumerate((100, 200, 300)):
      blocking = 0.9 if (h == 1 and step == 200) else 0.5
      job.save(h, 10.0 * (i + 1) + 0.1 * h, step, blocking=blocking, duration=1.0 + h)
    job.ev(h, 40.0, 'exit', code=0, step=300)
  r = report.load(job.write())
  assert r.hosts == [0, 1] and r.num_hosts == 2
  assert r.starts_per_host == {0: 1, 1: 1}
  assert r.saves_started == 3 and r.saves_committed == 3
  assert r.saves_by_reason == {'interval': 3}
  by_step = {s.step: s for s in r.saves}
  assert by_step[200].blocking_s == pytest.approx(0.9)  # max over hosts
  assert by_step[200].duration_s == pytest.approx(2.0)
  assert by_step[200].t == pytest.approx(T0 + 20.0)  # host 0's timestamp
  assert by_step[200].hosts == [0, 1]
  assert r.interval_s.p50 == pytest.approx(10.0)
  assert r.exit_codes == {0: 2}


def test_two_hosts_preempted_and_restarted(tmp_path):
  r = report.load(preempted_then_restarted(tmp_path, hosts=(0, 1)))
  assert r.restarts == 1 and r.starts_per_host == {0: 2, 1: 2}
  assert len(r.preemptions) == 1 and r.preemptions[0].hosts == [0, 1]
  assert r.preemptions[0].exit_after_s == pytest.approx(0.5)
  assert r.saves_started == 16
  assert r.deletions == 1
  assert r.steps_lost_total == 0


def test_truncated_last_line_is_skipped_and_counted(tmp_path):
  d = single_run(tmp_path, torn_tail='{"t": 1700000075.0, "host": 0, "event": "sa')
  r = report.load(d)
  assert r.unparsable_lines == 1
  assert r.saves_started == 6
  assert 'unparsable lines: 1' in report.format_text(r)


def test_torn_line_followed_by_the_next_start_is_salvaged(tmp_path):
  job = Job(tmp_path)
  job.start(0, 0.0)
  job.save(0, 10.0, 100)
  torn = '{"t": %r, "host": 0, "event": "save_sta' % (T0 + 19.0)
  nxt = json.dumps({'t': T0 + 30.0, 'host': 0, 'event': 'start', 'num_hosts': 1, 'pid': 7,
                    'restored_step': 100})
  job.raw(0, torn + nxt)
  job.raw(0, 'not json at all')
  job.raw(0, '[1, 2, 3]')
  job.save(0, 40.0, 200)
  r = report.load(job.write())
  assert r.unparsable_lines == 3
  assert r.starts_per_host == {0: 2}
  assert r.restored_steps == [None, 100]
  assert r.restart_details[0].lower_bound


def goodput_job(tmp_path, blocking=0.5):
  job = Job(tmp_path)
  job.start(0, 0.0)
  for i in range(1, 6):
    job.save(0, 10.0 * i, 100 * i, blocking=blocking)
  job.ev(0, 55.0, 'exit', code=0, step=500)
  return job.write()


def test_goodput_matches_formula(tmp_path):
  r = report.load(goodput_job(tmp_path))
  delta, tau, rcost, m = 0.5, 10.0, 0.0, 3600.0
  assert (r.save_cost_s, r.interval_p50_s, r.restart_cost_s) == (delta, tau, rcost)
  g = report.goodput(r, 1.0)
  assert g['goodput'] == pytest.approx(1 - delta / tau - (tau / 2 + rcost) / m)
  tau_opt = math.sqrt(2 * delta * m)
  assert g['tau_opt_s'] == pytest.approx(60.0) == pytest.approx(tau_opt)
  assert g['goodput_opt'] == pytest.approx(1 - delta / tau_opt - (tau_opt / 2 + rcost) / m)
  assert 'goodput @ MTBF 1 h: 94.9% (Young/Daly optimum 1.0 min -> 98.3%)' in (
      report.format_text(r, mtbf_hours=1.0))


def test_goodput_includes_restart_cost(tmp_path):
  r = report.load(preempted_then_restarted(tmp_path))
  m = 24 * 3600.0
  g = report.goodput(r, 24)
  delta, tau, rcost = r.save_cost_s, r.interval_p50_s, r.restart_cost_s
  assert rcost == pytest.approx(18.1)
  assert g['goodput'] == pytest.approx(max(0.0, 1 - delta / tau - (tau / 2 + rcost) / m))
  assert g['goodput_opt'] == pytest.approx(
      1 - delta / math.sqrt(2 * delta * m) - (math.sqrt(2 * delta * m) / 2 + rcost) / m)


def test_goodput_not_computable_without_saves(tmp_path):
  job = Job(tmp_path)
  job.start(0, 0.0)
  job.ev(0, 5.0, 'exit', code=0, step=10)
  r = report.load(job.write())
  g = report.goodput(r, 24)
  assert g['goodput'] is None and g['tau_opt_s'] is None and 'not computable' in g['note']
  assert 'goodput @ MTBF 24 h: not computable' in report.format_text(r, mtbf_hours=24)
  assert 'interval P50/P90: n/a' in report.format_text(r)


def test_json_round_trips(tmp_path):
  d = preempted_then_restarted(tmp_path, hosts=(0, 1))
  out = io.StringIO()
  assert report.run(d, mtbf_hours=24, as_json=True, out=out) == 0
  data = json.loads(out.getvalue())
  r = report.load(d)
  assert data == json_report.as_dict(r, mtbf_hours=24)
  assert data['restarts'] == 1
  assert data['starts_per_host'] == {'0': 2, '1': 2}
  assert data['saves_started'] == r.saves_started
  assert data['interval_s']['p50'] == pytest.approx(r.interval_s.p50)
  assert data['preemptions'][0]['exit_after_s'] == pytest.approx(0.5)
  assert data['goodput']['goodput'] == pytest.approx(report.goodput(r, 24)['goodput'])
  assert data['steps_lost_total'] == 0


def test_text_run(tmp_path):
  out = io.StringIO()
  assert report.run(single_run(tmp_path), out=out) == 0
  assert 'interval P50/P90: 100/100 steps' in out.getvalue()
  assert ("goodput @ MTBF: a model, not shown; give --mtbf_hours H, the hours between failures you expect, for "
          "Young/Daly's goodput at this job's save cost 0.5 s, interval 10.0 s and R 0 s") in out.getvalue()
  assert 'not computed' not in out.getvalue()


def test_plot_multi_run_two_hosts(tmp_path):
  d = preempted_then_restarted(tmp_path / 'job', hosts=(0, 1))
  png = tmp_path / 'timeline.png'
  out = io.StringIO()
  assert report.run(d, plot_path=str(png), out=out) == 0
  data = png.read_bytes()
  assert data.startswith(PNG_MAGIC) and len(data) > 1000


def test_plot_single_host_single_run(tmp_path):
  r = report.load(single_run(tmp_path / 'job'))
  png = tmp_path / 'one.png'
  report.plot(r, str(png))
  assert png.read_bytes().startswith(PNG_MAGIC)


def test_plot_with_killed_run_and_no_steps(tmp_path):
  job = Job(tmp_path / 'job')
  job.start(0, 0.0)
  job.save(0, 3.0, 10, commit=False)
  job.start(0, 9.0)
  r = report.load(job.write())
  png = tmp_path / 'k.png'
  report.plot(r, str(png))
  assert png.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize('make', ['missing', 'empty', 'garbage'])
def test_no_events_returns_2_with_one_line(tmp_path, capsys, make):
  d = tmp_path / 'job'
  if make != 'missing':
    (d / 'autockpt').mkdir(parents=True)
  if make == 'garbage':
    (d / 'autockpt' / 'events.host0.jsonl').write_text('garbage\n{"t": 1\n')
  out = io.StringIO()
  assert report.run(str(d), out=out) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and 'no events' in err
  assert out.getvalue() == ''
  with pytest.raises(report.ReportError):
    report.load(str(d))


def test_bad_mtbf_returns_2(tmp_path, capsys):
  assert report.run(single_run(tmp_path), mtbf_hours=-1, out=io.StringIO()) == 2
  assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_job_data_is_never_executed(tmp_path, monkeypatch):
  marker = tmp_path / 'X'
  payload = f"__import__('os').system('touch {marker}')"
  monkeypatch.chdir(tmp_path)
  job = Job(tmp_path / 'job')
  job.start(0, 0.0)
  job.raw(0, payload)
  job.ev(0, 1.0, payload, step=payload)
  job.ev(0, 2.0, 'save_started', step=10, reason=payload, blocking_s=payload)
  job.ev(0, 3.0, 'save_committed', step=10, duration_s=payload)
  job.ev(0, 4.0, 'preemption', step=10, signal=payload)
  job.ev(0, 5.0, 'deleted', step=payload, policy=payload)
  job.ev(0, 6.0, 'exit', code=payload, step=10)
  job.raw(0, '{"t": 7, "host": 0, "event": "start", "restored_step": %s}' % payload)
  d = job.write()
  out = io.StringIO()
  assert report.run(d, mtbf_hours=1, as_json=True, out=out) == 0
  assert report.run(d, mtbf_hours=1, plot_path=str(tmp_path / 'p.png'), out=out) == 0
  assert not marker.exists() and not (tmp_path / 'job' / 'X').exists()
  r = report.load(d)
  assert r.unparsable_lines == 2
  assert r.malformed_events == 1
  assert r.saves_by_reason == {payload: 1}


def test_notices_lead_time_and_steps_after_in_text_json_and_plot(tmp_path):
  """A maintenance notice saved at 300, SIGTERM 42 s later agreed at 520: lead 42 s, 220 more steps."""
  job = Job(tmp_path)
  job.start(0, 0.0)
  job.save(0, 10.0, 100)
  job.ev(0, 30.0, 'notice', step=300, source='maintenance-event', value='TERMINATE_ON_HOST_MAINTENANCE',
         seen_by=0)
  job.save(0, 30.0, 300, reason='notice', blocking=0.01, duration=0.2)
  job.ev(0, 72.0, 'preemption', step=520, signal='SIGTERM')
  job.save(0, 72.0, 520, reason='preemption', blocking=0.01, duration=0.2)
  job.ev(0, 72.5, 'exit', code=143, step=520)
  r = report.load(job.write(checkpoints=(100, 300, 520)))
  n, = r.notices
  assert (n.step, n.source, n.committed, n.lead_s, n.steps_after) == (300, 'maintenance-event', True, 42.0, 220)
  assert 'notices: 1 (maintenance-event=TERMINATE_ON_HOST_MAINTENANCE -> step 300 saved, SIGTERM 42.0 s later ' \
         'after 220 more steps)' in report.format_text(r)
  assert json.loads(json.dumps(json_report.as_dict(r)))['notices'][0]['lead_s'] == 42.0
  report.plot(r, str(tmp_path / 'p.png'))
  assert (tmp_path / 'p.png').read_bytes()[:8] == PNG_MAGIC
def test_adaptive_interval_against_the_young_daly_optimum_afterwards(tmp_path):
  """Continuous saves under --autockpt_mtbf_hours record the interval in force; the report compares the
  last one with sqrt(2 delta M) for the save cost measured over the whole job."""
  job = Job(tmp_path)
  job.start(0, 0.0)
  job.save(0, 1.0, 10, reason='continuous', blocking=0.5)
  for i, interval in enumerate((50.0, 58.0, 60.0)):
    t = 60.0 * (i + 1)
    job.ev(0, t, 'save_started', step=10 * (i + 2), reason='continuous', blocking_s=0.5, interval_s=interval,
           mtbf_hours=1.0)
    job.ev(0, t + 1.0, 'save_committed', step=10 * (i + 2), duration_s=1.0)
  r = report.load(job.write())
  assert (r.adaptive_interval_s, r.adaptive_mtbf_hours) == (60.0, 1.0)
  a = report.young_daly.adaptive(r)
  assert a['tau_opt_s'] == pytest.approx(60.0) and a['ratio'] == pytest.approx(1.0)
  assert ('adaptive interval @ MTBF 1 h: converged to 1.0 min; Young/Daly optimum afterwards 1.0 min for '
          'the mean save cost 0.5 s (converged/optimum 1.00); measured P50 1.0 min') in report.format_text(r)
  out = io.StringIO()
  assert report.run(str(tmp_path), as_json=True, out=out) == 0
  assert json.loads(out.getvalue())['adaptive']['ratio'] == pytest.approx(1.0)
  assert report.young_daly.adaptive(report.load(single_run(tmp_path / 'other'))) is None


def test_local_tier_commits_and_the_tier_each_restart_restored_with_steps_lost_to_the_newest_local_commit(tmp_path):
  """SIGKILL after local commits every second: the next run restores the newest local step, and the steps lost
  count from it (not from the job directory's step 0); runs that wrote no `restored_from` read as the job directory."""
  job = Job(tmp_path)
  job.start(0, 0.0)
  job.save(0, 1.0, 0)
  for i, step in enumerate(range(100, 600, 100)):
    job.ev(0, 2.0 + i, 'local_committed', step=step, duration_s=0.02 + 0.01 * i, bytes=1000)
  job.ev(0, 6.5, 'local_committed', step=520, duration_s=0.02, bytes=1000)  # killed at ~530
  job.ev(0, 20.0, 'start', num_hosts=1, pid=2, restored_step=520, restored_from='local')
  job.ev(0, 40.0, 'start', num_hosts=1, pid=3, restored_step=0)  # an older version's start event
  r = report.load(job.write(checkpoints=[0]))
  assert r.local.saves_committed == 6 and r.local.restored_from == [None, 'local', 'job_dir']
  assert r.local.interval_s.p50 == pytest.approx(1.0) and r.local.duration_s.max == pytest.approx(0.06)
  assert r.restart_details[0].restored_step == 520 and r.restart_details[0].steps_lost == 0
  text = report.text.format_text(r)
  assert ('local tier: 6 saves committed, interval P50/P90 1.00/1.00 s, duration P50 0.035 s; each run started from: '
          'fresh, the local tier, the job directory') in text
  assert 'local tier' not in report.text.format_text(report.load(single_run(tmp_path / 'other')))


def test_an_exit_plan_changed_after_the_save_in_flight_is_the_one_reported(tmp_path):
  job = Job(tmp_path)
  job.start(0, 0.0)
  job.save(0, 1.0, 100, reason='continuous', duration=30.0)
  job.ev(0, 5.0, 'preemption', step=140, signal='SIGTERM', signal_at=T0 + 4.5, plan='save', saved_step=140, why='x')
  job.ev(0, 31.0, 'exit_replanned', step=140, plan='keep_in_flight', saved_step=100, why='no time after it')
  job.ev(0, 31.5, 'exit', code=143, step=140)
  p, = report.load(job.write(checkpoints=[100])).preemptions
  assert (p.plan, p.saved_step) == ('keep_in_flight', 100)


def test_the_preemption_line_names_the_phase_the_signal_found_and_what_it_cost(tmp_path):
  """Two hosts, the signal on host 1 during an eval, agreed 0.3 s later at an eval batch on both: the line
  names the phase (host 1's: the host the signal reached) and the time the phase held the exit up."""
  job = Job(tmp_path)
  for h in (0, 1):
    job.start(h, 0.0)
    job.ev(h, 5.3, 'preemption', step=300, signal='SIGTERM', plan='save', saved_step=300, agreed_during='eval',
           during='eval', batch=38, **({'signal_at': T0 + 5.0, 'phase_s': 0.3} if h == 1 else {'signal_at': None}))
    job.save(h, 5.3, 300, reason='preemption', blocking=0.01, duration=0.2)
    job.ev(h, 5.6, 'exit', code=143, step=300)
  r = report.load(job.write(checkpoints=[300]))
  p, = r.preemptions
  assert (p.during, p.agreed_during) == ('eval', 'eval') and p.agreed_after_s == pytest.approx(0.3)
  assert ('preemptions: 1 at step 300 (SIGTERM during eval -> exit 0.60 s (agreed 0.30 s at an eval batch, then '
          '0.30 s))') in report.text.format_text(r)


def test_local_tier_summaries_count_every_commit_they_stand_for(tmp_path):
  """Summed `local_committed` events (one a minute): the count and the intervals are the commits', not the
  summaries'."""
  job = Job(tmp_path)
  job.start(0, 0.0)
  job.ev(0, 1.0, 'local_committed', step=10, duration_s=0.02, bytes=1000, commits=1)
  job.ev(0, 61.0, 'local_committed', step=6010, duration_s=0.03, bytes=1000, commits=60, interval_s=1.0)
  job.ev(0, 121.5, 'local_committed', step=12000, duration_s=0.04, bytes=1000, commits=30, interval_s=2.0)
  r = report.load(job.write())
  assert r.local.saves_committed == 91
  assert (r.local.interval_s.p50, r.local.interval_s.max) == (pytest.approx(1.0), pytest.approx(2.0))


def test_the_legend_in_help_and_in_docs_names_every_line_of_the_report(tmp_path):
  """`report --help` and docs/report.md explain each line the report prints, from one table."""
  from pax_autockpt.tools import cli  # pylint: disable=g-import-not-at-top
  from pax_autockpt.tools import report_legend  # pylint: disable=g-import-not-at-top
  with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), 'docs', 'report.md')) as f:
    assert report_legend.legend_markdown() in f.read(), 'docs/report.md: paste report_legend.legend_markdown()'
  lines = report.format_text(report.load(preempted_then_restarted(tmp_path)), mtbf_hours=1).splitlines()
  labels = tuple(name.strip() for label, _ in report_legend.LEGEND for name in label.split(','))
  assert [line for line in lines if not line.startswith(labels)] == []
  with pytest.raises(SystemExit):
    cli.main(['report', '--help'])


def tutorial_story(tmp_path, local_survived=True):
  """The README tutorial's story: run 1 saves 200 and exits 143 on SIGTERM at 300; run 2 restores 300, commits
  local steps back to back (its log shows the first, 301: the summaries come once a minute), saves 400 and is
  killed at ~575; run 3 restores local step 575 and finishes at 800. Without `local_survived`, run 2's log shows
  its local step 575 (a summary just before the kill), but its disk was lost: run 3 restores checkpoint 400."""
  job = Job(tmp_path)
  job.start(0, 0.0)
  job.save(0, 10.0, 200)
  job.ev(0, 15.0, 'preemption', step=300, signal='SIGTERM')
  job.save(0, 15.0, 300, reason='preemption', blocking=0.01, duration=0.2)
  job.ev(0, 15.5, 'exit', code=143, step=300)
  job.ev(0, 20.0, 'start', num_hosts=1, pid=2, restored_step=300, restored_from='job_dir', restore_s=1.5)
  job.ev(0, 21.0, 'local_committed', step=301, duration_s=0.03, bytes=1000, commits=1)
  job.save(0, 25.0, 400)  # committed at 26.0, its last event; then kill -9 at ~575
  if not local_survived:
    job.ev(0, 26.5, 'local_committed', step=575, duration_s=0.03, bytes=1000, commits=274, interval_s=0.02)
  restored = (575, 'local') if local_survived else (400, 'job_dir')
  job.ev(0, 30.0, 'start', num_hosts=1, pid=3, restored_step=restored[0], restored_from=restored[1],
         restore_s=0.5 if local_survived else 1.5)
  job.ev(0, 31.0, 'local_committed', step=restored[0] + 1, duration_s=0.03, bytes=1000, commits=1)
  job.save(0, 35.0, 600)
  job.save(0, 45.0, 800, reason='final')
  job.ev(0, 46.0, 'local_committed', step=799, duration_s=0.03, bytes=1000, commits=300, interval_s=0.05)
  job.ev(0, 47.0, 'exit', code=0, step=800)
  return job.write(checkpoints=(200, 300, 400, 600, 800))


def test_restarts_line_names_what_each_restart_restored_one_item_per_restart(tmp_path):
  text = report.format_text(report.load(tutorial_story(tmp_path)))
  assert 'restarts: 2 (restored: step 300 from the job directory, local step 575)' in text.splitlines()
  assert 'restarts: 0' in report.format_text(report.load(single_run(tmp_path / 'one'))).splitlines()


@pytest.mark.parametrize('local_survived, words', [
    (True, 'steps lost: 0 total, max 0 (run 1 exited 143 at step 300, run 2 restored step 300 from the job '
           'directory: 0 lost; run 2 was killed at step ~575, run 3 restored local step 575: 0 lost)'),
    (False, 'steps lost: 175 total, max 175 (run 1 exited 143 at step 300, run 2 restored step 300 from the job '
            'directory: 0 lost; run 2 was killed at step ~575, run 3 restored step 400 from the job directory: '
            '175 lost)')])
def test_steps_lost_after_a_kill_in_plain_words_per_restart(tmp_path, local_survived, words):
  """After `kill -9` the log's last sign of run 2 is step 400 (or the local step 575 when its summary was
  logged); the step run 3 restored proves it trained that far: what survived is what it restored, per tier."""
  r = report.load(tutorial_story(tmp_path, local_survived))
  assert [(x.reached_step, x.restored_step, x.steps_lost) for x in r.restart_details] == [
      (300, 300, 0), (575, 575 if local_survived else 400, 0 if local_survived else 175)]
  assert words in report.format_text(r).splitlines()


def test_local_tier_duration_weighs_each_summary_by_its_commits(tmp_path):
  """A summary's duration (its newest commit's) stands for its commits, as its mean interval does: the run's
  first commit, slow (0.10 s), is one commit of 61, not half of them; the plot's points stay out of the JSON."""
  job = Job(tmp_path)
  job.start(0, 0.0)
  job.ev(0, 1.0, 'local_committed', step=10, duration_s=0.10, bytes=1000, commits=1)
  job.ev(0, 61.0, 'local_committed', step=6010, duration_s=0.03, bytes=1000, commits=60, interval_s=1.0)
  r = report.load(job.write())
  assert r.local.saves_committed == 61 and r.local.duration_s.n == 61
  assert r.local.duration_s.p50 == pytest.approx(0.03) and r.local.duration_s.max == pytest.approx(0.10)
  assert 'points' not in json_report.as_dict(r)['local']


def test_local_tier_count_is_a_lower_bound_after_a_kill(tmp_path):
  """Run 2 summed up its local commits and was killed: the ones since its last summary are not in the log."""
  r = report.load(tutorial_story(tmp_path))
  assert (r.local.saves_committed, r.local.count_lower_bound) == (302, True)
  assert ("local tier: >= 302 saves committed (a killed run's last minute is not logged), interval P50/P90 "
          '0.05/0.05 s') in report.format_text(r)


def _artists(ax):
  """Label -> the (x, y) points of each labelled scatter and line of a plot."""
  found = {c.get_label(): [tuple(p) for p in c.get_offsets()] for c in ax.collections}
  found.update({line.get_label(): list(zip(*line.get_data())) for line in ax.lines})
  return found


def test_plot_numbers_runs_from_1_marks_each_ending_where_it_happened_and_draws_local_commits(tmp_path):
  """Issue 61's plot, on the tutorial's story: the kill where run 2's log ends (26 s, step 400), the local step 575
  run 3 restored where run 3 begins (30 s), not on run 2; the on-demand save of 300 drawn above the exit 143 at the
  same place; each gap between runs shaded and its length written; the local tier's cadence the event log's."""
  from pax_autockpt.local import saving  # pylint: disable=g-import-not-at-top
  from pax_autockpt.tools.report import timeline  # pylint: disable=g-import-not-at-top
  ax = timeline.figure(report.load(tutorial_story(tmp_path))).axes[0]
  legend = [t.get_text() for t in ax.get_legend().get_texts()]
  assert [t for t in legend if t.startswith('run ')] == [
      'run 1 (fresh)', 'run 2 (from step 300)', 'run 3 (from local step 575)']
  got = _artists(ax)
  assert got['exit 143 (saved on a signal)'] == [(15.5, 300)] and got['exit 0 (finished)'] == [(47.0, 800)]
  assert got['killed: no exit event (its last event)'] == [(26.0, 400)]
  assert got['restored: local step'] == [(30.0, 575)] and got["restored: job directory's step"] == [(20.0, 300)]
  cadence = f'local tier: newest committed step (an event at most every {saving.SUMMARY_SECS:.0f} s)'
  assert got[cadence] == [(21.0, 301), (31.0, 576), (46.0, 799)]
  assert (25.0, 400) in got['save: interval'] and (15.0, 300) in got['save: preemption']
  zorder = {c.get_label(): c.get_zorder() for c in ax.collections}
  assert zorder['save: preemption'] > zorder['exit 143 (saved on a signal)']
  assert zorder['save: interval'] > zorder['killed: no exit event (its last event)']
  spans = sorted((round(p.get_x(), 6), round(p.get_x() + p.get_width(), 6)) for p in ax.patches)
  assert spans == [(15.5, 20.0), (26.0, 30.0)]  # run 1's exit -> run 2's start; run 2's last event -> run 3's
  assert [t.get_text() for t in ax.texts] == ['down 4.5 s', 'down 4.0 s']


