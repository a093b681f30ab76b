"""The packed client store is held once on a CPU: aligned host arrays that `to_device`
places without a copy, with the values `pack_clients` always had."""
import jax
import numpy as np
import pytest

from fedjax_dg.data import store as store_lib
from fedjax_dg.data.splits import Split


@pytest.mark.parametrize("shape,dtype", [((3, 5, 7), np.float32), ((1,), np.int32), ((4, 9), np.uint8),
                                         ((0, 3), np.float32)])
def test_aligned_arrays(shape, dtype):
  a = store_lib.aligned_full(shape, 3, dtype)
  assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
  assert a.ctypes.data % store_lib.ALIGNMENT == 0 or a.size == 0
  np.testing.assert_array_equal(a, np.full(shape, 3, dtype))


def _split(n=23, seed=0):
  rng = np.random.default_rng(seed)
  return Split(rng.random((n, 4, 4, 1), dtype=np.float32), rng.integers(0, 5, n).astype(np.int32),
               rng.integers(0, 3, n).astype(np.int32))


def test_pack_clients_values_and_alignment():
  split = _split()
  parts = [np.array([0, 5, 7]), np.array([1]), np.arange(8, 23)]
  s = store_lib.pack_clients(split, parts)
  for a in (s.x, s.y, s.domain):
    assert a.ctypes.data % store_lib.ALIGNMENT == 0
  # the plain transcription: each client's rows first, zeros after
  n_max = 15
  for c, idx in enumerate(parts):
    k = len(idx)
    np.testing.assert_array_equal(s.x[c, :k], split.x[idx])
    np.testing.assert_array_equal(s.y[c, :k], split.y[idx])
    np.testing.assert_array_equal(s.domain[c, :k], split.domain[idx])
    assert not s.x[c, k:].any() and not s.y[c, k:].any() and not s.domain[c, k:].any()
  assert s.x.shape == (3, n_max, 4, 4, 1) and list(s.counts) == [3, 1, 15]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="host arrays are device arrays on a CPU only")
def test_to_device_places_the_store_without_a_copy_on_cpu():
  s = store_lib.pack_clients(_split(200), [np.arange(i, 200, 4) for i in range(4)])
  d = store_lib.to_device(s)
  assert d.x.unsafe_buffer_pointer() == s.x.ctypes.data  # the same memory
  assert d.y.unsafe_buffer_pointer() == s.y.ctypes.data
  np.testing.assert_array_equal(np.asarray(d.x), s.x)
  np.testing.assert_array_equal(np.asarray(d.counts), s.counts)
