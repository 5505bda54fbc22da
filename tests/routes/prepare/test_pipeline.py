"""prepare is a pipeline of named steps (routes/prepare/pipeline.py STEPS): they run in order and the last
one leaves a complete plan; describe_steps prints the list."""

from trtattn.routes.prepare import STEPS, Step, describe, describe_steps, prepare
from trtattn.testing.graphs import attention_model


def test_prepare_runs_its_named_steps_in_order_and_returns_a_complete_plan():
    ran = []

    def recorded(step):
        def run(work):
            ran.append(step.name)
            step.run(work)
        return Step(step.name, run)

    prepared = prepare(attention_model(), name="one", precision="fp32", decomposable=True,
                       steps=tuple(recorded(s) for s in STEPS))
    assert ran == [s.name for s in STEPS]
    plan = prepared.plan
    assert [a.site for a in plan.native] == [r.site.name for r in prepared.fused.reports]
    assert plan.inputs and plan.outputs and plan.profiles and plan.limits.max_positions
    assert prepared.cut.model is not None and prepared.verification.passed is not False
    assert "build plan for one: 1 IAttention" in describe(plan)


def test_describe_steps_numbers_every_step():
    lines = describe_steps().splitlines()
    assert [line.split(". ", 1)[1] for line in lines] == [s.name for s in STEPS]
    assert lines[0].strip().startswith("1. ") and len(lines) == len(STEPS)
