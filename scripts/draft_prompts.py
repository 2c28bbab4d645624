"""Chat prompts for distilling the SmolLM2 draft, built from text already on this machine.

Sources: docstrings (read with ``ast``) of the standard library and of the venv's packages,
and the prose of installed packages' documentation (``*.md``, ``*.rst`` and the long
descriptions in ``*.dist-info/METADATA``). Each snippet becomes a user turn through one of
a few instruction templates. Files are split into train / held-out by a hash of their
path, so a held-out prompt never shares a source file with a training prompt.
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
import sysconfig
import textwrap
from dataclasses import dataclass
from pathlib import Path

FUNCTION_TEMPLATES = (
    "What does `{qualname}` do in Python? Its documentation says:\n\n{doc}",
    "Write a short Python example that uses `{qualname}`. Its documentation: {doc}",
    "Explain this docstring of `{qualname}` to a beginner:\n\n{doc}",
    "Write a Python function named `{name}` that does the following: {doc}",
)
MODULE_TEMPLATES = (
    "What is the Python module `{qualname}` for? Its documentation says:\n\n{doc}",
    "Explain in simple terms:\n\n{doc}",
)
PROSE_TEMPLATES = (
    "Summarize this text in two sentences:\n\n{doc}",
    "Explain this to a beginner:\n\n{doc}",
    "What are the key points of this passage?\n\n{doc}",
    "Rewrite this paragraph in plain English:\n\n{doc}",
)
MIN_CHARS, MAX_CHARS = 60, 420


@dataclass(frozen=True)
class Snippet:
    """One piece of documentation: a docstring (of ``qualname``) or a prose paragraph."""

    source: str  # the file it came from (decides train / held-out)
    kind: str  # "function" | "module" | "prose"
    qualname: str
    doc: str


def is_heldout(source: str, every: int) -> bool:
    return int(hashlib.sha1(source.encode()).hexdigest(), 16) % every == 0


def first_paragraph(doc: str) -> str:
    """The docstring's first paragraph on one line, or "" when it is too short or long."""
    para = textwrap.dedent(doc).strip().split("\n\n")[0]
    para = " ".join(para.split())
    return para if MIN_CHARS <= len(para) <= MAX_CHARS else ""


def docstring_snippets(path: Path, module: str) -> list[Snippet]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
        return []
    found = []
    if doc := first_paragraph(ast.get_docstring(tree) or ""):
        found.append(Snippet(str(path), "module", module, doc))
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if node.name.startswith("_"):
            continue
        if doc := first_paragraph(ast.get_docstring(node) or ""):
            found.append(Snippet(str(path), "function", f"{module}.{node.name}", doc))
    return found


def prose_snippets(path: Path) -> list[Snippet]:
    """Paragraphs of running text (not code, tables or headings) from a documentation file."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    found = []
    for block in re.split(r"\n\s*\n", text):
        para = " ".join(block.split())
        if not MIN_CHARS * 2 <= len(para) <= MAX_CHARS or para[0] in "#|:.`>=-*[<!{":
            continue
        if sum(c.isalpha() or c == " " for c in para) < 0.85 * len(para):
            continue
        found.append(Snippet(str(path), "prose", path.name, para))
    return found


def collect_snippets() -> list[Snippet]:
    """Every snippet, in a fixed order (sorted files)."""
    paths = sysconfig.get_paths()
    stdlib, site = Path(paths["stdlib"]), Path(paths["purelib"])
    snippets: list[Snippet] = []
    for root in (stdlib, site):
        for path in sorted(root.rglob("*.py")):
            parts = set(path.relative_to(root).parts)
            if parts & {"test", "tests", "testing", "site-packages", "_vendor", "idlelib"}:
                continue
            rel = path.relative_to(root).with_suffix("")
            module = ".".join(p for p in rel.parts if p != "__init__")
            snippets += docstring_snippets(path, module)
    docs = [*site.rglob("*.md"), *site.rglob("*.rst"), *site.glob("*.dist-info/METADATA")]
    for path in sorted(docs):
        snippets += prose_snippets(path)
    return snippets


def to_prompt(snippet: Snippet, rng: random.Random) -> str:
    """The user's turn asking about ``snippet``."""
    templates = {
        "function": FUNCTION_TEMPLATES,
        "module": MODULE_TEMPLATES,
        "prose": PROSE_TEMPLATES,
    }[snippet.kind]
    # The last two parts (``json.dumps``, ``modeling_llama.LlamaModel``) read like a user's.
    qualname = ".".join(snippet.qualname.split(".")[-2:])
    name = qualname.rpartition(".")[2]
    return rng.choice(templates).format(qualname=qualname, name=name, doc=snippet.doc)


def build_prompts(seed: int, heldout_every: int, num_heldout: int) -> tuple[list[str], list[str]]:
    """``(train, heldout)`` user turns, each shuffled with ``seed``; prose and docstrings
    are mixed one to three so the many docstrings do not crowd out the documentation."""
    rng = random.Random(seed)
    snippets = collect_snippets()
    pools: dict[bool, dict[str, list[Snippet]]] = {True: {}, False: {}}
    for s in snippets:
        group = "prose" if s.kind == "prose" else "code"
        pools[is_heldout(s.source, heldout_every)].setdefault(group, []).append(s)
    prompts = {}
    for heldout, groups in pools.items():
        for group in groups.values():
            rng.shuffle(group)
        prose, code = groups.get("prose", []), groups.get("code", [])
        mixed: list[Snippet] = []
        while prose or code:
            mixed += [prose.pop()] if prose else []
            mixed += [code.pop() for _ in range(min(3, len(code)))]
        prompts[heldout] = [to_prompt(s, rng) for s in mixed]
    return prompts[False], prompts[True][:num_heldout]
