"""Every fenced code block of README.md, run as a new user would run it (issue 32; nox ``docs``).

- ``bash``: each command, as written, in a fresh copy of this checkout (the files ``git`` has, none
  of what builds or runs leave), one copy per block so that a block's later commands see what its
  earlier ones wrote (``tune --out`` then ``train --lock``). It must exit 0. The commands not run
  here, and the GPU ones, are listed below with why: a command the README gains runs unless a
  reviewer adds it there.
- ``python``: the block as a script, in such a copy; it must exit 0, and a line's ``# -> TEXT``
  comment is what the block prints there, a whole line of its output, in order.
- ``yaml``: a job of ``veomni-ops train`` (a fragment, without ``model:``, laid over
  ``examples/qwen3-moe-tiny-auto.yaml``), read by the job loader with every check.
- ``text``: not run; every path it lists (a line's first word, unindented, ending in ``/``) must exist.

A block in another language, or none, fails: say what it is, and this test runs it.

The environment is the README's set-up (nox ``docs``): the core with transformers, the plugins of
the README's install line, and accelerate, which transformers' Trainer needs.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

#: Commands of the README that this test does not run, each with why. Reviewed: every other
#: command runs here as written and must exit 0; each of these must still be in the README.
NOT_RUN = {
    "./dev demo": "the nox `demo` session runs its training command; its set-up (a venv, the pinned CPU "
                  "torch, the core under constraints.txt) is what every nox session does",
    "./dev test": "what CI runs: every nox session, this one among them",
    "pip install torch==2.13.0": "the packaging session runs it as written in a fresh venv, before the next line "
                                 "(tests/packaging/test_install_paths.py); this session has that torch",
    'pip install --find-links dist "veomni-ops[liger,triton]"':
        "it installs into the environment running this test; the packaging session installs it into a fresh "
        "venv (tests/packaging/test_install_paths.py), and this session has what it installs",
    'pip install "veomni-ops[liger,triton]"': "the wheels are on no package index yet (the README says so)",
    "torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint $HEAD:29500 --rdzv-id job1 "
    "--max-restarts 3 -m veomni_ops.cli train job.yaml":
        "several nodes of 8 GPUs; core/tests/test_nodes.py runs it as 2 launchers of 2 CPU processes on one machine, "
        "and core/tests/test_restart.py its --max-restarts with a rank killed",
    'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)': "a SLURM allocation's node list (SLURM "
                                                                          "recipe)",
    'srun torchrun --nnodes "$SLURM_NNODES" --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$head:29500" '
    '--rdzv-id "$SLURM_JOB_ID" --max-restarts 3 -m veomni_ops.cli train job.yaml':
        "a SLURM allocation of several GPU nodes (SLURM recipe); the torchrun it runs on each node is "
        "core/tests/test_nodes.py's",
}

#: Commands for a CUDA GPU. Where torch sees none they run, and must be refused before any work:
#: exit status 1, the message naming cuda, no traceback (so the file, every option and every other
#: field is checked); where it sees one, they run as written.
NEEDS_CUDA = {
    "veomni-ops train examples/qwen3-small-auto-compile.yaml --baseline transformers+compile --baseline liger "
    "--plot out.png",
}

#: The job a ``yaml`` fragment (no ``model:`` section) is laid over: MoE, so that every field of
#: every section (``parallel.ep`` too) has something to check against.
FRAGMENT_BASE = REPO / "examples" / "qwen3-moe-tiny-auto.yaml"

#: Seconds one command may take (the slowest, a tune on two cores, takes a few minutes).
TIMEOUT = 900

LANGUAGES = ("bash", "python", "yaml", "text")
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[^`\s]*)\s*$")


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int  # the line of its opening fence
    source: str = "README.md"

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line} ({self.lang or 'no language'})"


def code_blocks(markdown: str, source: str = "README.md") -> list[Block]:
    """The fenced code blocks of ``markdown``, in order, their indentation (in a list item) removed."""
    out: list[Block] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, start = m["indent"], i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        assert i < len(lines), f"{source}:{start + 1}: the code block opened here is never closed"
        out.append(Block(m["lang"], "\n".join(body) + "\n", start + 1, source))
        i += 1
    return out


def without_comment(line: str) -> str:
    """``line`` without its shell comment (a ``#`` outside quotes, at the start or after a blank)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def commands(block: Block) -> list[str]:
    """The commands of a bash block: a line each (``\\`` continues one), comments and blanks left out."""
    out: list[str] = []
    pending = ""
    for raw in block.text.splitlines():
        line = without_comment(raw)
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = " ".join((pending + line).split())
        pending = ""
        if line:
            out.append(line)
    return out


def readme_blocks() -> list[Block]:
    return code_blocks(README.read_text(encoding="utf-8"))


def readme_commands() -> list[str]:
    return [c for b in readme_blocks() if b.lang == "bash" for c in commands(b)]


def fresh_checkout(dest: Path) -> Path:
    """A copy of this checkout as a fresh clone of it has it: the files git tracks, and the new ones
    it does not ignore (a change under test), none of the venvs, wheels or caches a run leaves."""
    try:
        listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.fail(f"this test copies the checkout's files as git lists them, and git could not list them ({e}); "
                    "run it in a git checkout of veomni-ops with git on PATH")
    dest.mkdir(parents=True)
    for name in filter(None, listed.decode().split("\0")):
        src = REPO / name
        if not src.is_file() and not src.is_symlink():  # tracked, but deleted in this working tree
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / name, follow_symlinks=False)
    return dest


def user_env() -> dict[str, str]:
    """This environment as a user's shell has it after the README's set-up: this Python's scripts
    (veomni-ops, torchrun) first on PATH, and none of the switches a test run may have set."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VEOMNI_") and k not in ("PYTHONPATH", "PYTHONHOME", "TRITON_INTERPRET")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _shown(proc: subprocess.CompletedProcess, n: int = 4000) -> str:
    return f"--- stdout (end) ---\n{proc.stdout[-n:]}\n--- stderr (end) ---\n{proc.stderr[-n:]}"


def run_command(command: str, cwd: Path, where: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=user_env(), capture_output=True, text=True,
                          timeout=TIMEOUT)
    if command in NEEDS_CUDA and not _cuda():
        assert proc.returncode == 1 and "cuda" in proc.stderr.lower() and "Traceback" not in proc.stderr, (
            f"{where}: `{command}` needs a CUDA GPU; without one it must be refused at once (exit status 1, a "
            f"message naming cuda, no traceback), and it exited {proc.returncode}:\n{_shown(proc)}")
        return proc
    assert proc.returncode == 0, f"{where}: `{command}` exited {proc.returncode}:\n{_shown(proc)}"
    return proc


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def run_bash(block: Block, cwd: Path) -> None:
    for command in commands(block):
        if command not in NOT_RUN:
            run_command(command, cwd, block.where)


def run_python(block: Block, cwd: Path) -> None:
    script = cwd / "readme_block.py"
    script.write_text(block.text, encoding="utf-8")
    proc = subprocess.run([sys.executable, script.name], cwd=cwd, env=user_env(), capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, f"{block.where}: the block exited {proc.returncode}:\n{_shown(proc)}"
    printed = proc.stdout.splitlines()
    at = 0
    for want in re.findall(r"#\s*->\s*(.+?)\s*$", block.text, re.M):
        try:
            at = printed.index(want, at) + 1
        except ValueError:
            pytest.fail(f"{block.where}: the block shows it prints `{want}`, and it printed no such line "
                        f"(after the ones matched before it):\n{_shown(proc)}")


def run_yaml(block: Block, cwd: Path) -> None:
    import yaml
    from veomni_ops.config import load_yaml
    from veomni_ops.train import load_job

    path = cwd / "examples" / "readme-block.yaml"  # in examples/: paths in it are relative to the job, as there
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(block.text, encoding="utf-8")
    data, problems = load_yaml(str(path))
    assert not problems, f"{block.where}: {problems}"
    assert isinstance(data, dict), f"{block.where}: a job's sections, not {type(data).__name__}"
    if "model" not in data:  # a fragment: laid over a whole job, section by section
        job = yaml.safe_load(FRAGMENT_BASE.read_text(encoding="utf-8"))
        for section, value in data.items():
            if isinstance(value, dict) and isinstance(job.get(section), dict):
                job[section] = {**job[section], **copy.deepcopy(value)}
            else:
                job[section] = value
        path.write_text(yaml.safe_dump(job, sort_keys=False), encoding="utf-8")
    load_job(str(path))  # every check, for this machine; a TrainConfigError names every mistake


def check_text(block: Block, cwd: Path) -> None:
    for line in block.text.splitlines():
        first = line.split(maxsplit=1)[0] if line[:1].strip() else ""  # an entry, not its indented description
        if first.endswith("/"):
            assert any(cwd.glob(first.rstrip("/"))), f"{block.where}: names {first}, which this checkout lacks"


RUNNERS = {"bash": run_bash, "python": run_python, "yaml": run_yaml, "text": check_text}


def run_block(block: Block, cwd: Path) -> None:
    assert block.lang in RUNNERS, (
        f"{block.where}: a code block must say what it is (```{'``` or ```'.join(LANGUAGES)}), so that this "
        f"test runs it; it says {block.lang or 'nothing'!r}")
    RUNNERS[block.lang](block, cwd)


@pytest.mark.parametrize("block", readme_blocks(), ids=lambda b: f"line{b.line}-{b.lang or 'none'}")
def test_readme_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    run_block(block, fresh_checkout(tmp_path / "checkout"))


def test_every_command_left_out_is_still_in_the_readme() -> None:
    """The lists above are of README commands: one the README no longer has is a stale entry."""
    shown = set(readme_commands())
    stale = sorted((set(NOT_RUN) | NEEDS_CUDA) - shown)
    assert not stale, f"not in README.md any more; remove them from NOT_RUN / NEEDS_CUDA: {stale}"


@pytest.mark.parametrize("lang, text, why", [
    pytest.param("python", "print('ran')\nraise SystemExit(3)\n", "exited 3", id="python-exits-3"),
    pytest.param("python", "print('4')  # -> 5\n", "printed no such line", id="python-prints-another-line"),
    pytest.param("bash", "veomni-ops plugins   # runs\nveomni-ops resolve examples/no-such-job.yaml\n", "exited 1",
                 id="bash-missing-file"),
    pytest.param("yaml", "train: {steps: 10, checkpoint_evry: 5}\n", "checkpoint_evry", id="yaml-typo"),
    pytest.param("text", "core/        the core\nno-such-folder/   gone\n", "no-such-folder/", id="text-missing-path"),
    pytest.param("sh", "echo hi\n", "must say what it is", id="unknown-language"),
])
def test_a_broken_block_fails(lang: str, text: str, why: str, tmp_path: Path) -> None:
    """The runners fail a block that breaks (each kind of block, and one of no kind they know)."""
    with pytest.raises(BaseException, match=re.escape(why)) as raised:
        run_block(Block(lang, text, 1, "broken.md"), fresh_checkout(tmp_path / "checkout"))
    assert not isinstance(raised.value, (KeyboardInterrupt, SystemExit)), raised.value


def test_code_blocks_are_read_as_written() -> None:
    text = "x\n```bash\n./dev a   # one\nb \\\n  --c 'd # e'\n```\n- item\n  ```python\n  print(1)\n  ```\n"
    blocks = code_blocks(text, "t.md")
    assert [(b.lang, b.line) for b in blocks] == [("bash", 2), ("python", 8)]
    assert commands(blocks[0]) == ["./dev a", "b --c 'd # e'"]
    assert blocks[1].text == "print(1)\n"


def test_the_veomni_example_is_a_whole_veomni_config() -> None:
    """examples/veomni/llama3.yaml, which the README plans, is VeOmni's own layout whole: its model
    section as VeOmni has it (the fixture of the same file at the same commit), and data and train
    sections of its own, which veomni-ops leaves be."""
    import yaml
    from veomni_ops import OpsConfig

    example = REPO / "examples" / "veomni" / "llama3.yaml"
    data = yaml.safe_load(example.read_text(encoding="utf-8"))
    fixture = yaml.safe_load((REPO / "core/tests/fixtures/veomni/text__llama3.yaml").read_text(encoding="utf-8"))
    assert list(data) == ["model", "data", "train"] and data["data"] and data["train"], list(data)
    assert data["model"] == fixture["model"]
    assert set(OpsConfig.from_yaml(example).to_dict().values()) == {"auto"}
    assert "veomni-ops resolve examples/veomni/llama3.yaml" in readme_commands()
