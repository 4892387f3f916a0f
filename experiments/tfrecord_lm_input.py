"""A checkpointable tf.data input for the CPU-sized LM: token sequences read from a TFRecord file,
shuffled with a seed, reshuffled each epoch, batched.

Its position is what Pax saves with each checkpoint when `task.train.enable_input_checkpointing` is on
(`get_state()` / `set_state()`, via `_get_state_internal` / `_set_state_internal`): the number of
batches drawn. A restore rebuilds the pipeline, whose order the seed fixes, and skips that many
batches (tf.data reads and drops them: milliseconds for this file). Saved that way the state is
canonical — the same position is the same bytes — so `pax-autockpt verify --against` can compare two
runs' input positions byte for byte; tf.data's own iterator checkpoint restores in O(1) but holds the
shuffle buffer in whatever order it happened to fill, so equal positions can differ in bytes. Every
batch differs, so a batch skipped or repeated after a restart shows in the weights.

Make a file: `python -m experiments.tfrecord_lm_input PATH` (4,096 sequences, ~0.3 MB).
"""

import dataclasses
import json
import os
import sys
from typing import Any

import numpy as np
from praxis import base_input
from praxis import py_utils
import tensorflow as tf


def write_corpus(path: str, num_records: int = 4096, seq_len: int = 32, vocab_size: int = 128,
                 seed: int = 0) -> str:
  """Random token sequences of `seq_len + 1` tokens (ids and the next-token labels), one per record."""
  rng = np.random.default_rng(seed)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with tf.io.TFRecordWriter(path) as writer:
    for tokens in rng.integers(1, vocab_size, size=(num_records, seq_len + 1)):
      feature = {'tokens': tf.train.Feature(int64_list=tf.train.Int64List(value=tokens))}
      writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
  return path


def position(state: bytes) -> int:
  """The number of batches drawn, from a saved input state (a checkpoint's `train_input/process_*`)."""
  return json.loads(state)['batches']


class TFRecordLmInput(base_input.BaseInput):
  """Packed-LM batches (ids, labels, paddings, weights, segment_ids, segment_pos) from `file_pattern`.

  Attributes:
    file_pattern: the TFRecord file (see `write_corpus`).
    seq_len: tokens per sequence; records hold seq_len + 1.
    shuffle_seed: the shuffle's seed (each epoch reshuffles, deterministically).
    shuffle_buffer: records in the shuffle buffer.
  """

  file_pattern: str = ''
  seq_len: int = 32
  shuffle_seed: int = 1234
  shuffle_buffer: int = 256
  _dataset: Any = dataclasses.field(init=False, repr=False)
  _iterator: Any = dataclasses.field(init=False, repr=False)
  _batches: int = dataclasses.field(init=False, repr=False)

  def __post_init__(self):
    super().__post_init__()
    if not tf.io.gfile.exists(self.file_pattern):
      raise ValueError(f'TFRecordLmInput.file_pattern={self.file_pattern!r} does not exist: make it with '
                       f'`python -m experiments.tfrecord_lm_input {self.file_pattern or "PATH"}`')
    self.reset()

  def _make_dataset(self) -> tf.data.Dataset:
    ds = tf.data.TFRecordDataset(self.file_pattern)
    ds = ds.shard(max(1, self.num_infeed_hosts), self.infeed_host_index)
    if self.is_training:
      ds = ds.shuffle(self.shuffle_buffer, seed=self.shuffle_seed, reshuffle_each_iteration=True).repeat()
    features = {'tokens': tf.io.FixedLenFeature([self.seq_len + 1], tf.int64)}
    ds = ds.map(lambda r: tf.cast(tf.io.parse_single_example(r, features)['tokens'], tf.int32))
    return ds.batch(self.batch_size, drop_remainder=True)

  def get_next(self) -> py_utils.NestedMap:
    tokens = next(self._iterator).numpy()
    self._batches += 1
    shape = (tokens.shape[0], self.seq_len)
    return py_utils.NestedMap(
        ids=tokens[:, :-1], labels=tokens[:, 1:], paddings=np.zeros(shape, np.float32),
        weights=np.ones(shape, np.float32), segment_ids=np.ones(shape, np.int32),
        segment_pos=np.broadcast_to(np.arange(self.seq_len, dtype=np.int32), shape).copy())

  def reset(self) -> None:
    self._start_at(0)

  def _start_at(self, batches: int) -> None:
    """A new pipeline (a new dataset: its shuffle seed starts over) positioned after `batches`."""
    self._dataset = self._make_dataset()
    self._iterator = iter(self._dataset.skip(batches))
    self._batches = batches

  def _get_state_internal(self) -> bytes:
    return json.dumps({'batches': self._batches}).encode()

  def _set_state_internal(self, state: bytes) -> None:
    self._start_at(position(state))


if __name__ == '__main__':
  if len(sys.argv) != 2:
    sys.exit('usage: python -m experiments.tfrecord_lm_input PATH')
  print(write_corpus(sys.argv[1]))
