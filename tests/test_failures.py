"""Restore failures classified from the errors paxml, orbax, tensorstore and TensorFlow really raise
(the texts below were captured from real restores here), and the retry schedule."""

import errno
import json
import urllib.error

import pytest

from pax_autockpt.shared import failures

Kind = failures.Kind

# tensorstore 0.1.59, a zarr chunk truncated to 3 bytes (restore of the tiny experiment).
TRUNCATED_ZARR = ('FAILED_PRECONDITION: Error reading local file "/tmp/j2/checkpoints/checkpoint_00000247/state/'
                  'mdl_vars.params.lm.softmax.logits_ffn.linear.w/0.0": Truncated Zstd-compressed stream; at byte '
                  "3; at uncompressed byte 0 [source locations='tensorstore/internal/riegeli/array_endian_codec.cc:212")
# An OCDBT data file deleted from a committed checkpoint.
MISSING_OCDBT = ('FAILED_PRECONDITION: Error reading "opt_states.0.p_2_i-1.2.v.params.lm.transformer.repeat.sub.'
                 'x_layers_0.self_attention.post.w/0.0.0.0" in OCDBT database at local file "/tmp/j3/checkpoints/'
                 'checkpoint_00000188/state/": Truncated Zstd-compressed stream; at byte 0')
# paxml 1.4.0 after MODEL_DIMS 64 -> 96.
PAX_MISMATCH = ('PaxMetadata is not compatible with the restored PaxMetadata. expected PaxMetadata = '
                'PaxMetadata(version=1.1, ...')
GCS_503 = 'UNAVAILABLE: Error reading "state/d/f43e": HTTP response code: 503 with body: Service Unavailable'


@pytest.mark.parametrize('error, kind', [
    (ValueError(TRUNCATED_ZARR), Kind.DAMAGE),
    (ValueError(MISSING_OCDBT), Kind.DAMAGE),
    (ValueError('DATA_LOSS: Error decoding chunk'), Kind.DAMAGE),
    (json.JSONDecodeError('Expecting value', '{"a": ', 6), Kind.DAMAGE),
    (FileNotFoundError('metadata/metadata'), Kind.DAMAGE),
    (ValueError(PAX_MISMATCH), Kind.MISMATCH),
    (ValueError(GCS_503), Kind.TRANSIENT),
    (ValueError('DEADLINE_EXCEEDED: Error reading ...'), Kind.TRANSIENT),
    (MemoryError(), Kind.TRANSIENT),
    (ConnectionResetError(errno.ECONNRESET, 'Connection reset by peer'), Kind.TRANSIENT),
    (OSError(errno.EIO, 'Input/output error'), Kind.TRANSIENT),
    (TimeoutError('read timed out'), Kind.TRANSIENT),
    (ValueError('something nobody has seen'), Kind.UNKNOWN),
    (PermissionError(errno.EACCES, 'Permission denied'), Kind.UNKNOWN),
    (urllib.error.HTTPError('http://x', 503, 'Service Unavailable', None, None), Kind.TRANSIENT),
    (urllib.error.HTTPError('http://x', 403, 'Forbidden', None, None), Kind.UNKNOWN),
], ids=lambda x: x.value if isinstance(x, Kind) else type(x).__name__)
def test_classify(error, kind):
  assert failures.classify(error) is kind


def test_tensorflow_storage_errors_are_transient_by_their_type():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  assert failures.classify(tf.errors.UnavailableError(None, None, 'GCS: 503')) is Kind.TRANSIENT
  assert failures.classify(tf.errors.ResourceExhaustedError(None, None, 'OOM')) is Kind.TRANSIENT
  assert failures.classify(tf.errors.NotFoundError(None, None, 'gs://b/x not found')) is Kind.UNKNOWN


def test_a_wrapped_error_is_classified_by_its_cause():
  try:
    try:
      raise ValueError(GCS_503)
    except ValueError as e:
      raise RuntimeError('orbax: restore failed') from e
  except RuntimeError as outer:
    assert failures.classify(outer) is Kind.TRANSIENT


def test_the_storage_s_status_wins_over_words_that_look_like_damage():
  """'UNAVAILABLE: Error reading ...' is the storage failing, not the bytes."""
  assert failures.classify(ValueError('UNAVAILABLE: Error reading x: Truncated')) is Kind.TRANSIENT


@pytest.mark.parametrize('budget, pauses', [
    (0, []), (1, [1.0]), (3, [1.0, 2.0]), (10, [1.0, 2.0, 4.0, 3.0]),
    (100, [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 9.0])])
def test_backoff_doubles_to_30_s_and_adds_up_to_the_budget(budget, pauses):
  assert failures.backoff(budget) == pauses


def test_retrying_transient_retries_only_transient_errors(monkeypatch):
  monkeypatch.setattr(failures.time, 'sleep', lambda s: None)
  calls = []

  def flaky():
    calls.append(1)
    if len(calls) < 3:
      raise ValueError(GCS_503)
    return 'listed'

  assert failures.retrying_transient(flaky, 'listing', 10) == 'listed' and len(calls) == 3
  calls.clear()
  with pytest.raises(ValueError, match='DATA_LOSS'):
    failures.retrying_transient(lambda: calls.append(1) or (_ for _ in ()).throw(ValueError('DATA_LOSS')), 'x', 10)
  assert len(calls) == 1
  with pytest.raises(ValueError, match='UNAVAILABLE'):
    failures.retrying_transient(lambda: (_ for _ in ()).throw(ValueError(GCS_503)), 'x', 3)


def test_one_line_keeps_to_its_limit():
  line = failures.one_line(ValueError('x' * 500 + '\nsecond line'))
  assert len(line) == 300 and line.endswith('...') and '\n' not in line
