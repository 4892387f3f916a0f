"""Host wiring: every source, every malformed value, the TPU metadata server, and the mesh check."""

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from pax_autockpt.hosts import hosts
from pax_autockpt.hosts.hosts import DEFAULT_PORT
from pax_autockpt.hosts.hosts import Wiring
from pax_autockpt.hosts.hosts import WiringError
from pax_autockpt.hosts.hosts import check_mesh
from pax_autockpt.hosts.hosts import resolve


def _fixed_port():
  return 12345


def _raises(match_name, **kwargs):
  """resolve(**kwargs) raises a one-line WiringError that names match_name; returns the message."""
  with pytest.raises(WiringError) as info:
    resolve(free_port=_fixed_port, **kwargs)
  message = str(info.value)
  assert '\n' not in message and '\r' not in message
  assert match_name in message
  return message


@pytest.fixture(autouse=True)
def _no_tpu_devices(monkeypatch):
  """Tests run as if on a machine with no TPU device, whatever the real one has."""
  monkeypatch.setattr(hosts, '_TPU_DEVICES', ('/nonexistent/accel0',))


def _multislice_env(slice_id, num_slices, worker_id, hostnames, coordinator='10.0.0.2'):
  return {
      'MEGASCALE_COORDINATOR_ADDRESS': coordinator,
      'MEGASCALE_NUM_SLICES': str(num_slices),
      'MEGASCALE_SLICE_ID': str(slice_id),
      'TPU_WORKER_ID': str(worker_id),
      'TPU_WORKER_HOSTNAMES': ','.join(hostnames),
  }


# --- fake TPU VM metadata server ----------------------------------------------------------------


class _MetadataHandler(http.server.BaseHTTPRequestHandler):
  attributes: dict = {}
  unavailable: list = []  # the first len() requests are answered 503

  def do_GET(self):  # noqa: N802 (http.server's name)
    prefix = '/computeMetadata/v1/instance/attributes/'
    if self.headers.get('Metadata-Flavor') != 'Google':
      self.send_response(403)
      self.end_headers()
      return
    if self.unavailable:
      self.unavailable.pop()
      self.send_response(503)
      self.end_headers()
      return
    body = self.attributes.get(self.path[len(prefix):]) if self.path.startswith(prefix) else None
    if body is None:
      self.send_response(404)
      self.end_headers()
      return
    self.send_response(200)
    self.send_header('Content-Type', 'application/text')
    self.end_headers()
    self.wfile.write(body.encode())

  def log_message(self, *args):
    pass


@pytest.fixture
def metadata():
  """start(attributes) -> 'host:port' of a real HTTP server on loopback that serves them."""
  servers = []

  def start(attributes, unavailable=0):
    handler = type('Handler', (_MetadataHandler,), {'attributes': dict(attributes), 'unavailable': [0] * unavailable})
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={'poll_interval': 0.05}, daemon=True).start()
    servers.append(server)
    return f'127.0.0.1:{server.server_address[1]}'

  yield start
  for server in servers:
    server.shutdown()
    server.server_close()


TWO_WORKERS = {
    'agent-worker-number': '1',
    'worker-network-endpoints': 'unknown:unknown:10.130.0.37,unknown:unknown:10.130.0.38',
}


# --- Wiring ---------------------------------------------------------------------------------------


def test_line_format():
  assert Wiring(3, 4, '10.0.0.2:8476', 'tpu').line() == 'host_idx=3 num_hosts=4 server_addr=10.0.0.2:8476 source=tpu'


def test_wiring_is_frozen():
  with pytest.raises(AttributeError):
    Wiring(0, 1, '127.0.0.1:1', 'local').host_idx = 1


# --- explicit ---------------------------------------------------------------------------------------


def test_explicit_wins_over_environment():
  env = _multislice_env(1, 2, 1, ['10.0.0.2', '10.0.0.3'])
  assert resolve(host_idx=2, num_hosts=5, server_addr='coord:9000', env=env) == Wiring(2, 5, 'coord:9000', 'explicit')


@pytest.mark.parametrize('addr', ['10.0.0.2:1', 'coord-0.svc.cluster.local:65535', '[::1]:8476', '[fe80::1]:80'])
def test_explicit_server_addr_forms(addr):
  assert resolve(host_idx=0, num_hosts=1, server_addr=addr, env={}).server_addr == addr


@pytest.mark.parametrize('given, message', [
    ({'host_idx': 0}, '--host_idx was given without --num_hosts/--server_addr: pass all three, or none to derive them'),
    ({'num_hosts': 2},
     '--num_hosts was given without --host_idx/--server_addr: pass all three, or none to derive them'),
    ({'host_idx': 0, 'server_addr': 'a:1'},
     '--host_idx/--server_addr were given without --num_hosts: pass all three, or none to derive them'),
])
def test_partial_explicit(given, message):
  assert _raises('--', env={}, **given) == message


@pytest.mark.parametrize('given, name', [
    ({'host_idx': 0, 'num_hosts': 0, 'server_addr': 'a:1'}, '--num_hosts=0'),
    ({'host_idx': 2, 'num_hosts': 2, 'server_addr': 'a:1'}, '--host_idx=2'),
    ({'host_idx': -1, 'num_hosts': 2, 'server_addr': 'a:1'}, '--host_idx=-1'),
    ({'host_idx': '0', 'num_hosts': 2, 'server_addr': 'a:1'}, "--host_idx='0'"),
    ({'host_idx': True, 'num_hosts': 2, 'server_addr': 'a:1'}, '--host_idx=True'),
    ({'host_idx': 0, 'num_hosts': 1, 'server_addr': '10.0.0.2'}, "--server_addr='10.0.0.2' has no port"),
    ({'host_idx': 0, 'num_hosts': 1, 'server_addr': '10.0.0.2:'}, "--server_addr='10.0.0.2:' has no port"),
    ({'host_idx': 0, 'num_hosts': 1, 'server_addr': '10.0.0.2:http'}, 'has no port'),
    ({'host_idx': 0, 'num_hosts': 1, 'server_addr': '10.0.0.2:0'}, 'has port 0, out of range'),
    ({'host_idx': 0, 'num_hosts': 1, 'server_addr': '10.0.0.2:65536'}, 'has port 65536, out of range'),
    ({'host_idx': 0, 'num_hosts': 1, 'server_addr': ':8476'}, "--server_addr=':8476' has no host"),
    ({'host_idx': 0, 'num_hosts': 1, 'server_addr': '::1:8476'}, 'IPv6 goes in brackets'),
    ({'host_idx': 0, 'num_hosts': 1, 'server_addr': '[nope]:8476'}, 'no valid IPv6'),
    ({'host_idx': 0, 'num_hosts': 1, 'server_addr': 'a b:8476'}, 'an invalid host'),
])
def test_explicit_malformed(given, name):
  message = _raises(name, env={}, **given)
  assert message.startswith(('--host_idx', '--num_hosts', '--server_addr'))


# --- TPU multislice ----------------------------------------------------------------------------------


def test_multislice_example_line():
  env = _multislice_env(1, 2, 1, ['10.0.0.2', '10.0.0.3'])
  assert resolve(env=env).line() == 'host_idx=3 num_hosts=4 server_addr=10.0.0.2:8476 source=tpu-multislice'


@pytest.mark.parametrize('num_slices, hosts_per_slice', [(2, 2), (4, 8), (1, 4)])
def test_multislice_every_host_distinct(num_slices, hosts_per_slice):
  names = [f'w{i}' for i in range(hosts_per_slice)]
  wirings = [resolve(env=_multislice_env(s, num_slices, w, names, coordinator='coord'))
             for s in range(num_slices) for w in range(hosts_per_slice)]
  total = num_slices * hosts_per_slice
  assert [w.host_idx for w in wirings] == list(range(total))  # slice-major order
  assert {(w.num_hosts, w.server_addr, w.source) for w in wirings} == {(total, 'coord:8476', 'tpu-multislice')}


@pytest.mark.parametrize('coordinator, addr', [
    ('10.0.0.2:8080', '10.0.0.2:8476'),
    ('coord.example:1234', 'coord.example:8476'),
    ('[fd00::2]:8080', '[fd00::2]:8476'),
    ('fd00::2', '[fd00::2]:8476'),
])
def test_multislice_drops_megascale_port(coordinator, addr):
  env = _multislice_env(0, 2, 0, ['a', 'b'], coordinator=coordinator)
  assert resolve(env=env).server_addr == addr


def test_multislice_port_override():
  env = _multislice_env(1, 2, 0, ['a', 'b'], coordinator='10.0.0.2:8080')
  assert resolve(env=env, port=9999) == Wiring(2, 4, '10.0.0.2:9999', 'tpu-multislice')


@pytest.mark.parametrize('drop', ['MEGASCALE_COORDINATOR_ADDRESS', 'MEGASCALE_NUM_SLICES', 'MEGASCALE_SLICE_ID'])
def test_multislice_partially_set(drop):
  env = _multislice_env(0, 2, 0, ['a', 'b'])
  del env[drop]
  message = _raises(drop, env=env)
  assert f'but {drop} is not' in message


def test_multislice_single_var_names_the_rest():
  message = _raises('MEGASCALE_NUM_SLICES', env={'MEGASCALE_NUM_SLICES': '2'})
  assert message.startswith('MEGASCALE_NUM_SLICES is set but MEGASCALE_COORDINATOR_ADDRESS/MEGASCALE_SLICE_ID is not')


@pytest.mark.parametrize('key, value, message', [
    ('MEGASCALE_SLICE_ID', '2',
     'MEGASCALE_SLICE_ID=2 is out of range for MEGASCALE_NUM_SLICES=2: it must be 0..1'),
    ('MEGASCALE_SLICE_ID', '-1',
     'MEGASCALE_SLICE_ID=-1 is out of range for MEGASCALE_NUM_SLICES=2: it must be 0..1'),
    ('MEGASCALE_SLICE_ID', 'one', "MEGASCALE_SLICE_ID='one' is not an integer: set it to a plain integer, or unset it"),
    ('MEGASCALE_NUM_SLICES', '0', 'MEGASCALE_NUM_SLICES=0 is invalid: it must be >= 1'),
    ('MEGASCALE_NUM_SLICES', '1_0', "MEGASCALE_NUM_SLICES='1_0' is not an integer"),
    ('TPU_WORKER_ID', '2', 'TPU_WORKER_ID=2 is out of range for 2 TPU_WORKER_HOSTNAMES: it must be 0..1'),
    ('TPU_WORKER_ID', '', "TPU_WORKER_ID='' is not an integer"),
    ('TPU_WORKER_HOSTNAMES', '', "TPU_WORKER_HOSTNAMES='' has an empty entry"),
    ('TPU_WORKER_HOSTNAMES', 'a,,b', "TPU_WORKER_HOSTNAMES='a,,b' has an empty entry"),
    ('MEGASCALE_COORDINATOR_ADDRESS', '', "MEGASCALE_COORDINATOR_ADDRESS='' has no valid host"),
    ('MEGASCALE_COORDINATOR_ADDRESS', ':8080', "MEGASCALE_COORDINATOR_ADDRESS=':8080' has no valid host"),
])
def test_multislice_malformed(key, value, message):
  env = _multislice_env(0, 2, 0, ['a', 'b'])
  env[key] = value
  assert _raises(key, env=env).startswith(message)


def test_multislice_without_workers_or_metadata():
  env = _multislice_env(0, 2, 0, ['a'])
  del env['TPU_WORKER_ID'], env['TPU_WORKER_HOSTNAMES']
  message = _raises('TPU_WORKER_ID/TPU_WORKER_HOSTNAMES', env=env)
  assert '--host_idx/--num_hosts/--server_addr' in message


def test_multislice_from_metadata_server(metadata):
  host = metadata(TWO_WORKERS)
  env = _multislice_env(1, 3, 0, ['unused'], coordinator='10.0.0.9:8080')
  del env['TPU_WORKER_ID'], env['TPU_WORKER_HOSTNAMES']
  assert resolve(env=env, metadata_host=host) == Wiring(3, 6, '10.0.0.9:8476', 'tpu-multislice')


# --- TPU single slice -------------------------------------------------------------------------------


@pytest.mark.parametrize('worker_id', range(4))
def test_single_slice_of_four(worker_id):
  env = {'TPU_WORKER_ID': str(worker_id), 'TPU_WORKER_HOSTNAMES': 't-0.svc,t-1.svc,t-2.svc,t-3.svc'}
  assert resolve(env=env) == Wiring(worker_id, 4, 't-0.svc:8476', 'tpu')


def test_single_slice_port_override_and_spaces():
  env = {'TPU_WORKER_ID': ' 1 ', 'TPU_WORKER_HOSTNAMES': ' 10.0.0.2 , 10.0.0.3 '}
  assert resolve(env=env, port=9000) == Wiring(1, 2, '10.0.0.2:9000', 'tpu')


def test_single_worker_tpu_is_tpu():
  env = {'TPU_WORKER_ID': '0', 'TPU_WORKER_HOSTNAMES': 'localhost'}
  assert resolve(env=env) == Wiring(0, 1, 'localhost:8476', 'tpu')


@pytest.mark.parametrize('env, name', [
    ({'TPU_WORKER_ID': '0'}, 'TPU_WORKER_ID is set but TPU_WORKER_HOSTNAMES is not'),
    ({'TPU_WORKER_HOSTNAMES': 'a,b'}, 'TPU_WORKER_HOSTNAMES is set but TPU_WORKER_ID is not'),
    ({'TPU_WORKER_ID': 'x', 'TPU_WORKER_HOSTNAMES': 'a,b'}, "TPU_WORKER_ID='x' is not an integer"),
    ({'TPU_WORKER_ID': '4', 'TPU_WORKER_HOSTNAMES': 'a,b,c,d'}, 'TPU_WORKER_ID=4 is out of range for 4'),
    ({'TPU_WORKER_ID': '-1', 'TPU_WORKER_HOSTNAMES': 'a,b'}, 'TPU_WORKER_ID=-1 is out of range for 2'),
    ({'TPU_WORKER_ID': '0', 'TPU_WORKER_HOSTNAMES': ' '}, 'TPU_WORKER_HOSTNAMES'),
])
def test_single_slice_malformed(env, name):
  _raises(name, env=env)


def test_metadata_server_needs_the_header(metadata):
  host = metadata(TWO_WORKERS)
  url = f'http://{host}/computeMetadata/v1/instance/attributes/agent-worker-number'
  opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
  with pytest.raises(urllib.error.HTTPError) as info:
    opener.open(url, timeout=2)
  assert info.value.code == 403


def test_metadata_server(metadata):
  host = metadata(TWO_WORKERS)
  assert resolve(env={}, metadata_host=host) == Wiring(1, 2, '10.130.0.37:8476', 'tpu')


def test_metadata_single_worker(metadata):
  host = metadata({'agent-worker-number': '0\n', 'worker-network-endpoints': 'unknown:unknown:10.130.0.5'})
  assert resolve(env={}, metadata_host=host, port=7000) == Wiring(0, 1, '10.130.0.5:7000', 'tpu')


def test_metadata_host_from_gce_env(metadata):
  host = metadata(TWO_WORKERS)
  assert resolve(env={'GCE_METADATA_HOST': host}) == Wiring(1, 2, '10.130.0.37:8476', 'tpu')


def test_metadata_asked_when_a_tpu_device_exists(metadata, monkeypatch, tmp_path):
  device = tmp_path / 'accel0'
  device.touch()
  monkeypatch.setattr(hosts, '_TPU_DEVICES', (str(device),))
  monkeypatch.setattr(hosts, '_DEFAULT_METADATA_HOST', metadata(TWO_WORKERS))
  assert resolve(env={}) == Wiring(1, 2, '10.130.0.37:8476', 'tpu')


def test_metadata_env_vars_win_over_metadata(metadata):
  host = metadata(TWO_WORKERS)
  env = {'TPU_WORKER_ID': '0', 'TPU_WORKER_HOSTNAMES': 'x,y,z'}
  assert resolve(env=env, metadata_host=host) == Wiring(0, 3, 'x:8476', 'tpu')


@pytest.mark.parametrize('attributes, fragment', [
    ({}, 'did not give agent-worker-number (HTTP Error 404: Not Found)'),
    ({'agent-worker-number': '0'}, 'did not give worker-network-endpoints (HTTP Error 404: Not Found)'),
    ({**TWO_WORKERS, 'agent-worker-number': 'one\ntwo'}, "returned agent-worker-number='one two', not an integer"),
    ({**TWO_WORKERS, 'agent-worker-number': '2'}, 'agent-worker-number=2, out of range for 2 worker-network-endpoints'),
    ({**TWO_WORKERS, 'worker-network-endpoints': ''}, 'worker-network-endpoints=\'\' with an empty entry'),
    ({**TWO_WORKERS, 'worker-network-endpoints': 'a:b:10.0.0.1,a:b:'}, 'with an empty entry'),
])
def test_metadata_failures(metadata, attributes, fragment):
  host = metadata(attributes)
  message = _raises(f'TPU metadata server {host}', env={}, metadata_host=host)
  assert fragment in message
  assert '--host_idx/--num_hosts/--server_addr' in message


@pytest.fixture
def pauses(monkeypatch):
  """The retries' sleeps (this test's thread's), recorded instead of slept; a 3 s budget (1, 2). `hosts.time` is
  the `time` module itself: another test's thread still running (a rescue thread waking every 0.1 s) sleeps for
  real, not into the record (51,688 such sleeps once made this test fail)."""
  slept, owner, real = [], threading.get_ident(), time.sleep
  monkeypatch.setattr(hosts.time, 'sleep',
                      lambda secs: slept.append(secs) if threading.get_ident() == owner else real(secs))
  monkeypatch.setattr(hosts, 'METADATA_RETRY_SECS', 3.0)
  return slept


def test_metadata_unreachable_is_retried_then_a_failure_not_bad_configuration(pauses):
  with socket.socket() as s:  # a port nobody listens on once closed
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  with pytest.raises(hosts.MetadataUnavailable) as info:
    resolve(env={}, metadata_host=f'127.0.0.1:{port}')
  assert f'TPU metadata server 127.0.0.1:{port} did not give tpu-env for 3 s' in str(info.value)
  assert '--host_idx/--num_hosts/--server_addr' in str(info.value) and pauses == [1.0, 2.0]


def test_metadata_server_errors_are_retried(metadata, pauses):
  host = metadata(TWO_WORKERS, unavailable=2)
  assert resolve(env={}, metadata_host=host) == Wiring(1, 2, '10.130.0.37:8476', 'tpu')
  assert pauses == [1.0, 2.0]


# Worker 1 of slice 1 of 2 (2 workers per slice), as a queued-resource TPU VM's metadata server gives it.
MULTISLICE_TPU_ENV = {
    **TWO_WORKERS,
    'tpu-env': "ACCELERATOR_TYPE: 'v5litepod-8'\nMEGASCALE_COORDINATOR_ADDRESS: '10.130.0.2:8080'\n"
               "MEGASCALE_NUM_SLICES: '2'\nMEGASCALE_SLICE_ID: '1'\nWORKER_ID: '1'\n",
}


def test_multislice_from_the_tpu_env_attribute(metadata):
  host = metadata(MULTISLICE_TPU_ENV)
  assert resolve(env={}, metadata_host=host) == Wiring(3, 4, '10.130.0.2:8476', 'tpu-multislice')
  env = {'MEGASCALE_COORDINATOR_ADDRESS': '10.9.9.9', 'MEGASCALE_NUM_SLICES': '4', 'MEGASCALE_SLICE_ID': '0'}
  assert resolve(env=env, metadata_host=host) == Wiring(1, 8, '10.9.9.9:8476', 'tpu-multislice')  # env wins


def test_a_tpu_env_that_is_not_yaml_is_one_line(metadata):
  host = metadata({**TWO_WORKERS, 'tpu-env': 'MEGASCALE_SLICE_ID: [1\n'})
  assert 'returned a tpu-env that is not YAML' in _raises(f'TPU metadata server {host}', env={}, metadata_host=host)


def test_print_wiring_reads_tpu_env_from_the_project_s_fake_metadata_server(tmp_path):
  """The real command against the fake server the e2e tests use: host 3 of 4, not 1 of 2."""
  from rigs import fake_metadata  # pylint: disable=g-import-not-at-top
  with fake_metadata.FakeMetadataServer(str(tmp_path)) as server:
    for key, value in MULTISLICE_TPU_ENV.items():
      server.set(f'attributes/{key}', value)
    env = {k: v for k, v in os.environ.items() if not k.startswith(('MEGASCALE_', 'TPU_', 'SLURM_'))}
    out = subprocess.run([sys.executable, '-m', 'pax_autockpt.main', '--autockpt_print_wiring'], capture_output=True,
                         text=True, timeout=60, env={**env, 'GCE_METADATA_HOST': server.host})
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip() == 'host_idx=3 num_hosts=4 server_addr=10.130.0.2:8476 source=tpu-multislice'


def test_no_network_probe_without_a_tpu(monkeypatch):
  def fail(*args):
    raise AssertionError('the metadata server must not be asked')

  monkeypatch.setattr(hosts, '_fetch', fail)
  assert resolve(env={}, free_port=_fixed_port) == Wiring(0, 1, '127.0.0.1:12345', 'local')
  assert resolve(env={'SLURM_PROCID': '0', 'SLURM_NTASKS': '1', 'SLURM_JOB_NODELIST': 'n1'}).source == 'slurm'


# --- Slurm --------------------------------------------------------------------------------------------


@pytest.mark.parametrize('nodelist, first', [
    ('node[001-004,007],gpu2', 'node001'),
    ('a-b[3,5]', 'a-b3'),
    ('host1,host2', 'host1'),
    ('single', 'single'),
    ('node[7]', 'node7'),
    ('rack[1-2]-node[01-04]', 'rack1-node01'),
    ('gpu[10-11]-ib,cpu1', 'gpu10-ib'),
])
def test_slurm_nodelist(nodelist, first):
  env = {'SLURM_PROCID': '2', 'SLURM_NTASKS': '4', 'SLURM_JOB_NODELIST': nodelist}
  assert resolve(env=env) == Wiring(2, 4, f'{first}:8476', 'slurm')


def test_slurm_nodelist_fallback_and_port():
  env = {'SLURM_PROCID': '0', 'SLURM_NTASKS': '2', 'SLURM_NODELIST': 'n[5-6]'}
  assert resolve(env=env, port=6000) == Wiring(0, 2, 'n5:6000', 'slurm')


def test_slurm_every_task_distinct():
  wirings = [resolve(env={'SLURM_PROCID': str(i), 'SLURM_NTASKS': '3', 'SLURM_JOB_NODELIST': 'n[1-3]'})
             for i in range(3)]
  assert [(w.host_idx, w.num_hosts, w.server_addr) for w in wirings] == [(i, 3, 'n1:8476') for i in range(3)]


@pytest.mark.parametrize('env, name', [
    ({'SLURM_PROCID': '0', 'SLURM_JOB_NODELIST': 'n1'}, 'SLURM_PROCID is set but SLURM_NTASKS is not'),
    ({'SLURM_PROCID': '0', 'SLURM_NTASKS': '1'}, 'SLURM_PROCID is set but SLURM_JOB_NODELIST is not'),
    ({'SLURM_PROCID': '0'}, 'SLURM_PROCID is set but SLURM_NTASKS/SLURM_JOB_NODELIST is not'),
    ({'SLURM_PROCID': 'x', 'SLURM_NTASKS': '2', 'SLURM_JOB_NODELIST': 'n1'}, "SLURM_PROCID='x' is not an integer"),
    ({'SLURM_PROCID': '2', 'SLURM_NTASKS': '2', 'SLURM_JOB_NODELIST': 'n1'},
     'SLURM_PROCID=2 is out of range for SLURM_NTASKS=2: it must be 0..1'),
    ({'SLURM_PROCID': '0', 'SLURM_NTASKS': '0', 'SLURM_JOB_NODELIST': 'n1'}, 'SLURM_NTASKS=0 is invalid'),
    ({'SLURM_PROCID': '0', 'SLURM_NTASKS': '1', 'SLURM_JOB_NODELIST': ''}, "SLURM_JOB_NODELIST='' names no host"),
    ({'SLURM_PROCID': '0', 'SLURM_NTASKS': '1', 'SLURM_JOB_NODELIST': 'n[]'},
     "SLURM_JOB_NODELIST='n[]' has a malformed"),
    ({'SLURM_PROCID': '0', 'SLURM_NTASKS': '1', 'SLURM_NODELIST': 'n[1-2'}, "SLURM_NODELIST='n[1-2' has a malformed"),
])
def test_slurm_malformed(env, name):
  _raises(name, env=env)


# --- local ---------------------------------------------------------------------------------------------


def test_local_with_injected_port():
  assert resolve(env={}, free_port=lambda: 4242) == Wiring(0, 1, '127.0.0.1:4242', 'local')


def test_local_default_free_port_is_usable():
  wiring = resolve(env={})
  host, port = wiring.server_addr.rsplit(':', 1)
  assert (wiring.host_idx, wiring.num_hosts, wiring.source, host) == (0, 1, 'local', '127.0.0.1')
  assert 1 <= int(port) <= 65535
  with socket.socket() as s:  # free right now: a coordinator could bind it
    s.bind(('127.0.0.1', int(port)))


def test_default_env_is_os_environ(monkeypatch):
  for name in list(os.environ):
    if name.startswith(('MEGASCALE_', 'TPU_WORKER_', 'SLURM_', 'GCE_METADATA')):
      monkeypatch.delenv(name)
  monkeypatch.setenv('SLURM_PROCID', '1')
  monkeypatch.setenv('SLURM_NTASKS', '2')
  monkeypatch.setenv('SLURM_JOB_NODELIST', 'envhost')
  assert resolve() == Wiring(1, 2, 'envhost:8476', 'slurm')


@pytest.mark.parametrize('port', [0, 65536, -1, '8476', True])
def test_bad_port(port):
  assert _raises('port=', env={}, port=port).startswith(f'port={port!r} is invalid')


# --- check_mesh ------------------------------------------------------------------------------------------


@pytest.mark.parametrize('num_hosts, devices_per_host, ici, dcn', [
    (2, 1, [1, 1, 1], [2, 1, 1]),
    (4, 1, [1, 2, 1], [2, 1, 1]),
    (1, 8, [1, 8, 1], None),
    (4, 4, [1, 4, 2], [2, 1, 1]),
])
def test_check_mesh_ok(num_hosts, devices_per_host, ici, dcn):
  assert check_mesh(num_hosts=num_hosts, ici_mesh_shape=ici, dcn_mesh_shape=dcn,
                    devices_per_host=devices_per_host) is None


@pytest.mark.parametrize('num_hosts, devices_per_host, ici, dcn, fragment', [
    (2, 1, [1, 1, 1], None, 'ICI_MESH_SHAPE=[1, 1, 1] x DCN_MESH_SHAPE=[1, 1, 1] needs 1 devices but num_hosts=2'),
    (4, 1, [1, 2, 1], [1, 1, 1], 'needs 2 devices but num_hosts=4 x 1 devices per host = 4'),
    (2, 4, [1, 2, 1], [4, 1, 1], 'DCN_MESH_SHAPE=[4, 1, 1] makes 4 slices, which does not divide num_hosts=2'),
    (3, 2, [1, 3, 1], [2, 1, 1], 'makes 2 slices, which does not divide num_hosts=3'),
    (1, 1, [1, 0, 1], None, 'ICI_MESH_SHAPE=[1, 0, 1] is invalid'),
    (1, 1, [1, 1, 1], 2, 'DCN_MESH_SHAPE=2 is invalid'),
    (1, 0, [1, 1, 1], None, 'devices_per_host=0 is invalid'),
])
def test_check_mesh_mismatch(num_hosts, devices_per_host, ici, dcn, fragment):
  with pytest.raises(WiringError) as info:
    check_mesh(num_hosts=num_hosts, ici_mesh_shape=ici, dcn_mesh_shape=dcn,
               devices_per_host=devices_per_host)
  assert '\n' not in str(info.value)
  assert fragment in str(info.value)


def test_default_port():
  assert DEFAULT_PORT == 8476


def test_free_loopback_ports_are_not_handed_out_twice_on_one_machine(tmp_path, monkeypatch):
  """The kernel gave two jobs starting in the same second the same free port; the record held here for
  `_PORT_HOLD_SECS` keeps any process on this machine from getting it again meanwhile."""
  monkeypatch.setattr(hosts.tempfile, 'gettempdir', lambda: str(tmp_path))
  ports = [hosts.free_loopback_port() for _ in range(30)]
  assert len(set(ports)) == 30
  record = tmp_path / 'pax-autockpt-ports' / str(ports[0])
  assert record.exists() and not hosts._hold(str(record))  # pylint: disable=protected-access
  old = time.time() - hosts._PORT_HOLD_SECS - 1  # pylint: disable=protected-access
  os.utime(record, (old, old))
  assert hosts._hold(str(record))  # pylint: disable=protected-access  (its time is up: taken over)
  assert not hosts._hold(str(record))  # pylint: disable=protected-access
