"""codegen.plan.plan_from_program keeps the program's issue order (a CPU test; codegen/ is not edited here)."""
from __future__ import annotations

from strategies import tiny_hw
from test_schedule_checks import fa_program

from codegen.plan import plan_from_program
from ptsolve.ir import Edge, STask, STaskGraph
from ptsolve.program import make_program


def test_plan_keeps_each_roles_issue_order() -> None:
    p, hw = fa_program()
    plan = plan_from_program(p, hw)
    streams = p.streams(hw)
    base = min(s for ops in streams["loop"].values() for _, s in ops)
    for ph, roles in streams.items():
        for role, ops in roles.items():
            assert plan.order[ph][role] == [(t, s - (base if ph == "loop" else 0)) for t, s in ops]
    # FA's consumer order is QK, softmax, PV: not alphabetical, so a sorted order would differ
    wg0 = [t for t, _ in plan.order["loop"]["wg0"]]
    assert wg0 != sorted(wg0) and wg0[0] == "mma_qk@0" and wg0[-1] == "mma_pv@0"


def test_plan_order_by_hand() -> None:
    # three tasks on one warpgroup, named against their issue order: z at 0, m at 8, a at 16 (ii = 24)
    hw = tiny_hw(sms=1)
    tasks = (STask("z", "vector", flops=64, group=0), STask("m", "vector", flops=64, group=0),
             STask("a", "vector", flops=64, group=0))
    g = STaskGraph("order", "test", {}, {"depth": 1, "groups": 1}, tasks, (Edge("z", "m"), Edge("m", "a")), (2,), 1, 1)
    p = make_program(g, hw, 24, {"z": 0, "m": 8, "a": 16})
    plan = plan_from_program(p, hw)
    assert plan.order["loop"] == {"wg0": [("z", 0), ("m", 0), ("a", 0)]}
    assert plan.ii == 24 and plan.tc_order == []
