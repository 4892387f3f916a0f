"""A bucket save's set-up on the local GCS (pax_autockpt.shared.internals.making_step_on_object_store): orbax's
repeated questions about a new step's directory and its directory markers cost round trips before the
first array byte; inside the block they do not, and what is written there is unchanged."""

import threading

from etils import epath

from pax_autockpt.shared import internals


def test_a_new_steps_directory_is_asked_about_once_and_gets_no_markers(gcs):
  step = epath.Path(gcs.url('objstore/checkpoints/checkpoint_00000007'))
  gcs.stats(reset=True)
  with internals.making_step_on_object_store(step):
    assert not step.exists() and not step.exists() and not step.exists()  # orbax asks three times
    asked = gcs.stats(reset=True).get('requests', 0)
    step.mkdir(parents=True)
    (step / 'state').mkdir()
    assert gcs.stats(reset=True).get('requests', 0) == 0  # no markers, no parent checks
    (step / 'state' / 'a.txt').write_text('x')
    assert step.exists()  # 'made': the storage is asked again, and has it
  assert 1 <= asked <= 2  # one question: the object, then the prefix
  assert sorted(gcs.objects('objstore/')) == ['objstore/checkpoints/checkpoint_00000007/state/a.txt']


def test_a_leftover_at_the_step_is_still_found_and_other_paths_and_threads_are_untouched(gcs):
  step = epath.Path(gcs.url('objstore2/checkpoints/checkpoint_00000003'))
  (step / 'state' / 'half.bin').write_text('left by a failed save')
  other = epath.Path(gcs.url('objstore2/elsewhere'))
  seen = {}
  with internals.making_step_on_object_store(step):
    assert step.exists() and step.exists()  # present: every question goes to the storage
    other.mkdir(parents=True)  # not under the step: a real directory marker
    worker = threading.Thread(target=lambda: seen.update(made=(step / 'x').mkdir(parents=True)))
    worker.start()
    worker.join()
  assert 'objstore2/elsewhere/' in gcs.objects('objstore2/')
  assert 'objstore2/checkpoints/checkpoint_00000003/x/' in gcs.objects('objstore2/')  # another thread
  assert (step / 'state' / 'half.bin').exists()
