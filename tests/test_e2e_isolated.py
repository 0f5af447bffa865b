"""An engine in a process of its own (spectest.e2e.isolated, spectest.e2e.zygote): crashes, aborts and hangs fail
only their own calls, a preloaded engine forks from its zygote, and the child's own time counts as its calls.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spectest import rules
from spectest.sampling_params import SamplingParams
from tests.engines import ENGINES
from tests.runner_helpers import run_pytest


@pytest.mark.cost(50)
def test_an_engine_that_crashes_aborts_or_hangs_in_its_own_process_fails_only_its_own_calls(tmp_path):
    """Engines run in a child process (spectest.e2e.isolated): a segmentation fault, an abort() and a
    hang in native code each fail the call they happen in, naming the signal or the limit; the next
    property starts a fresh child; an isolated exact engine beside them passes; every result is written."""
    crashing = ENGINES / "crashing.py"
    names = ["segfaults_on_second_call", "aborts_on_first_call", "hangs_on_first_call", "isolated_markov"]
    args = [a for name in names for a in ("--spec-engine", f"{crashing}:{name}")]
    run = run_pytest(
        [*args, "-n", "0", "--spec-budget", "quick", "--spec-timeout", "1", "-k", "same_seed or greedy"], tmp_path
    )
    greedy, output = "test_greedy_requests_equal_greedy_decoding", "test_same_seed_same_output"
    expected = {
        "segfaults_on_second_call": (rules.DOES_NOT_RAISE, "killed by signal SIGSEGV"),
        "aborts_on_first_call": (rules.DOES_NOT_RAISE, "killed by signal SIGABRT"),
        "hangs_on_first_call": (rules.RETURNS_IN_TIME, "did not return within"),
    }
    for name, (rule, text) in expected.items():
        for prop in (greedy, output):  # each property on a fresh child: the first crash did not end the run
            outcome = run.results[(f"crashing.py:{name}", prop)]
            assert outcome.failure == {"kind": "rule", "rule": rule} and text in outcome.text, run.explain(
                f"crashing.py:{name}", prop
            )
    for prop in (greedy, output):
        assert run.results[("crashing.py:isolated_markov", prop)].outcome == "passed", run.explain(
            "crashing.py:isolated_markov", prop
        )
    assert len(run.document["tests"]) == 8 and not run.document["harness_errors"]


def test_an_engine_with_a_preload_starts_as_a_fork_of_its_zygote_and_fails_as_a_spawned_one_does():
    """An engine that names a ``preload`` (vLLM's adapters: its imports are most of its start) starts as a
    fork of a zygote that ran it once. Its child must still be a child like any other: a segmentation
    fault names the signal, a hang is killed at the call's limit, and the next call starts a fresh fork
    of the same zygote, which then works."""
    from spectest.e2e.isolated import EngineDied, EngineHung, load_factory

    make = load_factory(f"{ENGINES / 'crashing.py'}:Forked")
    params = SamplingParams.build(1, temperature=[1.0])
    crashing, hanging = make("forked", fault="segfault", from_call=2), make("forked", fault="hang", from_call=1)
    try:
        assert crashing.vocab_size > 0
        zygote, first = crashing._process.zygote, crashing._process.pid
        assert zygote.prepare_error is None
        parent = int(Path(f"/proc/{first}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert parent == zygote.pid, (parent, zygote.pid)  # forked there, not spawned
        assert len(crashing.generate([[1, 2]], params, 3, 0)[0]) == 3
        with pytest.raises(EngineDied, match="killed by signal SIGSEGV"):
            crashing.generate([[1, 2]], params, 3, 0)
        assert len(crashing.generate([[1, 2]], params, 3, 0)[0]) == 3  # a fresh fork: its first call works
        assert crashing._process.pid != first and crashing._process.zygote is zygote
        with pytest.raises(EngineHung, match="within 1 s"):
            hanging.call("generate", [[1, 2]], params, 3, 0, seconds=1.0)
    finally:
        crashing.close()
        hanging.close()


def test_an_isolated_engines_own_cpu_time_counts_as_its_calls():
    """An engine in its own process works while this one waits: the run's clock (which the budget and
    the report's "implementation calls" read) must count the child's CPU, or a slow real engine never
    meets its budget and its time per token is reported as nearly nothing."""
    import time

    from spectest.e2e.isolated import load_factory
    from spectest.speed.clock import cpu_time

    engine = load_factory(f"{ENGINES / 'crashing.py'}:Isolated")("busy", fault="busy", from_call=1)
    try:
        assert engine.vocab_size > 0  # the child starts here, outside the measurement
        own, clock = time.process_time(), cpu_time()
        engine.target_logits([[1, 2, 3]])  # half a second of CPU in the child
        own, clock = time.process_time() - own, cpu_time() - clock
    finally:
        engine.close()
    assert clock >= 0.45 and own < 0.25, f"this process {own:.2f} s, the run's clock {clock:.2f} s"


def test_an_isolated_engines_pass_parts_run_and_are_timed_in_its_process():
    """The speed property times an engine's parts (``spectest_components``) and its runs; a real engine runs
    in a process of its own, where its parts must run too (they use its models), and where the time is
    spent: each part is a call to the child, and the engine's clock (``spectest_clock``) advances by the
    child's CPU for it, not by this process's waiting. A child whose engine has no parts has none here."""
    import time

    from spectest.e2e.isolated import load_factory
    from spectest.e2e.speed_check import engine_clock

    make = load_factory(f"{ENGINES / 'crashing.py'}:Isolated")
    engine = make("busy", fault="busy", from_call=1)
    try:
        parts = engine.spectest_components([1, 2, 3], SamplingParams.build(1, temperature=[1.0]))
        assert sorted(parts) == ["draft", "target", "verify"], parts
        clock = engine_clock(engine)
        assert clock is engine.spectest_clock and "process" in clock.name, clock
        seconds, own = clock(), time.process_time()
        parts["draft"]()  # 0.2 s of CPU in the child
        seconds, own = clock() - seconds, time.process_time() - own
    finally:
        engine.close()
    assert seconds >= 0.19 and own < 0.1, f"the engine's clock {seconds:.2f} s, this process {own:.2f} s"
    plain = make("plain", fault="none", from_call=10**9)
    try:
        assert getattr(plain, "spectest_components", None) is None
    finally:
        plain.close()
