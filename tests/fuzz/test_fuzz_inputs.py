"""Property-based fuzzing (hypothesis) of every input kind, mutating the real input files: each
mutated input is run through the CLI in a forked child with a time bound, and must end with exit 0, 1
or 2, no traceback, and no garbage accepted (tests/fuzz/corpus.py defines the checks). `make fuzz` runs
the same generators over a corpus of ~1,000 inputs; this suite keeps a few per kind so `make test` stays
quick."""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402

TIME_BOUND_S = 60.0
# examples per kind: bounded so the whole suite takes well under a minute on an idle machine
EXAMPLES = {"search space": 3, "cluster spec": 6, "model YAML": 6, "estimate flags": 8, "measurement CSV": 6,
            "traces": 6, "output paths": 6}


@pytest.fixture(scope="module", autouse=True)
def _imported_cli():
    import comet.cli
    comet.cli.build_parser()          # import every subcommand before forking children


def _check(kind: str, seed: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="comet-hyp-"))
    try:
        cases = corpus.KINDS[kind](1, random.Random(seed), work)
        if not cases:
            pytest.skip(f"{kind}: seed files under ../shared are missing")
        for case in cases:
            out = corpus.run_case(case, TIME_BOUND_S, work)
            assert out.verdict == "ok" and out.code in (0, 1, 2), (
                f"{kind} seed {seed}: {out.verdict} (exit {out.code}) for {case.mutation} — {out.detail}; "
                f"argv {case.argv}")
    finally:
        ro = work / "readonly"
        for p in work.rglob("readonly"):
            p.chmod(0o755)
        shutil.rmtree(work, ignore_errors=True)
        del ro


@pytest.mark.parametrize("kind", list(EXAMPLES))
def test_mutated_inputs_never_crash_hang_or_pass_garbage(kind):
    @settings(max_examples=EXAMPLES[kind], deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(seed=st.integers(min_value=0, max_value=2**32 - 1))
    def run(seed):
        _check(kind, seed)

    run()
