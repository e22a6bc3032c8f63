"""Run the doctest examples of the functional core (every module of ldpstream.estimators)."""
import doctest
import importlib
import pkgutil

import pytest

import ldpstream.estimators as est

pytestmark = pytest.mark.core

MODULES = sorted(m.name for m in pkgutil.walk_packages(est.__path__, est.__name__ + "."))


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {name}"
