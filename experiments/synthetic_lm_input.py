"""lm_cloud's synthetic language-model batches, made with NumPy.

paxml's `SyntheticLmData` (what `lm_cloud.SyntheticDataset` trains on) is a Lingvo input generator: a
TensorFlow graph, built per input at start-up and run for every batch, whose every batch is the same
(every token 1, one segment, no padding). This makes the same arrays without TensorFlow.
"""

import numpy as np
from praxis import base_input
from praxis import py_utils


class SyntheticLmInput(base_input.BaseInput):
  """The batch of `SyntheticLmData` (ids and labels 1, segment ids 1, positions 0..seq_len-1, no padding)
  as Pax's Lingvo adaptor hands it over (with every example's eval weight 1).

  Attributes:
    batch_size: examples per batch on this host.
    seq_len: tokens per example.
  """

  batch_size: int = 1
  seq_len: int = 1

  def get_next(self) -> py_utils.NestedMap:
    shape = (self.batch_size, self.seq_len)
    ones = np.ones(shape, np.int32)
    return py_utils.NestedMap(
        ids=ones, labels=ones.copy(), segment_ids=ones.copy(),
        segment_pos=np.tile(np.arange(self.seq_len, dtype=np.int32), (self.batch_size, 1)),
        paddings=np.zeros(shape, np.float32), weights=np.ones(shape, np.float32),
        eval_sample_weights=np.ones([self.batch_size], np.float32))  # as Pax's LingvoInputAdaptor adds

  def reset(self) -> None:
    pass
