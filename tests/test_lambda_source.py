"""The fast lambda lookup gives fiddle what its own libcst lookup gives, or defers to it."""

import ast
import dataclasses

from fiddle._src.experimental import auto_config
import pytest

from pax_autockpt.startup import lambda_source

FIDDLE_LOOKUP = auto_config._getsource_for_lambda  # pylint: disable=protected-access

ONE_LINE = lambda: [-1, 1, -1]  # noqa: E731
PARENTHESIZED = (lambda x, y=2: x * y)  # noqa: E731
OVER_LINES = lambda: {  # noqa: E731
    'a': [1, 2],
    'b': (3,
          4),
}
NESTED = lambda: (lambda: 1)  # noqa: E731
TWO_ON_A_LINE = (lambda: 1, lambda: 2)


@dataclasses.dataclass
class _Holder:
  factory: object = dataclasses.field(default_factory=lambda: dict(a=1))


@pytest.mark.parametrize('fn', [ONE_LINE, OVER_LINES, _Holder.__dataclass_fields__['factory'].default_factory],
                         ids=['one_line', 'over_lines', 'default_factory'])
def test_same_text_as_fiddles_own_lookup(fn):
  assert lambda_source.source_of(fn) == FIDDLE_LOOKUP(fn)


def test_a_parenthesized_lambda_parses_to_the_same_tree():
  """libcst keeps the parentheses around the lambda, `ast` does not: fiddle parses either alike."""
  ours, theirs = lambda_source.source_of(PARENTHESIZED), FIDDLE_LOOKUP(PARENTHESIZED)
  assert theirs == f'({ours})'
  assert ast.dump(ast.parse(ours)) == ast.dump(ast.parse(theirs))


def test_a_line_with_several_lambdas_is_left_to_fiddle_and_its_error():
  assert lambda_source.source_of(NESTED) is None
  assert lambda_source.source_of(TWO_ON_A_LINE[0]) is None
  with pytest.raises(ValueError, match='multiple lambdas found on line'):
    FIDDLE_LOOKUP(TWO_ON_A_LINE[1])


def test_installed_lookup_serves_auto_config_and_falls_back(monkeypatch):
  monkeypatch.setattr(auto_config, '_getsource_for_lambda', FIDDLE_LOOKUP)
  lambda_source.install()
  lambda_source.install()  # twice: still one wrapper
  lookup = auto_config._getsource_for_lambda  # pylint: disable=protected-access
  assert lookup is not FIDDLE_LOOKUP and lookup.autockpt
  assert lookup(ONE_LINE) == 'lambda: [-1, 1, -1]'
  with pytest.raises(ValueError, match='multiple lambdas found on line'):
    lookup(TWO_ON_A_LINE[1])
  config = auto_config.auto_config(lambda: _Holder(factory=[1, 2])).as_buildable()
  assert config.factory == [1, 2] and config.__fn_or_cls__ is _Holder
