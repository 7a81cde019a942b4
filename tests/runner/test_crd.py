"""The generated CRDs: committed files up to date, structural, accepted by the
apiextensions.k8s.io/v1 schema, and agreeing with the models on every experiment."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from undertow.spec import load_documents
from undertow.spec.crd import CRD_DIRS, crds, main
from undertow.spec.crd import crd_files as generate_crd_files

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted((REPO / "experiments").glob("*.yaml"))
DATA_FILES = sorted((Path(__file__).parent / "data").glob("spec-*.yaml"))

# What apiextensions.k8s.io/v1 JSONSchemaProps knows; keys forbidden inside junctors.
JSON_SCHEMA_PROPS = {
    "type",
    "description",
    "properties",
    "required",
    "items",
    "additionalProperties",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "pattern",
    "format",
    "nullable",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "default",
    "multipleOf",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "title",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
    "x-kubernetes-embedded-resource",
}
FORBIDDEN_IN_JUNCTORS = {"description", "type", "default", "additionalProperties", "nullable"}
INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]


def structural_problems(node: dict[str, Any], path: str, junctor: bool = False) -> list[str]:
    """Kubernetes' structural schema rules (apiextensions-apiserver's ValidateStructural)."""
    problems = [f"{path}: unknown keyword {k}" for k in node if k not in JSON_SCHEMA_PROPS]
    int_or_string = node.get("x-kubernetes-int-or-string") is True
    if junctor:
        problems += [f"{path}: {k} inside a junctor" for k in node if k in FORBIDDEN_IN_JUNCTORS]
    elif "type" not in node and not int_or_string:
        problems.append(f"{path}: no type")
    if int_or_string and "anyOf" in node and node["anyOf"] != INT_OR_STRING:
        problems.append(f"{path}: int-or-string anyOf must be exactly integer|string")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path}: properties and additionalProperties are exclusive")
    if node.get("uniqueItems"):
        problems.append(f"{path}: uniqueItems is not allowed in v1 CRDs")
    for key in ("anyOf", "oneOf", "allOf"):
        if key == "anyOf" and int_or_string:
            continue
        for i, sub in enumerate(node.get(key, [])):
            problems += structural_problems(sub, f"{path}.{key}[{i}]", junctor=True)
            for name in sub.get("properties", {}):
                if name not in node.get("properties", {}):
                    problems.append(f"{path}.{key}[{i}]: property {name} not specified outside")
    for name, sub in node.get("properties", {}).items():
        problems += structural_problems(sub, f"{path}.{name}", junctor)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            problems += structural_problems(node[key], f"{path}.{key}", junctor)
    return problems


@cache
def crd_files() -> dict[str, str]:
    return generate_crd_files()


@cache
def schema_of(kind: str) -> dict[str, Any]:
    crd = next(c for c in crds().values() if c["spec"]["names"]["kind"] == kind)
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@cache
def validator(kind: str) -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(schema_of(kind))


@pytest.mark.parametrize("folder", CRD_DIRS)
def test_committed_crds_match_the_models(folder: str) -> None:
    for name, text in crd_files().items():
        path = REPO / folder / name
        assert path.exists(), f"missing {path}: run python -m undertow.spec.crd"
        assert path.read_text() == text, f"{path} is stale: run python -m undertow.spec.crd"


def test_main_writes_and_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--check", "--root", str(tmp_path)]) == 1
    assert main(["--root", str(tmp_path)]) == 0
    assert main(["--check", "--root", str(tmp_path)]) == 0
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.yaml"))
    assert written == sorted(f"{d}/{n}" for d in CRD_DIRS for n in crd_files())
    assert "stale" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(crd_files()))
def test_crd_is_a_valid_apiextensions_v1_object(name: str) -> None:
    crd = yaml.safe_load(crd_files()[name])
    kubernetes_validate.validate(crd, "1.30.0", strict=True)
    version = crd["spec"]["versions"][0]
    assert crd["metadata"]["name"] == name.removesuffix(".yaml")
    assert crd["spec"]["group"] == "undertow.dev"
    assert crd["spec"]["scope"] == "Namespaced"
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    schema = version["schema"]["openAPIV3Schema"]
    assert structural_problems(schema, "openAPIV3Schema") == []
    assert "x-kubernetes-preserve-unknown-fields" not in crd_files()[name]
    assert "$ref" not in crd_files()[name]


def test_short_names_and_printer_columns_point_into_the_schema() -> None:
    expected = {
        "BrokerCluster": (["ubc"], ["Brokers", "Ready", "Age"]),
        "ChaosExperiment": (["uce"], ["Phase", "Expect", "Verdict", "Lost", "Age"]),
    }
    for crd in crds().values():
        kind = crd["spec"]["names"]["kind"]
        short, columns = expected[kind]
        assert crd["spec"]["names"]["shortNames"] == short
        version = crd["spec"]["versions"][0]
        printed = version["additionalPrinterColumns"]
        assert [c["name"] for c in printed] == columns
        schema = version["schema"]["openAPIV3Schema"]
        for column in printed:
            if column["jsonPath"].startswith(".metadata."):
                continue
            node = schema
            for part in column["jsonPath"].strip(".").split("."):
                node = (
                    node["properties"][part]
                    if "properties" in node
                    else (node["additionalProperties"])
                )
            assert node["type"] == column["type"], column


def test_status_schemas() -> None:
    experiment = schema_of("ChaosExperiment")["properties"]["status"]["properties"]
    assert experiment["phase"]["enum"] == [
        "Pending",
        "Running",
        "Healing",
        "Analyzing",
        "Completed",
        "Failed",
    ]
    assert experiment["counts"]["additionalProperties"] == {"type": "integer"}
    record = experiment["faults"]["items"]["properties"]
    assert list(record) == ["fault", "target", "role", "injectedAt", "recoveredAt"]
    assert record["injectedAt"]["format"] == "date-time"
    condition = experiment["conditions"]["items"]
    assert set(condition["required"]) == {"type", "status"}
    assert list(condition["properties"]) == [
        "type",
        "status",
        "reason",
        "message",
        "lastTransitionTime",
        "observedGeneration",
    ]
    assert {"reportRef", "observedGeneration", "verdict"} <= set(experiment)
    cluster = schema_of("BrokerCluster")["properties"]["status"]["properties"]
    assert list(cluster) == ["readyBrokers", "conditions", "observedGeneration"]


def documents(paths: list[Path]) -> list[dict[str, Any]]:
    return [d for p in paths for d in yaml.safe_load_all(p.read_text()) if d]


@pytest.mark.parametrize("path", EXPERIMENTS + DATA_FILES, ids=lambda p: p.name)
def test_experiment_files_validate_against_crd_and_model(path: Path) -> None:
    for doc in documents([path]):
        validator(doc["kind"]).validate(doc)
    model_docs = load_documents([path])
    for document in model_docs:
        dumped = document.resource.model_dump(mode="json", by_alias=True, exclude_none=True)
        validator(document.resource.kind).validate(dumped)


@pytest.mark.parametrize(
    ("path", "value", "keyword"),
    [
        (["spec", "workload", "duration"], "5q", "pattern"),
        (["spec", "workload", "duration"], -1, "minimum"),
        (["spec", "workload", "acks"], 2, "enum"),
        (["spec", "workload", "producers"], "two", "type"),
        (["spec", "faults", 0, "kind"], "explode", "enum"),
        (["spec", "faults", 0, "target", "broker"], 1, "oneOf"),
        (["spec", "faults", 0, "sequence"], {"steps": [{"kind": "kill"}]}, "oneOf"),
        (["spec", "cluster", "inline"], {"brokers": 3}, "oneOf"),
        (["spec", "expect"], "maybe", "enum"),
    ],
)
def test_crd_schema_rejects_bad_values(path: list[Any], value: Any, keyword: str) -> None:
    doc = next(d for d in documents([DATA_FILES[0]]) if d["kind"] == "ChaosExperiment")
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    errors = list(validator("ChaosExperiment").iter_errors(doc))
    assert [e.validator for e in errors] == [keyword]
