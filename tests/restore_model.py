"""A reference model of what a job's line of training IS, and which states a restart may resume: pure Python, no
product code. The stateful test (tests/test_restore_model.py) replays the same history on disk through the product
and checks the product's restore choice against this model.

Every state a run reaches and saves (a job-directory checkpoint, a local step, or both at one step) is a node
with its parent, the state it trained on from. A run trains one line: each node it saves is the child of the
previous one (or of the state it restored). What the model answers:
- `allowed(node)`: whether a restart may resume that state: it is this job's; it is the job directory's newest
  checkpoint, or a local state every host holds a copy of (its own, or the buddy copy a neighbour keeps), at
  least as new as that checkpoint and grown from it; and no rollback discarded it.
- a rollback: the user deletes checkpoint C (no run live, no `deleted` record), or a tool rewrites it. It
  discards every state that shares C's training past A, the newest checkpoint of C's line still in the job
  directory, committed or set aside (None: every state of C's line). Deletions by the preservation policy
  (recorded) are no rollback.
- `newest()`: the allowed state of the highest step (the one a restart must resume).
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Node:
  id: int
  step: int
  parent: int | None
  job: str = 'this'


class Model:
  """The truth of one job directory and its hosts' local tiers (see the module docstring)."""

  def __init__(self, hosts: int):
    self.hosts = hosts
    self.nodes: dict[int, Node] = {}
    self.ckpts: dict[int, int] = {}  # step -> node, committed in the job directory
    self.aside: dict[int, int] = {}  # step -> node, set aside as damaged (its state was sound before)
    self.local: list[dict[int, int]] = [{} for _ in range(hosts)]  # host -> step -> node: whole own copies
    self.buddy: list[dict[int, int]] = [{} for _ in range(hosts)]  # host -> step -> node: kept for host + 1
    self.marks: list[tuple[int, int | None]] = []  # (deleted checkpoint, the state the rollback kept)

  def new(self, step: int, parent: int | None, job: str = 'this') -> int:
    node = Node(len(self.nodes), step, parent, job)
    self.nodes[node.id] = node
    return node.id

  def line(self, node: int | None) -> list[int]:
    """The node and its ancestors, newest first."""
    out = []
    while node is not None:
      out.append(node)
      node = self.nodes[node].parent
    return out

  def lca(self, a: int | None, b: int | None) -> int | None:
    mine = set(self.line(a))
    return next((n for n in self.line(b) if n in mine), None)

  def newest_ckpt(self) -> int | None:
    return self.ckpts[max(self.ckpts)] if self.ckpts else None

  def delete_by_user(self, step: int) -> None:
    """A rollback (or a tool's rewrite, which calls this first): checkpoint `step` is gone with no record."""
    gone = self.ckpts.pop(step)
    self.mark(gone)

  def mark(self, gone: int) -> None:
    there = {*self.aside.values(), *self.ckpts.values()}
    kept = next((n for n in self.line(gone)[1:] if n in there), None)
    self.marks.append((gone, kept))

  def discarded(self, node: int) -> bool:
    for gone, kept in self.marks:
      shared = self.lca(node, gone)
      if shared is not None and shared != kept and (kept is None or kept in self.line(shared)):
        return True
    return False

  def held(self, node: int, step: int) -> bool:
    """Every host has a copy of its share of `node` at `step`: its own, or the buddy copy its neighbour keeps."""
    return all(self.local[h].get(step) == node or self.buddy[(h - 1) % self.hosts].get(step) == node
               for h in range(self.hosts))

  def allowed(self, node: int | None) -> bool:
    newest = self.newest_ckpt()
    if node is None:
      return newest is None
    n = self.nodes[node]
    if n.job != 'this' or self.discarded(node):
      return False
    if node == newest:
      return True
    if not self.held(node, n.step):
      return False
    return newest is None or (n.step >= self.nodes[newest].step and newest in self.line(node))

  def candidates(self) -> set[int]:
    found = {n for copies in (*self.local, *self.buddy) for n in copies.values()}
    return {n for n in found | set(self.ckpts.values()) if self.allowed(n)}

  def newest(self) -> int | None:
    """The state a restart must resume (None: a fresh start)."""
    found = self.candidates()
    return max(found, key=lambda n: self.nodes[n].step) if found else None
