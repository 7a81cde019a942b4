"""Load experiment files: multi-document YAML, as `kubectl apply -f` takes them.

A file holds `BrokerCluster` and `ChaosExperiment` documents; an experiment names its
cluster with `spec.cluster.ref` (resolved among every document loaded, including extra
files) or embeds it with `spec.cluster.inline`. Everything is validated before anything
starts; the first problem becomes one `SpecError` line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .cluster import BrokerCluster
from .errors import SpecError, format_loc, spec_error_from_validation
from .experiment import ChaosExperiment, check_against_cluster
from .meta import API_VERSION, FieldError

__all__ = ["Document", "LoadedExperiment", "load_documents", "load_experiment", "parse_document"]

KINDS: dict[str, type[BrokerCluster] | type[ChaosExperiment]] = {
    "BrokerCluster": BrokerCluster,
    "ChaosExperiment": ChaosExperiment,
}

Resource = BrokerCluster | ChaosExperiment


@dataclass(frozen=True)
class Document:
    """One validated document and where it came from."""

    source: str
    index: int
    """Position in its file, from 0."""
    resource: Resource

    @property
    def label(self) -> str:
        return f"{self.resource.kind}/{self.resource.metadata.name}"


@dataclass(frozen=True)
class LoadedExperiment:
    """An experiment with its cluster resolved; ready for the runner."""

    experiment: ChaosExperiment
    cluster: BrokerCluster
    """The referenced cluster, or one named after the experiment for an inline spec."""
    source: Path
    cluster_source: Path


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key written twice instead of keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                mark = key_node.start_mark
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_yaml(path: Path, source: str) -> list[Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(exc.strerror or str(exc), source=source) from None
    try:
        return [doc for doc in yaml.load_all(text, Loader=_UniqueKeyLoader) if doc is not None]
    except yaml.MarkedYAMLError as exc:
        where = ""
        if exc.problem_mark is not None:
            where = f"line {exc.problem_mark.line + 1}, column {exc.problem_mark.column + 1}: "
        raise SpecError(f"{where}{exc.problem or exc}", source=source) from None


def parse_document(data: Any, source: str, index: int) -> Document:
    """Validate one decoded document (from a file or from the API server)."""
    fallback = f"document {index + 1}"
    if not isinstance(data, dict):
        raise SpecError(
            f"expected a mapping, got {type(data).__name__}", source=source, document=fallback
        )
    kind, api_version = data.get("kind"), data.get("apiVersion")
    if kind not in KINDS:
        raise SpecError(
            f"unsupported kind {kind!r}; expected one of: {', '.join(KINDS)}",
            source=source,
            document=fallback,
            path="kind",
        )
    metadata = data.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    label = f"{kind}/{name}" if isinstance(name, str) and name else f"{kind} ({fallback})"
    if api_version != API_VERSION:
        raise SpecError(
            f"unsupported apiVersion {api_version!r}; expected {API_VERSION}",
            source=source,
            document=label,
            path="apiVersion",
        )
    try:
        resource = KINDS[kind].model_validate(data)
    except ValidationError as exc:
        raise spec_error_from_validation(exc, source=source, document=label) from None
    return Document(source=source, index=index, resource=resource)


def load_documents(paths: Iterable[str | Path]) -> list[Document]:
    """Every document of every file, validated; names must be unique per kind."""
    documents: list[Document] = []
    seen: dict[tuple[str, str], Document] = {}
    for path in paths:
        source = str(path)
        for index, data in enumerate(_read_yaml(Path(path), source)):
            document = parse_document(data, source, index)
            key = (document.resource.kind, document.resource.metadata.name)
            if key in seen:
                raise SpecError(
                    f"duplicate name, also defined in {seen[key].source}",
                    source=source,
                    document=document.label,
                    path="metadata.name",
                )
            seen[key] = document
            documents.append(document)
    return documents


def load_experiment(
    path: str | Path, extra_paths: Iterable[str | Path] = (), name: str | None = None
) -> LoadedExperiment:
    """The ChaosExperiment of `path` (the one called `name` if the file holds several),
    its cluster resolved among the documents of `path` and `extra_paths`."""
    extra = [p for p in extra_paths if Path(p) != Path(path)]
    documents = load_documents([path, *extra])
    candidates = [
        d
        for d in documents
        if d.source == str(path)
        and isinstance(d.resource, ChaosExperiment)
        and name in (None, d.resource.metadata.name)
    ]
    if len(candidates) != 1:
        if name is not None:
            raise SpecError(f"no ChaosExperiment named {name!r}", source=str(path))
        if not candidates:
            raise SpecError("no ChaosExperiment document", source=str(path))
        names = ", ".join(d.resource.metadata.name for d in candidates)
        raise SpecError(
            f"holds {len(candidates)} ChaosExperiments ({names}); pick one by name",
            source=str(path),
        )
    clusters = {
        d.resource.metadata.name: d for d in documents if isinstance(d.resource, BrokerCluster)
    }
    return resolve(candidates[0], clusters)


def resolve(document: Document, clusters: Mapping[str, Document]) -> LoadedExperiment:
    """Resolve an experiment's cluster and run the checks that need it."""
    experiment = document.resource
    assert isinstance(experiment, ChaosExperiment)
    source = cluster_source = Path(document.source)
    ref = experiment.spec.cluster.ref
    if ref is None:
        assert experiment.spec.cluster.inline is not None
        cluster = BrokerCluster.model_validate(
            {
                "apiVersion": API_VERSION,
                "kind": "BrokerCluster",
                "metadata": experiment.metadata,
                "spec": experiment.spec.cluster.inline,
            }
        )
    else:
        if ref not in clusters:
            files = sorted({d.source for d in clusters.values()} | {document.source})
            raise SpecError(
                f"no BrokerCluster named {ref!r} in {', '.join(files)}",
                source=document.source,
                document=document.label,
                path="spec.cluster.ref",
            )
        found = clusters[ref]
        cluster = found.resource  # type: ignore[assignment]
        cluster_source = Path(found.source)
        try:
            check_against_cluster(experiment.spec, cluster.spec, f"BrokerCluster/{ref}")
        except FieldError as exc:
            raise SpecError(
                exc.message,
                source=document.source,
                document=document.label,
                path=format_loc(("spec", *exc.loc)),
            ) from None
    return LoadedExperiment(
        experiment=experiment, cluster=cluster, source=source, cluster_source=cluster_source
    )
