"""shared/values.py: the predicates every reader of outside values uses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shared.values import is_finite_number, is_int


@pytest.mark.parametrize("value, expected", [(0, True), (-3, True), (True, False), (False, False), (1.0, False),
                                             ("1", False), (None, False), (np.int64(1), False)])
def test_is_int(value, expected) -> None:
    assert is_int(value) is expected


@pytest.mark.parametrize("value, expected", [(0, True), (2.5, True), (-1e300, True), (np.float64(0.5), True),
                                             (True, False), (math.nan, False), (math.inf, False), (-math.inf, False),
                                             (10**400, False), ("1.0", False), (None, False), ([1.0], False)])
def test_is_finite_number(value, expected) -> None:
    assert is_finite_number(value) is expected
