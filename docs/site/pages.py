"""The generated pages of the API reference site, written into ``generated/`` before Sphinx reads the sources.

Nothing here is written by hand twice: the guides are the README's sections and the files of
``docs/guide/``, the reports are
BENCHMARKS.md and the tour report, the mechanism pages come from :mod:`attnkit.registry`, the API
pages from each public module's ``__all__`` (autodoc), and every picture is drawn now, offline.
"""

from __future__ import annotations

import functools
import re
import shutil
import warnings
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(__file__).resolve().parent
OUT = SITE / "generated"

# The public API: attnkit itself, these modules, and every subpackage of attnkit and attnkit.integrations
# except the internal ones (the command line, the pipeline's stages and the execution paths: DESIGN.md).
API_MODULES = ("attnkit.masks", "attnkit.bias", "attnkit.errors", "attnkit.registry", "attnkit.runtime")
INTERNAL_PACKAGES = {"functional", "kernels"}
# The lab's packages are documented one by one (attnkit.lab.viz, ...), its command line is not.
LAB_INTERNAL = {"commands"}
# The adapters attnkit.nn's modules call (their users meet them through those modules' pages).
INTEGRATIONS_INTERNAL = {"torch_compat", "torch_layers", "transformers_layers"}

# The mask algebra page: (expression, what it shows), drawn with attnkit.lab.viz.mask_picture.
MASK_ALGEBRA = (
    ("causal()", "Each query sees itself and the keys before it."),
    ("sliding_window(8, 8)", "A band: 8 keys on either side."),
    ("causal() & sliding_window(8, 0)", "`&` keeps what both allow: a causal window of 8 past keys."),
    ("sliding_window(4, 4) | global_tokens([0, 32])", "`|` adds what either allows: a band plus two global "
     "tokens, which see and are seen by every position."),
    ("~causal()", "`~` flips a mask: here, only the future."),
    ("strided(8) & causal()", "The Sparse Transformer's strided pattern: a local band and every 8th key."),
    ("fixed(8, 2) & causal()", "The Sparse Transformer's fixed pattern: the own block and the summary positions."),
    ("dilated(4, 2)", "A dilated window: every second key within 4 steps on either side."),
    ("prefix_lm(16)", "A bidirectional prefix of 16 tokens, then causal."),
)
MASK_LENGTH, MASK_BLOCK = 64, 16


def _repository() -> str:
    """The repository address, from pyproject.toml (the one place it is written)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return project["urls"]["Repository"].rstrip("/")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != text:  # unchanged files keep Sphinx's cache
        path.write_text(text, encoding="utf-8")


def _copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)


# ----------------------------------------------------------------------------------------------- markdown

# Repository files that are pages of the site: path in the repository -> document name under generated/.
# The guides in docs/guide/, in the order of the README's list: file stem -> page name guides/<stem>.
GUIDES = ("core", "packed", "integrations", "mechanisms", "models", "measure", "distributed", "cli", "benchmarks",
          "tour")
PAGES = {
    **{f"docs/guide/{stem}.md": f"guides/{stem}" for stem in GUIDES},
    "BENCHMARKS.md": "reports/benchmarks",
    "docs/tour/README.md": "reports/tour",
    "docs/DESIGN.md": "project/design",
    "docs/RELIABILITY.md": "project/reliability",
    "CHANGELOG.md": "project/changelog",
}


def _relink(text: str, doc: str, source: str) -> str:
    """Links of a Markdown file (in the repository at ``source``) made right for the page ``doc``.

    Absolute repository links and relative links are both resolved to a repository path; a path that is a
    page becomes a link to that page, an image is copied beside the generated pages, anything else points
    at the repository. ``doc`` is the page's name under ``generated/``.
    """
    repo = _repository()
    depth = doc.count("/")
    up = "../" * depth
    raw, blob = re.escape(repo.replace("github.com", "raw.githubusercontent.com")), re.escape(repo)

    def target(match: re.Match) -> str:
        bang, label, url = match.group(1), match.group(2), match.group(3)
        path = re.sub(rf"^(?:{raw}/main|{blob}/(?:blob|tree|raw)/main)/", "", url)
        if path == url:
            if re.match(r"^[a-z]+:|^#", url):
                return match.group(0)  # another site, or an anchor
            path = str(Path(source).parent / url).replace("\\", "/")
            path = re.sub(r"^(\./)+", "", path)
        file, _, anchor = path.partition("#")
        if bang:
            _copy(ROOT / file, OUT / "files" / file)
            return f"![{label}]({up}files/{file})"
        if file in PAGES:
            return f"[{label}]({up}{PAGES[file]}.md{'#' + anchor if anchor else ''})"
        return f"[{label}]({repo}/blob/main/{path})"

    return re.sub(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)", target, text)


def _shift_headings(text: str, by: int) -> str:
    """Headings one level up (``by=-1``) or down, outside code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"^#{1,6} ", line):
            hashes = len(line) - len(line.lstrip("#"))
            line = "#" * max(1, hashes + by) + line[hashes:]
        out.append(line)
    return "\n".join(out) + "\n"


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _readme_parts() -> tuple[str, list[str]]:
    """(the README's introduction without its title, its ``##`` sections)."""
    parts = re.split(r"^## ", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.MULTILINE)
    return parts[0].split("\n", 1)[1].strip() + "\n", parts[1:]


def readme_guides() -> list[str]:
    """The README's ``##`` sections, one guide page each (headings one level up); returns the page names."""
    _, sections = _readme_parts()
    names = []
    for section in sections:
        title = section.split("\n", 1)[0].strip()
        name = f"guides/{_slug(title)}"
        body = _shift_headings("## " + section, -1)
        _write(OUT / f"{name}.md", _relink(body, name, "README.md"))
        names.append(name)
    return names


def guide_files() -> list[str]:
    """The files of docs/guide/ (each a ``#``-titled page), in :data:`GUIDES` order; returns the page names."""
    found = {path.stem for path in (ROOT / "docs" / "guide").glob("*.md")}
    if found != set(GUIDES):
        raise RuntimeError(f"docs/guide/ holds {sorted(found)}; pages.GUIDES lists {sorted(GUIDES)}")
    for stem in GUIDES:
        source = f"docs/guide/{stem}.md"
        _write(OUT / f"{PAGES[source]}.md", _relink((ROOT / source).read_text(encoding="utf-8"), PAGES[source], source))
    return [PAGES[f"docs/guide/{stem}.md"] for stem in GUIDES]


def reports_and_project() -> None:
    """BENCHMARKS.md, the tour report, DESIGN.md, RELIABILITY.md and CHANGELOG.md as pages."""
    for source, name in PAGES.items():
        text = _relink((ROOT / source).read_text(encoding="utf-8"), name, source)
        if source == "docs/tour/README.md":  # the report's offline HTML page, copied into the site as tour/
            shutil.copytree(ROOT / "docs" / "tour", OUT / "extra" / "tour", dirs_exist_ok=True)
            text = re.sub(r"\[index\.html\]\([^)]*\)", '<a href="../../tour/index.html">index.html</a>', text)
        _write(OUT / f"{name}.md", text)


# ------------------------------------------------------------------------------------------------ API

def api_modules() -> list[str]:
    """``attnkit``, :data:`API_MODULES` and the public subpackages (found, so a new one is documented)."""
    import pkgutil

    import attnkit
    import attnkit.integrations
    import attnkit.lab

    packages = [f"attnkit.{m.name}" for m in pkgutil.iter_modules(attnkit.__path__)
                if m.ispkg and m.name not in INTERNAL_PACKAGES and m.name not in {"integrations", "lab"}]
    packages += [f"attnkit.integrations.{m.name}" for m in pkgutil.iter_modules(attnkit.integrations.__path__)
                 if m.name not in INTEGRATIONS_INTERNAL]
    packages += [f"attnkit.lab.{m.name}" for m in pkgutil.iter_modules(attnkit.lab.__path__)
                 if m.ispkg and m.name not in LAB_INTERNAL]
    return list(dict.fromkeys(["attnkit", *API_MODULES, *sorted(packages)]))  # masks and registry are packages too


def api_pages() -> list[str]:
    names = []
    for module in api_modules():
        name = f"api/{module}"
        _write(OUT / f"{name}.md", f"# {module}\n\n```{{eval-rst}}\n.. automodule:: {module}\n"
               "   :members:\n   :show-inheritance:\n```\n")
        names.append(name)
    return names


# ---------------------------------------------------------------------------------------------- pictures

@functools.cache
def _viz():
    import matplotlib

    matplotlib.use("Agg")
    import attnkit.lab.viz

    return attnkit.lab.viz


def mask_algebra() -> None:
    """The mask algebra page: each expression's picture and block layout, drawn now."""
    lines = ["# The mask algebra", "",
             "A mask is a function of indices, `mask(b, h, q_idx, kv_idx) -> bool` (True = may attend), so masks "
             "combine with `&` (both allow), `|` (either allows) and `~` (not). Each picture below is the mask at "
             f"length {MASK_LENGTH}, coloured by what the block-sparse kernel does with its {MASK_BLOCK} x "
             f"{MASK_BLOCK} blocks: computed in full, computed with the mask, or skipped. Every expression is "
             "also what `attnkit.masks.parse` and the command line's `--mask` read.", ""]
    for i, (expression, meaning) in enumerate(MASK_ALGEBRA):
        file = OUT / "masks" / f"mask-{i}.png"
        file.parent.mkdir(parents=True, exist_ok=True)
        _viz().mask_picture(expression, MASK_LENGTH, block_size=MASK_BLOCK, path=file, title=expression)
        lines += [f"## `{expression}`", "", meaning, "", f"![{expression}](masks/{file.name})", ""]
    lines += ["The constructors and their arguments are in the API reference of {py:mod}`attnkit.masks`.", ""]
    _write(OUT / "mask-algebra.md", "\n".join(lines))


# ------------------------------------------------------------------------------------------- mechanisms

def _example_map(entry):
    """(picture title, the first sample's and head's weights ``(Lq, Lk)``) of the entry's example, or None."""
    import torch
    from torch import nn

    from attnkit.lab.analysis import AttentionRecorder

    torch.manual_seed(0)
    fn, inputs = entry.example()
    with torch.no_grad():
        if isinstance(fn, functools.partial):  # a core entry: attention() with keywords
            weights = fn(*inputs, return_weights=True).weights
            return "attention weights", weights[0, 0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "no attention map" is answered below
            with AttentionRecorder(fn if isinstance(fn, nn.Module) else None) as rec:
                fn(*inputs)
    if not rec.maps:
        return None
    best = max(rec.maps, key=lambda m: m.weights.shape[-2] * m.weights.shape[-1])
    w = best.weights
    w = w.reshape(-1, w.shape[-1]) if w.dim() == 2 or w.shape[-2] == 1 else w.reshape(-1, *w.shape[-2:])[0]
    return f"weights of {best.name}", w


def _shapes(values) -> str:
    import torch

    return ", ".join(f"`{tuple(v.shape)}`" if isinstance(v, torch.Tensor) else f"`{type(v).__name__}`"
                     for v in values)


def _api_target(entry) -> str:
    import attnkit.nn

    target = entry.target
    name = getattr(target, "__name__", "")
    if getattr(attnkit.nn, name, None) is target:
        return f"{{py:obj}}`attnkit.nn.{name}`"
    if name == "attention":
        return "{py:func}`attnkit.attention`"
    return f"`{getattr(target, '__module__', 'attnkit')}.{name}`"


def _core_components(keywords: dict) -> list[tuple[str, str]]:
    """``(directive, dotted name)`` of what defines a core entry: its score, normaliser, bias and mask constructors."""
    from attnkit import bias, masks
    from attnkit.functional import normalize, scores

    found = [scores.SCORES[keywords.get("score", "scaled_dot")]]
    if isinstance(keywords.get("normalize"), str):
        found.append(normalize.NORMALIZERS[keywords["normalize"]])
    if "bias" in keywords:
        kind = type(keywords["bias"])
        found.append(getattr(bias, kind.__name__.lower(), kind) if kind.__name__.lower() in bias.__all__ else kind)
    if "mask" in keywords:
        for name in dict.fromkeys(re.findall(r"\b([a-z_]+)\(", repr(keywords["mask"]))):
            if name in masks.__all__:
                found.append(getattr(masks, name))
    return [("autoclass" if isinstance(obj, type) else "autofunction", f"{obj.__module__}.{obj.__qualname__}")
            for obj in found]


def mechanism_pages() -> list[str]:
    """One page per registry entry: paper, equation, complexity, example, a picture of its pattern."""
    from attnkit import registry

    names = []
    for entry in registry.entries():
        name = f"mechanisms/{entry.name}"
        fn, inputs = entry.example()
        lines = [f"# {entry.name}", "", entry.summary + ".", "",
                 f"- **Paper**: {entry.paper}", f"- **Family**: {entry.family}",
                 f"- **Complexity**: `{entry.complexity}`", f"- **Implemented by**: {_api_target(entry)}", ""]
        if isinstance(fn, functools.partial):
            arguments = ", ".join(f"{k}={v!r}" for k, v in fn.keywords.items())
            lines += ["## Equation", "", "`attnkit.attention`'s pipeline, "
                      "`normalize(score(q, k) * scale + bias, mask) @ v`, with "
                      + (f"`{arguments}`." if arguments else "its defaults (softmax of scaled dot products)."),
                      "", "What defines it, from the docstrings:", "", "```{eval-rst}"]
            for directive, dotted in _core_components(fn.keywords):
                lines += [f".. {directive}:: {dotted}", "   :no-index:", ""]
            lines += ["```", ""]
        else:
            directive = "autoclass" if isinstance(entry.target, type) else "autofunction"
            lines += ["## Equation", "", "From the docstring of the implementation (paper, equation, notation):", "",
                      "```{eval-rst}", f".. {directive}:: {entry.target.__module__}.{entry.target.__qualname__}",
                      "   :no-index:", *(["   :no-members:"] if directive == "autoclass" else []), "```", ""]
        lines += ["## Example", "", "The registry's example runs the mechanism at small sizes:", "", "```python",
                  "import torch", "from attnkit import registry", "", "torch.manual_seed(0)",
                  f'fn, inputs = registry.get("{entry.name}").example()', "out = fn(*inputs)", "```", "",
                  f"Its inputs here: {_shapes(inputs)}.", ""]
        picture = _example_map(entry)
        lines += ["## Pattern", ""]
        if picture is None:
            lines += ["This mechanism forms no weights over keys (it never builds the score matrix, or it is a "
                      "position encoding), so there is no map to draw.", ""]
        else:
            title, weights = picture
            file = OUT / "mechanisms" / f"{entry.name}.png"
            file.parent.mkdir(parents=True, exist_ok=True)
            lq, lk = weights.shape
            _viz().heatmap(weights, title=f"{entry.name}: {title}, sample 0, head 0 ({lq} x {lk})", path=file)
            lines += [f"The example's {title} (sample 0, head 0), queries down, keys across:", "",
                      f"![{entry.name}]({entry.name}.png)", ""]
        _write(OUT / f"{name}.md", "\n".join(lines))
        names.append(name)
    return names


# ----------------------------------------------------------------------------------------------- index

def _toctree(caption: str, names: list[str], maxdepth: int = 1) -> str:
    return "\n".join(["```{toctree}", f":caption: {caption}", f":maxdepth: {maxdepth}", "",
                      *names, "```", ""])


def generate() -> None:
    """Write every generated page and picture, and the tables of contents that list them."""
    import matplotlib

    matplotlib.use("Agg")
    OUT.mkdir(exist_ok=True)
    guides = readme_guides() + guide_files()
    reports_and_project()
    mask_algebra()
    mechanisms = mechanism_pages()
    api = api_pages()
    _write(OUT / "extra" / "index.html", '<!DOCTYPE html>\n<meta charset="utf-8">\n<title>attnkit</title>\n'
           '<meta http-equiv="refresh" content="0; url=generated/index.html">\n'
           '<a href="generated/index.html">attnkit documentation</a>\n')
    intro = _relink(_readme_parts()[0], "index", "README.md")
    _write(OUT / "index.md", "\n".join([
        "# attnkit", "", intro,
        _toctree("Guides", [*guides, "mask-algebra"]),
        _toctree("Mechanisms", mechanisms),
        _toctree("API reference", api),
        _toctree("Reports", ["reports/benchmarks", "reports/tour"]),
        _toctree("Project", ["project/design", "project/reliability", "project/changelog"]),
    ]))
