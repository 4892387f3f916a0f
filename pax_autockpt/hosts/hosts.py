"""Host wiring for `jax.distributed.initialize`: which host this is, how many, and the coordinator.

Sources, first that applies wins: explicit flags, TPU multislice (MEGASCALE_*, from the environment
or, on a TPU VM created through queued resources, from the metadata server's `tpu-env` attribute, as
JAX reads them), a single TPU slice (GKE env vars or the TPU VM metadata server), Slurm, and finally a
local single host. A source is never completed from another one: a half-given source is an error.
The metadata server is asked again after a failure that a retry can cure, for up to
`METADATA_RETRY_SECS`; then `MetadataUnavailable` (exit 1: not bad configuration).
"""

import dataclasses
import http.client
import ipaddress
import math
import os
import re
import socket
import tempfile
import time
from typing import Callable, Mapping, Sequence
import urllib.error
import urllib.request

from absl import logging
import yaml

from pax_autockpt.shared import failures

DEFAULT_PORT = 8476
SOURCES = ('explicit', 'tpu-multislice', 'tpu', 'slurm', 'local')

_MEGASCALE = ('MEGASCALE_COORDINATOR_ADDRESS', 'MEGASCALE_NUM_SLICES', 'MEGASCALE_SLICE_ID')
_EXPLICIT_FIX = 'pass --host_idx/--num_hosts/--server_addr'
# A TPU device means a TPU VM, so the metadata server is there to ask.
_TPU_DEVICES = ('/dev/accel0', '/dev/vfio/0')
_DEFAULT_METADATA_HOST = 'metadata.google.internal'
_METADATA_TIMEOUT_SECS = 2.0
METADATA_RETRY_SECS = 30.0


class WiringError(ValueError):
  """A one-line message naming the flag or environment variable that is wrong and how to fix it."""


class MetadataUnavailable(WiringError):
  """The TPU metadata server did not answer for METADATA_RETRY_SECS: a failure, not bad configuration."""


@dataclasses.dataclass(frozen=True)
class Wiring:
  """This process's place among the hosts, and where the coordinator listens."""

  host_idx: int
  num_hosts: int
  server_addr: str  # "host:port"
  source: str  # one of SOURCES

  def line(self) -> str:
    """One log line with every field."""
    return (f'host_idx={self.host_idx} num_hosts={self.num_hosts} '
            f'server_addr={self.server_addr} source={self.source}')


def resolve(*,
            host_idx: int | None = None,
            num_hosts: int | None = None,
            server_addr: str | None = None,
            env: Mapping[str, str] | None = None,
            port: int | None = None,
            metadata_host: str | None = None,
            free_port: Callable[[], int] | None = None) -> Wiring:
  """The wiring from the first source that applies; raises WiringError when that source is bad."""
  env = os.environ if env is None else env
  if (host_idx, num_hosts, server_addr) != (None, None, None):
    return _explicit(host_idx, num_hosts, server_addr)
  port = DEFAULT_PORT if port is None else _check_port(port)
  env = _with_tpu_env(env, metadata_host)
  if any(name in env for name in _MEGASCALE):
    return _multislice(env, port, metadata_host)
  worker = _tpu_worker(env, metadata_host)
  if worker is not None:
    worker_id, hosts = worker
    return Wiring(worker_id, len(hosts), _join(hosts[0], port), 'tpu')
  if 'SLURM_PROCID' in env:
    return _slurm(env, port)
  return Wiring(0, 1, f'127.0.0.1:{(free_port or free_loopback_port)()}', 'local')


def check_mesh(*, num_hosts: int, devices_per_host: int, ici_mesh_shape: Sequence[int],
               dcn_mesh_shape: Sequence[int] | None) -> None:
  """Raises WiringError unless num_hosts x devices_per_host = prod(ICI) x prod(DCN) and the DCN
  product (the number of slices) divides num_hosts, so that each slice holds whole hosts.
  `dcn_mesh_shape` None means [1, 1, 1]."""
  dcn_mesh_shape = [1, 1, 1] if dcn_mesh_shape is None else dcn_mesh_shape
  ici = _mesh_product('ICI_MESH_SHAPE', ici_mesh_shape)
  dcn = _mesh_product('DCN_MESH_SHAPE', dcn_mesh_shape)
  if not _is_int(devices_per_host) or devices_per_host < 1:
    raise WiringError(f'devices_per_host={devices_per_host!r} is invalid: it must be an integer >= 1')
  have = num_hosts * devices_per_host
  if ici * dcn != have:
    raise WiringError(
        f'ICI_MESH_SHAPE={list(ici_mesh_shape)} x DCN_MESH_SHAPE={list(dcn_mesh_shape)} needs {ici * dcn} '
        f'devices but num_hosts={num_hosts} x {devices_per_host} devices per host = {have}: '
        f'make the product of both mesh shapes {have}, or change the number of hosts')
  if num_hosts % dcn:
    raise WiringError(
        f'DCN_MESH_SHAPE={list(dcn_mesh_shape)} makes {dcn} slices, which does not divide '
        f'num_hosts={num_hosts}: each slice must hold whole hosts, so use a DCN product '
        f'that divides {num_hosts}')


# --- sources ---------------------------------------------------------------------------------


def _explicit(host_idx, num_hosts, server_addr) -> Wiring:
  """All three flags, validated; some but not all is an error rather than a mix with another source."""
  given = {'--host_idx': host_idx, '--num_hosts': num_hosts, '--server_addr': server_addr}
  missing = [name for name, value in given.items() if value is None]
  if missing:
    present = [name for name in given if name not in missing]
    verb = 'was' if len(present) == 1 else 'were'
    raise WiringError(f'{"/".join(present)} {verb} given without {"/".join(missing)}: '
                      'pass all three, or none to derive them')
  if not _is_int(num_hosts) or num_hosts < 1:
    raise WiringError(f'--num_hosts={num_hosts!r} is invalid: it must be an integer >= 1')
  if not _is_int(host_idx):
    raise WiringError(f'--host_idx={host_idx!r} is invalid: it must be an integer 0..{num_hosts - 1}')
  if not 0 <= host_idx < num_hosts:
    raise WiringError(f'--host_idx={host_idx!r} is out of range for --num_hosts={num_hosts}: '
                      f'it must be 0..{num_hosts - 1}')
  _split_addr('--server_addr', server_addr)
  return Wiring(host_idx, num_hosts, server_addr, 'explicit')


def _multislice(env, port, metadata_host) -> Wiring:
  """Slices of whole TPU hosts: host index counts slice by slice."""
  missing = [name for name in _MEGASCALE if name not in env]
  if missing:
    present = [name for name in _MEGASCALE if name in env]
    raise WiringError(f'{"/".join(present)} is set but {"/".join(missing)} is not: set all of '
                      f'{", ".join(_MEGASCALE)} for a multislice job, or none of them')
  slice_id, num_slices = _index_in_count(env, 'MEGASCALE_SLICE_ID', 'MEGASCALE_NUM_SLICES')
  # Any port there belongs to the megascale service, not to jax.distributed.
  coordinator = _addr_host('MEGASCALE_COORDINATOR_ADDRESS', env['MEGASCALE_COORDINATOR_ADDRESS'])
  worker = _tpu_worker(env, metadata_host)
  if worker is None:
    raise WiringError('MEGASCALE_* is set but TPU_WORKER_ID/TPU_WORKER_HOSTNAMES are not and no TPU metadata '
                      'server is known: set both (or GCE_METADATA_HOST), or ' + _EXPLICIT_FIX)
  worker_id, hosts = worker
  return Wiring(slice_id * len(hosts) + worker_id, num_slices * len(hosts), _join(coordinator, port),
                'tpu-multislice')


def _tpu_worker(env, metadata_host) -> tuple[int, list[str]] | None:
  """(worker id, slice's worker hosts) from GKE env vars or the metadata server; None when neither applies."""
  if 'TPU_WORKER_ID' in env or 'TPU_WORKER_HOSTNAMES' in env:
    return _worker_from_env(env)
  host = _metadata_host(env, metadata_host)
  return None if host is None else _worker_from_metadata(host)


def _with_tpu_env(env, metadata_host) -> Mapping[str, str]:
  """The environment, with MEGASCALE_* from the TPU VM's `tpu-env` metadata attribute where the
  environment has none of them (queued-resource multislice: JAX reads them there too)."""
  if any(name in env for name in _MEGASCALE):
    return env
  host = _metadata_host(env, metadata_host)
  text = None if host is None else _fetch(host, 'tpu-env', missing_ok=True)
  if not text:
    return env
  try:
    values = yaml.safe_load(text)
  except yaml.YAMLError as e:
    raise WiringError(f'TPU metadata server {host} returned a tpu-env that is not YAML ({_one_line(e)}): '
                      + _EXPLICIT_FIX) from None
  found = {k: str(v) for k, v in (values or {}).items() if k in _MEGASCALE} if isinstance(values, dict) else {}
  return {**found, **env} if found else env


def _worker_from_env(env) -> tuple[int, list[str]]:
  """GKE style: TPU_WORKER_ID and comma-separated TPU_WORKER_HOSTNAMES, both required."""
  for name, other in (('TPU_WORKER_ID', 'TPU_WORKER_HOSTNAMES'), ('TPU_WORKER_HOSTNAMES', 'TPU_WORKER_ID')):
    if other not in env:
      raise WiringError(f'{name} is set but {other} is not: set both, or neither to ask the TPU metadata server')
  hosts = _host_list('TPU_WORKER_HOSTNAMES', env['TPU_WORKER_HOSTNAMES'])
  worker_id = _env_int(env, 'TPU_WORKER_ID')
  if not 0 <= worker_id < len(hosts):
    raise WiringError(f'TPU_WORKER_ID={worker_id} is out of range for {len(hosts)} TPU_WORKER_HOSTNAMES: '
                      f'it must be 0..{len(hosts) - 1}')
  return worker_id, hosts


def _metadata_host(env, metadata_host) -> str | None:
  """Where to ask, or None when this is no TPU VM: never probe the network on a guess."""
  if metadata_host:
    return metadata_host
  if env.get('GCE_METADATA_HOST'):
    return env['GCE_METADATA_HOST']
  if any(os.path.exists(path) for path in _TPU_DEVICES):
    return _DEFAULT_METADATA_HOST
  return None


def _worker_from_metadata(host: str) -> tuple[int, list[str]]:
  """The Cloud TPU VM's agent-worker-number and worker-network-endpoints attributes."""
  where = f'TPU metadata server {host}'
  number = _fetch(host, 'agent-worker-number')
  if not re.fullmatch(r'\s*\d+\s*', number):
    raise WiringError(f'{where} returned agent-worker-number={_one_line(number)!r}, not an integer: '
                      + _EXPLICIT_FIX)
  worker_id = int(number)
  endpoints = _fetch(host, 'worker-network-endpoints')
  # Entries are "a:b:IP"; the IP is the last field.
  hosts = [entry.strip().rsplit(':', 1)[-1].strip() for entry in endpoints.split(',')]
  if not endpoints.strip() or not all(hosts):
    raise WiringError(f'{where} returned worker-network-endpoints={_one_line(endpoints)!r} with an empty entry: '
                      + _EXPLICIT_FIX)
  if worker_id >= len(hosts):
    raise WiringError(f'{where} returned agent-worker-number={worker_id}, out of range for {len(hosts)} '
                      f'worker-network-endpoints: it must be 0..{len(hosts) - 1}; {_EXPLICIT_FIX}')
  return worker_id, hosts


def _fetch(host: str, attribute: str, missing_ok: bool = False) -> str | None:
  """One instance attribute (None for a 404 with `missing_ok`), asked again along
  failures.backoff(METADATA_RETRY_SECS) after a failure a retry can cure; a WiringError naming the host
  otherwise, MetadataUnavailable once the retries are spent."""
  url = f'http://{host}/computeMetadata/v1/instance/attributes/{attribute}'
  request = urllib.request.Request(url, headers={'Metadata-Flavor': 'Google'})
  # The metadata server is link-local: an http_proxy from the environment must not route it.
  opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
  fix = f'set TPU_WORKER_ID/TPU_WORKER_HOSTNAMES or GCE_METADATA_HOST, or {_EXPLICIT_FIX}'
  for pause in [*failures.backoff(METADATA_RETRY_SECS), None]:
    try:
      with opener.open(request, timeout=_METADATA_TIMEOUT_SECS) as response:
        return response.read().decode('utf-8', 'replace')
    # URLError, HTTPError and timeouts are OSErrors; a garbled reply is an HTTPException.
    except (OSError, ValueError, http.client.HTTPException) as e:
      if missing_ok and isinstance(e, urllib.error.HTTPError) and e.code == 404:
        return None
      if not _retryable(e):
        raise WiringError(f'TPU metadata server {host} did not give {attribute} ({_one_line(e)}): {fix}') from None
      if pause is None:
        raise MetadataUnavailable(f'TPU metadata server {host} did not give {attribute} for '
                                  f'{METADATA_RETRY_SECS:g} s ({_one_line(e)}): retry, or {fix}') from None
      time.sleep(pause)
  raise AssertionError('unreachable')


def _retryable(error: BaseException) -> bool:
  """A server error, throttling, a timeout or a refused or reset connection; not a 4xx answer."""
  if isinstance(error, urllib.error.HTTPError):
    return error.code >= 500 or error.code == 429
  return isinstance(error, (OSError, http.client.HTTPException))


def _slurm(env, port) -> Wiring:
  """One task per host: SLURM_PROCID of SLURM_NTASKS, coordinator on the job's first node."""
  nodelist_name = next((n for n in ('SLURM_JOB_NODELIST', 'SLURM_NODELIST') if n in env), None)
  missing = [n for n in ('SLURM_NTASKS',) if n not in env] + ([] if nodelist_name else ['SLURM_JOB_NODELIST'])
  if missing:
    raise WiringError(f'SLURM_PROCID is set but {"/".join(missing)} is not: run under srun (one task per host), '
                      'or ' + _EXPLICIT_FIX)
  proc_id, num_tasks = _index_in_count(env, 'SLURM_PROCID', 'SLURM_NTASKS')
  host = _first_slurm_host(nodelist_name, env[nodelist_name])
  return Wiring(proc_id, num_tasks, _join(host, port), 'slurm')


def _first_slurm_host(name: str, nodelist: str) -> str:
  """The first host of Slurm's compressed list: "node[001-004,007],gpu2" -> "node001"."""
  host, rest = '', nodelist.strip()
  while rest and rest[0] != ',':
    plain = re.match(r'[^,\[\]]+', rest)
    if plain:
      host, rest = host + plain.group(), rest[plain.end():]
      continue
    group = re.match(r'\[([^\[\]]*)\]', rest)
    first = group and group.group(1).split(',')[0].split('-')[0].strip()
    if not first:
      raise WiringError(f'{name}={nodelist!r} has a malformed [...] range: expected e.g. "node[001-004,007]"')
    host, rest = host + first, rest[group.end():]
  if not host:
    raise WiringError(f'{name}={nodelist!r} names no host: expected e.g. "node[001-004]" or "host1,host2"')
  return host


# --- the address a host serves its peers on ----------------------------------------------------------


def own_address(coordinator: str | None) -> str:
  """The address this host's peers reach it on (the local tier's peer and buddy servers): the interface its
  route to the job's coordinator ("host:port", as jax.distributed was given it) leaves from.
  Where that route is loopback but the coordinator is named (host 0 where /etc/hosts maps its own name to
  127.0.1.1, as Debian and many Slurm nodes do: the other machines reach that name elsewhere), the interface
  of the default route, else 127.0.0.1 in one line. 127.0.0.1 for a coordinator on loopback (every host on
  this machine) or none."""
  if not coordinator:
    return '127.0.0.1'
  host, _, port = coordinator.rpartition(':')
  host = host.strip('[]')
  found = _route_from(host, int(port))
  if found is not None and not _loopback(found):
    return found
  if _loopback(host) or host == 'localhost':
    return '127.0.0.1'
  found = _route_from(*_OUTSIDE)
  if found is not None and not _loopback(found):
    return found
  logging.warning('[autockpt] local tier: the coordinator %s is on loopback here and this host has no other '
                  'route: it serves its local steps on 127.0.0.1, which no other machine reaches.', coordinator)
  return '127.0.0.1'


_OUTSIDE = ('203.0.113.1', 9)  # a documentation address (never a host): its route is the default route


def _route_from(host: str, port: int) -> str | None:
  """The local address a datagram to (host, port) would leave from (a UDP socket's connect sends nothing);
  None when there is no route or the name does not resolve."""
  try:
    with socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET, socket.SOCK_DGRAM) as probe:
      probe.connect((host, port))
      return probe.getsockname()[0]
  except OSError:
    return None


def _loopback(address: str) -> bool:
  try:
    return ipaddress.ip_address(address).is_loopback
  except ValueError:
    return False  # a name


# --- values ----------------------------------------------------------------------------------


_PORT_HOLD_SECS = 300  # a port handed out here is not handed out again on this machine for this long


def free_loopback_port() -> int:
  """A port the kernel just handed out on loopback, where the local coordinator listens, and that no other
  process on this machine got from here in the last `_PORT_HOLD_SECS`. The kernel may give two processes the
  same free port in a row (seen: two jobs starting in the same second both got 45029; the second one's
  client then joined the first one's coordinator, and both died), since the port is free until JAX binds it
  seconds later. A file per port in the temp directory, created exclusively, is the machine-wide record."""
  held = os.path.join(tempfile.gettempdir(), 'pax-autockpt-ports')
  os.makedirs(held, exist_ok=True)
  for _ in range(64):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
      s.bind(('127.0.0.1', 0))
      port = s.getsockname()[1]
    if _hold(os.path.join(held, str(port))):
      return port
  return port  # every try was held recently: the kernel's word alone


def _hold(path: str) -> bool:
  """Claims the record at `path`: True if nobody holds it, or its holder's time is up."""
  try:
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    return True
  except FileExistsError:
    try:
      if time.time() - os.stat(path).st_mtime < _PORT_HOLD_SECS:
        return False
      os.utime(path)  # two processes may both take over a stale record here: as rare as before, no worse
      return True
    except OSError:
      return False
  except OSError:
    return True  # no writable temp directory: the kernel's word alone


def _check_port(port) -> int:
  """The coordinator port for derived sources, 1..65535."""
  if not _is_int(port) or not 1 <= port <= 65535:
    raise WiringError(f'port={port!r} is invalid: use a coordinator port 1..65535, or None for {DEFAULT_PORT}')
  return port


def _split_addr(name: str, addr) -> tuple[str, int]:
  """host:port with a non-empty host (IPv4, hostname or [IPv6]) and a port 1..65535."""
  fix = 'use host:port, e.g. 10.0.0.2:8476 or [::1]:8476'
  if not isinstance(addr, str):
    raise WiringError(f'{name}={addr!r} is invalid: {fix}')
  bracketed = re.fullmatch(r'\[([^\[\]]*)\]:(\d+)', addr)
  if bracketed:
    host, port = bracketed.groups()
    if not _is_ipv6(host):
      raise WiringError(f'{name}={addr!r} has no valid IPv6 address in brackets: {fix}')
  else:
    host, sep, port = addr.rpartition(':')
    if not sep or not port.isdigit():
      raise WiringError(f'{name}={addr!r} has no port: {fix}')
    if not host or not re.fullmatch(r'[A-Za-z0-9._-]+', host):
      raise WiringError(f'{name}={addr!r} has {"no" if not host else "an invalid"} host: {fix} '
                        '(IPv6 goes in brackets)')
  if not 1 <= int(port) <= 65535:
    raise WiringError(f'{name}={addr!r} has port {int(port)}, out of range: use a port 1..65535')
  return host, int(port)


def _addr_host(name: str, addr: str) -> str:
  """The host of "host", "host:port", "[v6]:port" or a bare IPv6 address."""
  addr = addr.strip()
  bracketed = re.fullmatch(r'\[([^\[\]]*)\](?::\d*)?', addr)
  if bracketed:
    host = bracketed.group(1)
  elif _is_ipv6(addr):
    host = addr
  else:
    host = addr.partition(':')[0] if addr.count(':') == 1 else addr
  if not host or not (_is_ipv6(host) or re.fullmatch(r'[A-Za-z0-9._-]+', host)):
    raise WiringError(f'{name}={addr!r} has no valid host: use host or host:port, e.g. 10.0.0.2')
  return host


def _join(host: str, port: int) -> str:
  """host:port, bracketing IPv6 so the port stays unambiguous."""
  return f'[{host}]:{port}' if ':' in host else f'{host}:{port}'


def _host_list(name: str, value: str) -> list[str]:
  """Comma-separated hosts, none empty."""
  hosts = [h.strip() for h in value.split(',')]
  if not value.strip() or not all(hosts):
    raise WiringError(f'{name}={value!r} has an empty entry: use comma-separated hosts, e.g. 10.0.0.2,10.0.0.3')
  return hosts


def _index_in_count(env, index_name: str, count_name: str) -> tuple[int, int]:
  """(index, count) from two environment variables: count >= 1 and 0 <= index < count."""
  count = _env_int(env, count_name)
  if count < 1:
    raise WiringError(f'{count_name}={count} is invalid: it must be >= 1')
  index = _env_int(env, index_name)
  if not 0 <= index < count:
    raise WiringError(f'{index_name}={index} is out of range for {count_name}={count}: '
                      f'it must be 0..{count - 1}')
  return index, count


def _env_int(env, name: str) -> int:
  """An integer environment variable (plain digits: int() would also take "1_0")."""
  value = env[name]
  if not re.fullmatch(r'\s*-?\d+\s*', value):
    raise WiringError(f'{name}={value!r} is not an integer: set it to a plain integer, or unset it')
  return int(value)


def _mesh_product(name: str, shape) -> int:
  """The device count of a mesh shape of positive integers."""
  try:
    ok = not isinstance(shape, (str, bytes)) and all(_is_int(d) and d >= 1 for d in shape)
  except TypeError:  # not iterable
    ok = False
  if not ok:
    raise WiringError(f'{name}={shape!r} is invalid: use a list of integers >= 1, e.g. [1, 2, 1]')
  return math.prod(shape)


def _is_int(value) -> bool:
  """An int that is not a bool."""
  return isinstance(value, int) and not isinstance(value, bool)


def _is_ipv6(text: str) -> bool:
  """Whether text is an IPv6 address (no brackets)."""
  try:
    ipaddress.IPv6Address(text)
    return True
  except ValueError:
    return False


def _one_line(value) -> str:
  """Text squeezed onto one line, short enough for an error message."""
  text = ' '.join(str(value).split())
  return text if len(text) <= 200 else text[:197] + '...'
