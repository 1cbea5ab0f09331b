"""`comet trace replay` refuses a trace whose ops have no measured duration (it would report a 0 ms step)
and names the collectives whose sizes it cannot cost."""

from pathlib import Path

import pytest

from comet.cli import main

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


@pytest.mark.parametrize("trace,sized", [("pytorch_et/resnet_2gpu_et.json.gz", "21 communication ops"),
                                         ("chakra_et/astra_sim_all_reduce_8npus_1MB", "8 communication ops")])
def test_untimed_trace_is_refused_with_a_reason(trace, sized, capsys):
    path = SHARED / trace
    if not path.exists():
        pytest.skip(f"{path} not found (../shared/traces is the shared trace folder)")
    assert main(["trace", "replay", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no op has a measured duration" in err and sized in err
