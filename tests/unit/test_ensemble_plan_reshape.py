"""Triton's dims <-> reshape conversion of an ensemble's own inputs and outputs
(EnsemblePlan.input_shape / answer_shape, convert_dims)."""

from __future__ import annotations

from nursery.scheduling.ensemble_plan import EnsemblePlan, EnsembleStep, convert_dims


def test_convert_dims_fills_variable_dims_in_order() -> None:
    assert convert_dims((3, 8), (8,), (4, 1, 2), True) == (3, 4, 1, 2)
    assert convert_dims((3, 4, 1, 2), (4, 1, 2), (8,), True) == (3, 8)
    assert convert_dims((2, 2, 5), (2, -1), (-1, 2), True) == (2, 5, 2)
    assert convert_dims((5, 2), (-1, 2), (2, -1), False) == (2, 5)
    assert convert_dims((16,), (16,), (4, 4), False) == (4, 4)


def test_convert_dims_leaves_a_shape_that_does_not_fit() -> None:
    assert convert_dims((3, 7), (8,), (4, 2), True) == (3, 7)  # the count would change
    assert convert_dims((3, 2, 4), (8,), (4, 2), True) == (3, 2, 4)  # another rank
    assert convert_dims((3, 8), (-1,), (4, -1), True) == (3, 8)  # 4 x 8 is not 8


def test_plan_reshapes_its_inputs_and_answers() -> None:
    step = EnsembleStep("m", -1, {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})
    plan = EnsemblePlan.build("e", ["IN"], ["OUT"], [step]).shaped(
        True, {"OUT": (4, 2)}, [(True, {"INPUT0": (4, 2)})],
        input_reshape={"IN": ((8,), (4, 2))}, output_reshape={"OUT": ((4, 2), (8,))})
    assert plan.input_shape("IN", (5, 8)) == (5, 4, 2)
    assert plan.step_input_shape(0, "INPUT0", (5, 4, 2)) == (5, 4, 2)
    assert plan.answer_shape("OUT", (5, 4, 2)) == (5, 8)
    assert plan.input_shape("OTHER", (5, 8)) == (5, 8)  # no reshape: as it is
