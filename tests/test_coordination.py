"""The one module that touches JAX's coordination service (pax_autockpt.shared.coordination): its helpers against a
stand-in and against jaxlib's own service, its list of key families, and that no other module reaches in."""

import ast
import os
import re

from jax._src import distributed
import pytest

import pax_autockpt
from pax_autockpt.hosts import hosts
from pax_autockpt.shared import coordination
from tests import fakes


class _Jaxlib0426Delete(fakes.CoordinationStore):
  """jaxlib 0.4.26's client: key_value_delete deletes, then fails to convert the absl::Status it returns."""

  def key_value_delete(self, key: str) -> None:
    super().key_value_delete(key)
    raise TypeError('Unable to convert function return value to a Python type! The signature was\n'
                    '    key_value_delete(self, key: str) -> absl::lts_20230802::Status')


def test_delete_ignores_jaxlib_0_4_26_s_error_after_deleting_the_key_and_its_folder():
  store = _Jaxlib0426Delete(1)
  for key in ('a/1', 'a/1/x', 'a/2'):
    store.key_value_set(key, 'v')
  coordination.delete(store, 'a/1')
  assert store.kv == {'a/2': 'v'}


def test_delete_lets_any_other_error_through():
  """A service that is gone or refuses is the caller's to handle (local.restoring logs it, agreement's beat too)."""
  store = fakes.CoordinationStore(1)
  store.key_value_delete = fakes.raises(RuntimeError('UNAVAILABLE: the coordination service is gone'))
  with pytest.raises(RuntimeError, match='UNAVAILABLE'):
    coordination.delete(store, 'a/1')


def test_claim_is_first_writer_wins():
  store = fakes.CoordinationStore(2)
  assert coordination.claim(store, coordination.STARTUP_EXIT, 'exit|SIGTERM|1')
  assert not coordination.claim(store, coordination.STARTUP_EXIT, 'trained')
  assert store.kv == {coordination.STARTUP_EXIT: 'exit|SIGTERM|1'}


def test_helpers_against_jaxlib_s_own_service():
  """What jax.distributed runs: a delete returns (whatever this jaxlib makes of its status) with the key and
  its folder gone, and nothing else; a second claim of a key fails."""
  from jax._src.lib import xla_extension  # pylint: disable=g-import-not-at-top
  port = hosts.free_loopback_port()
  service = xla_extension.get_distributed_runtime_service(f'127.0.0.1:{port}', 1)
  client = xla_extension.get_distributed_runtime_client(f'127.0.0.1:{port}', 0, init_timeout=60)
  try:
    client.connect()
    for key in ('t/fill/0', 't/fill/0/peer', 't/fill/1/peer', 't/fill/00'):
      assert coordination.claim(client, key, 'x')
    assert not coordination.claim(client, 't/fill/0', 'y')
    assert coordination.delete(client, 't/fill/0') is None
    assert sorted(k for k, _ in client.key_value_dir_get('t/')) == ['t/fill/00', 't/fill/1/peer']
  finally:
    client.shutdown()
    service.shutdown()


def test_the_accessors_read_jax_s_state_when_called(monkeypatch):
  """jax.distributed.initialize comes after pax_autockpt's imports: nothing may be read at import time."""
  sync, client = object(), object()
  monkeypatch.setattr(distributed.global_state, 'client', client)
  monkeypatch.setattr(distributed.global_state, 'coordinator_address', 'node-0:1234')
  monkeypatch.setattr(distributed.global_state, 'process_id', 3)
  monkeypatch.setattr(distributed.global_state, 'preemption_sync_manager', sync)
  assert coordination.client() is client and coordination.coordinator_address() == 'node-0:1234'
  assert coordination.process_id() == 3 and coordination.preemption_sync_manager() is sync


def _families() -> dict[str, str]:
  return {name: value for name, value in vars(coordination).items()
          if name.isupper() and isinstance(value, str) and value.startswith('autockpt/')}


def test_every_key_family_is_listed_and_none_reaches_into_another():
  """The docstring is the one list of what the job keeps in the service; a family's prefix that began
  another's would let a listing or a delete of one reach the other's keys."""
  families = _families()
  assert len(families) >= 16
  for name, prefix in families.items():
    assert re.search(rf'\b{name}\b', coordination.__doc__), f'{name} is not in the docstring\'s list'
    assert re.search(rf'(?<![\w/-]){re.escape(prefix)}', coordination.__doc__), f'{prefix} is not in the list'
    others = [n for n, p in families.items() if n != name and p.startswith(prefix)]
    assert not others, f'{name} ({prefix}) is a prefix of {others}'


def _imports_jax_distributed(path: str) -> bool:
  with open(path, encoding='utf-8') as f:
    text = f.read()
  for node in ast.walk(ast.parse(text, path)):
    if isinstance(node, ast.ImportFrom) and node.module == 'jax._src':
      if any(alias.name == 'distributed' for alias in node.names):
        return True
    if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('jax._src.distributed'):
      return True
    if isinstance(node, ast.Import) and any(a.name.startswith('jax._src.distributed') for a in node.names):
      return True
  return bool(re.search(r'_src\.distributed|_src import distributed', text))  # e.g. importlib, a lazy import


def test_only_the_coordination_module_reaches_into_jax_s_distributed_state():
  root = os.path.dirname(pax_autockpt.__file__)
  found = sorted(os.path.relpath(os.path.join(d, n), root) for d, _, names in os.walk(root) for n in names
                 if n.endswith('.py') and _imports_jax_distributed(os.path.join(d, n)))
  assert found == [os.path.join('shared', 'coordination.py')], f'{found}: use pax_autockpt.shared.coordination instead'
