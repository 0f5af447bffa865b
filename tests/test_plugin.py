"""The plugin's user experience: options, usage errors, headers, import cost, CLI and library call."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.runner_helpers import run_pytest

VERIFIERS = Path(__file__).resolve().parent / "verifiers"
XDIST_ENVIRONMENT = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")


def test_plugin_import_loads_no_torch():
    code = (
        "import sys, spectest, spectest.plugin, spectest.options; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_resolving_the_reference_loads_no_torch_until_it_is_called():
    """pytest-xdist's controller resolves --spec-model only to describe it: for the built-in reference that must not
    import torch (1.5 s before any worker starts). The model it describes is the one the workers run."""
    code = (
        "import sys\n"
        "from spectest.resolve import resolve_model\n"
        "model = resolve_model('reference')\n"
        "assert 'torch' not in sys.modules, 'resolving imported torch'\n"
        "assert {'logits', 'propose', 'per-row-seeds', 'ragged-drafts'} <= model.capabilities, model.capabilities\n"
        "import torch\n"
        "from spectest.implementations import sampler\n"
        "from spectest.sampling import make_generator\n"
        "p = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])\n"
        "q = torch.tensor([[[1.0, 0.0, 0.0]]])\n"
        "ids = torch.tensor([[0]])\n"
        "out = model.verify(ids, q, p, generator=make_generator(0))\n"
        "assert out.tolist() == [[1, -1]], out\n"
        "assert sampler.REFERENCE is model.verify.__self__\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plugin_is_registered_through_pytest11(pytester):
    result = pytester.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(["*--spec-model=X*", "*--spec-device=DEVICE*", "*--spec-seed=SEED*"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--spec-model", "no_such_name"], "*'no_such_name' is not a registered name (known: *reference*"),
        (["--spec-model", "missing.py:verify"], "*no such file*missing.py*"),
        (["--spec-model", "bad.py:verify"], "*importing 'bad.py' failed: ZeroDivisionError*"),
        (["--spec-model", "shapes.py:no_attr"], "*has no attribute 'no_attr'*"),
        (["--spec-model", "shapes.py:not_callable"], "*neither a verify callable nor an object with a verify method*"),
        (
            ["--spec-model", "shapes.py:two_args"],
            "*cannot be called as verify(draft_token_ids, draft_probs, target_probs*",
        ),
        (["--spec-model", "reference", "--spec-device", "tpu"], "*expected cpu, cuda or cuda:N*"),
        (["--spec-model", "reference", "--spec-alpha", "2"], "*--spec-alpha: must lie strictly between 0 and 1*"),
        (["--spec-model", "reference", "--spec-seed", "x"], "*--spec-seed: invalid literal*"),
    ],
)
def test_bad_model_or_option_is_a_usage_error(pytester, args, message):
    pytester.makepyfile(bad="1 / 0", shapes="not_callable = 3\ndef two_args(a, b):\n    return a\n")
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert "Traceback" not in result.stderr.str()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message on machines without CUDA")
def test_cuda_without_cuda_is_a_usage_error(pytester):
    result = pytester.runpytest_subprocess("--spec-model", "reference", "--spec-device", "cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --spec-device 'cuda': CUDA is not available on this machine"])


def test_header_names_models_device_and_seed_and_ini_works(pytester):
    pytester.makeini("[pytest]\nspec_model = reference\nspec_seed = 1234\nspec_budget = quick\n")
    result = pytester.runpytest_subprocess("--co")
    result.stdout.fnmatch_lines(
        [
            "spectest: models: reference [[]logits, per-row-seeds, propose, ragged-drafts, standard-rejection, strided-inputs[]]*",
            "spectest: device: cpu, seed: 1234*budget: quick, tolerance: TV 0.1",
        ]
    )
    result.stdout.fnmatch_lines(["*test_sequences_follow_the_target?reference?*"])
    assert "21 tests collected" in result.stdout.str()


def test_properties_start_heaviest_first(pytester):
    """The properties are collected in the order of their declared cost (pytest-xdist hands them out in that order,
    so the long ones start first and the short ones fill in around them); equal costs keep their file order, and
    without --spec-model a run's own tests keep theirs."""
    result = pytester.runpytest_subprocess("--co", "-q", "--spec-model", "reference")
    names = [line.split("::")[1].split("[")[0] for line in result.stdout.lines if "::" in line]
    assert names[:4] == [
        "test_large_vocabularies_are_exact",
        "test_every_row_and_position_is_exact",
        "test_measured_speedup_follows_the_model",
        "test_propose_then_verify_is_lossless",
    ], names
    assert names.index("test_tokens_per_call_follow_the_chain_model") < names.index(
        "test_markov_tokens_per_pass_follow_the_exact_model"
    )
    pytester.makepyfile(
        test_mine="""
        import pytest

        def test_first():
            pass

        @pytest.mark.spec_property(examples=1, checks=0, cost=50)
        def test_second():
            pass
        """
    )
    result = pytester.runpytest_subprocess("--co", "-q", "test_mine.py")
    assert [line for line in result.stdout.lines if "::" in line] == [
        "test_mine.py::test_first",
        "test_mine.py::test_second",
    ]


def test_workers_take_one_property_at_a_time(pytester):
    """With --spec-model, pytest-xdist sends each worker one test at a time (--maxschedchunk 1), so the costliest-first
    order holds across workers; a user's own --maxschedchunk is kept, and a run without a subject is left alone."""
    pytester.makeconftest(
        """
        def pytest_report_header(config):
            return [f"schedule chunk: {config.option.maxschedchunk}"]
        """
    )
    pytester.makepyfile(test_mine="def test_one():\n    pass\n")
    for args, chunk in (
        (("--spec-model", "reference"), "1"),
        (("--spec-model", "reference", "--maxschedchunk", "3"), "3"),
        ((), "None"),
    ):
        result = pytester.runpytest_subprocess("--co", "test_mine.py", *args)
        result.stdout.fnmatch_lines([f"schedule chunk: {chunk}"])


def test_workers_leave_their_objects_out_of_the_last_collection(pytester, tmp_path, monkeypatch):
    """A pytest-xdist worker running a subject freezes its objects at exit (after pytest's own collections), so that
    the controller does not wait for its last garbage collection; a worker without a subject is left alone."""
    log = tmp_path / "frozen.txt"
    for name in XDIST_ENVIRONMENT:  # this test may itself run in a worker, whose variables the runs would inherit
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest(
        f"""
        import atexit, gc, os

        def report():  # registered before the plugin's handler, so it runs after it
            if os.environ.get("PYTEST_XDIST_WORKER"):
                with open({str(log)!r}, "a") as out:
                    out.write(f"{{gc.get_freeze_count()}}\\n")

        atexit.register(report)
        """
    )
    pytester.makepyfile(test_mine="def test_one():\n    pass\n")
    for args, frozen in ((("--spec-model", "reference"), True), ((), False)):
        log.unlink(missing_ok=True)
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "1", "test_mine.py", *args)
        result.assert_outcomes(passed=1)
        counts = [int(line) for line in log.read_text().split()]
        assert len(counts) == 1 and (counts[0] > 0) == frozen, (args, counts)


def test_idle_threads_sleep_in_a_run_with_a_subject(pytester, monkeypatch, tmp_path):
    """With a subject, torch's OpenMP threads are told to sleep when idle (set before torch loads, inherited by
    workers), unless the user chose a policy; a run without a subject is left alone."""
    seen = tmp_path / "policy.txt"
    for name in XDIST_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile(
        test_mine=f"""
        import os

        def test_policy():
            with open({str(seen)!r}, "w") as out:
                out.write(f"{{os.environ.get('OMP_WAIT_POLICY')}} {{os.environ.get('PYTEST_XDIST_WORKER')}}")
        """
    )
    for args, user, policy in (
        (("--spec-model", "reference"), None, "PASSIVE None"),
        (("--spec-model", "reference", "-n", "1"), None, "PASSIVE gw0"),
        (("--spec-model", "reference"), "ACTIVE", "ACTIVE None"),
        ((), None, "None None"),
    ):
        if user is None:
            monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
        else:
            monkeypatch.setenv("OMP_WAIT_POLICY", user)
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_mine.py", *args)
        result.assert_outcomes(passed=1)
        assert seen.read_text() == policy, (args, user)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    pytester.runpytest_inprocess("-p", "no:cacheprovider", "test_mine.py", "--spec-model", "reference")
    assert seen.read_text() == "PASSIVE None"
    assert "OMP_WAIT_POLICY" not in os.environ, "a run in the user's process left its policy behind"


def test_libraries_keep_their_asserts_in_a_run_with_a_subject(pytester, tmp_path):
    """With a subject, Hypothesis (marked for assertion rewriting only because it ships a pytest plugin) is imported
    as written, in the process and in a worker, while the run's test files are still rewritten; a run without a
    subject leaves pytest's rewriting as it is."""
    seen = tmp_path / "loaders.txt"
    pytester.makepyfile(
        test_mine=f"""
        import sys

        import hypothesis

        def loader(module):
            return type(module.__loader__).__name__

        def test_loaders():
            with open({str(seen)!r}, "w") as out:
                out.write(loader(hypothesis) + " " + loader(sys.modules[__name__]))
        """
    )
    for args, loaders in (
        (("--spec-model", "reference"), "SourceFileLoader AssertionRewritingHook"),
        (("--spec-model", "reference", "-n", "1"), "SourceFileLoader AssertionRewritingHook"),
        ((), "AssertionRewritingHook AssertionRewritingHook"),
    ):
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_mine.py", *args)
        result.assert_outcomes(passed=1)
        assert seen.read_text() == loaders, args


def test_a_file_that_does_not_collect_is_a_collection_error(pytester):
    """The plugin loads in every pytest run: a test file that fails to import is pytest's own collection error, with
    a subject or without one, not an internal error of the plugin's status hook."""
    pytester.makepyfile(test_broken="def test_x(:\n    pass\n")
    for args in ((), ("--spec-model", "reference")):
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_broken.py", *args)
        assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str(), args
        result.assert_outcomes(errors=1)


def test_repeated_models_get_readable_ids(pytester):
    result = pytester.runpytest_subprocess(
        "--co", "-q", "--spec-model", "reference", "--spec-model", f"{VERIFIERS / 'correct.py'}:exponential_race"
    )
    result.stdout.fnmatch_lines(["*[[]reference[]]", "*[[]correct.py:exponential_race[]]"])


def test_explicit_paths_are_kept(pytester):
    """With paths given, --spec-model does not add the installed suite: users' own tests run."""
    pytester.makepyfile(test_mine="def test_uses_model(spec_model):\n    assert spec_model.name == 'reference'\n")
    result = pytester.runpytest_subprocess("--spec-model", "reference", "test_mine.py")
    result.assert_outcomes(passed=1)


def test_hang_is_reported_as_a_timeout(tmp_path):
    (tmp_path / "slow.py").write_text("import time\ndef verify(d, q, p, *, generator):\n    time.sleep(60)\n")
    run = run_pytest(
        ["--spec-model", "slow.py:verify", "--spec-timeout", "0.3", "--spec-no-shrink", "-k", "inputs_are_not"],
        tmp_path,
    )
    outcome = run.results[("slow.py:verify", "test_inputs_are_not_modified")]
    assert outcome.outcome == "failed"
    assert "broke rule 'returns in time'" in outcome.text and "did not return within 0.3 s" in outcome.text


@pytest.mark.cost(20)
def test_failure_replays_exactly_with_the_printed_seed(tmp_path):
    model = f"{VERIFIERS / 'buggy.py'}:lenient_acceptance"
    args = ["--spec-model", model, "--spec-no-shrink", "-k", "every_row"]
    first = run_pytest([*args, "--spec-seed", "99"], tmp_path)
    second = run_pytest([*args, "--spec-seed", "99"], tmp_path)
    key = ("buggy.py:lenient_acceptance", "test_every_row_and_position_is_exact")
    assert first.results[key].outcome == "failed"
    assert "replay: pytest --spec-model" in first.results[key].text and "--spec-seed 99" in first.results[key].text
    stat = [line for line in first.results[key].text.splitlines() if "chi2=" in line]
    assert stat and stat == [line for line in second.results[key].text.splitlines() if "chi2=" in line]


def test_cli_check_and_models(tmp_path):
    listed = subprocess.run(
        [sys.executable, "-m", "spectest.cli", "models"], capture_output=True, text=True, check=True
    )
    lines = listed.stdout.splitlines()
    assert "model\treference\tspectest.implementations.sampler:REFERENCE" in lines
    assert "engine\ttransformers-assisted\tspectest.e2e.engines.transformers_loops:TRANSFORMERS_ASSISTED" in lines
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "spectest.cli",
            "check",
            "reference",
            "--spec-budget",
            "quick",
            "--pytest-args",
            "-q -k hygiene",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert checked.returncode == 0, checked.stdout[-2000:]
    assert "2 passed" in checked.stdout


def test_check_verifier_library_call(tmp_path, monkeypatch):
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(VERIFIERS)!r})
        import buggy, correct
        from spectest import check_verifier
        assert check_verifier(correct.exponential_race, budget="quick", pytest_args=["-q", "-k", "hygiene or rejection"]) == 0
        try:
            check_verifier(buggy.accept_all, budget="quick", pytest_args=["-q", "--spec-no-shrink", "-k", "rejection"])
        except AssertionError as exc:
            assert "accept_all failed the property suite" in str(exc)
        else:
            raise SystemExit("a buggy verifier passed")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_a_property_concluding_more_checks_than_it_declares_is_a_harness_error(tmp_path):
    """The significance split trusts each property's declared checks: concluding more is a loud
    harness error (an error, kind "harness" in the results file), never a silent miscount."""
    (tmp_path / "test_miscounted.py").write_text(
        textwrap.dedent(
            """
            import numpy as np
            import pytest
            from hypothesis import strategies as st

            @pytest.mark.spec_property(examples=1, checks=0)
            def test_undeclared_check(spec):
                def body(_):
                    check = spec.distribution("coin", np.array([[0.5, 0.5]]), min_draws=10, max_draws=10)
                    check.add(np.array([[5, 5]]), 10)
                    spec.conclude(check, context="a fair coin")

                spec.given(st.just(0), body)
            """
        )
    )
    run = run_pytest(["--spec-model", "reference", "-n", "0", str(tmp_path / "test_miscounted.py")], tmp_path)
    outcome = run.results[("reference", "test_undeclared_check")]
    assert outcome.outcome == "error" and outcome.failure["kind"] == "harness", outcome.text[-2000:]
    assert outcome.failure["rule"].startswith("HarnessError") and "declares checks=0" in outcome.failure["rule"]
