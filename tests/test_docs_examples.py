"""The docs' examples run against the real code: every fenced YAML catalog loads with the real
loader, the REST request bodies pass the real option check, the admin guide's configuration
sets only traits FracSpawner has, and the catalog page's Python example prints what it says."""

import json
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^( *)```(\w+)\n(.*?)^\1```", re.MULTILINE | re.DOTALL)


def _blocks(lang: str) -> list[tuple[str, str]]:
    """(where, text) of every ```lang block of the README and docs/*.md, dedented."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            indent, kind, body = match.groups()
            if kind != lang:
                continue
            line = text.count("\n", 0, match.start()) + 1
            body = "\n".join(row[len(indent) :] for row in body.splitlines())
            found.append((f"{page.relative_to(REPO)}:{line}", body))
    return found


def _catalogs() -> list[tuple[str, dict]]:
    """Every catalog in a YAML block: a document with `pools`, or a chart values file's
    `catalog` with pools (`catalog: {...}` placeholders are not catalogs)."""
    found = []
    for where, body in _blocks("yaml"):
        for doc in yaml.safe_load_all(body):
            if not isinstance(doc, dict):
                continue
            if "pools" in doc:
                found.append((where, doc))
            elif isinstance(doc.get("catalog"), dict) and "pools" in doc["catalog"]:
                found.append((where, doc["catalog"]))
    return found


def test_the_docs_have_catalog_examples():
    wheres = {w.split(":")[0] for w, _ in _catalogs()}
    assert {"README.md", "docs/install.md", "docs/catalog.md"} <= wheres, wheres


@pytest.mark.parametrize("where,catalog", _catalogs(), ids=[w for w, _ in _catalogs()])
def test_every_catalog_example_loads(where, catalog):
    from fracspawner.backends import load_catalog

    load_catalog(catalog)  # CatalogError names the key at fault


def _rest_bodies() -> list[tuple[str, str]]:
    """The JSON bodies of the README's and the user guide's server-start examples."""
    found = []
    for page in (REPO / "README.md", REPO / "docs" / "user-guide.md"):
        text = page.read_text()
        for match in re.finditer(r"-d '(\{.*?\})'|POST /hub/api/users/\S+ (\{.*?\})`", text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(REPO)}:{line}", match.group(1) or match.group(2)))
    return found


def test_the_rest_examples_are_found():
    assert len(_rest_bodies()) >= 4, _rest_bodies()


@pytest.mark.parametrize("where,body", _rest_bodies(), ids=[w for w, _ in _rest_bodies()])
def test_every_rest_example_is_accepted(where, body):
    """The body is the user_options themselves (JupyterHub 5 reads the whole body so; a
    {"user_options": ...} wrapper would be refused as an unknown option there) and the demo
    catalog serves it."""
    from fracspawner.backends import load_catalog
    from fracspawner.choice.options import resolve_choice

    catalog = load_catalog(REPO / "examples" / "catalogs" / "demo.yaml")
    options = json.loads(body)
    resolve_choice(catalog, options, rule=catalog.rule_for("admin", []), admin=True)


def test_the_admin_guide_configuration_names_real_traits():
    from traitlets.config import Config

    from fracspawner.hub.spawner import FracSpawner

    guide = (REPO / "docs" / "admin-guide.md").read_text()
    code = re.findall(r"```python\n(.*?)```", guide, re.DOTALL)[0]
    assert "fracspawner.configure(c" in code
    c = Config()
    catalog = str(REPO / "examples" / "catalogs" / "demo.yaml")
    exec(code.replace("/etc/fracspawner/catalog.yaml", catalog), {"c": c})  # noqa: S102
    traits = FracSpawner.class_traits(config=True)
    for section in ("FracSpawner", "KubeSpawner"):
        for name, value in c[section].items():
            assert name in traits, f"{section}.{name}"
            traits[name].validate(None, value)
    assert c.JupyterHub.spawner_class == "fracspawner"


def test_the_catalog_page_python_example_prints_what_it_says(tmp_path, monkeypatch):
    ((where, code),) = [(w, b) for w, b in _blocks("python") if w.startswith("docs/catalog.md")]
    said = re.search(r"^plan\.limits\s+# (\{.*\})$", code, re.MULTILINE)
    assert said, where
    (tmp_path / "catalog.yaml").write_text(
        yaml.safe_dump({"pools": {"h100": {"gpu": "H100", "backend": "hami", "offers": ["1/4"]}}})
    )
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(code, scope)  # noqa: S102
    assert dict(scope["plan"].limits) == eval(said.group(1)), where  # noqa: S307
