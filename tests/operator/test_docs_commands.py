"""The Kubernetes commands of docs/operator.md and the README, run as far as they run
without a cluster, and scripts/images.sh's arguments.

Every command of the docs' shell blocks (and of their console samples' ``$`` lines), and
every ``kubectl``/``helm`` in their inline code, is read as a shell reads it; then

- each ``helm upgrade --install``/``install``/``template`` is rendered with helm_python with
  its ``--namespace`` and ``--set`` flags (there is no helm binary here), and ``kubectl
  apply -k``/``kubectl kustomize`` is built with kubectl's kustomize: the namespaces each
  install watches, which must be the same for every install the docs give;
- each ``kubectl apply -f FILE`` (or ``PRODUCER | kubectl apply -f -``, the producer run in
  bash) is loaded and given its ``-n`` as kubectl gives it (kubectl cannot apply, even with
  ``--dry-run=client``, without an API server to map the custom kinds): its objects must
  land in a watched namespace;
- every other kubectl command on namespaced objects must carry ``-n`` with a watched
  namespace and name objects the docs' commands make;
- ``make images VAR=...`` runs scripts/images.sh in dry run: what it pushes to a registry or
  loads into kind is what the docs' installs and BrokerClusters then pull.

Long (about 800 lines): a small shell reader (words, pipes, heredocs, as bash reads them)
and the checks of each command kind above share one walk over the docs' blocks.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from undertow.spec.cluster import DEFAULT_IMAGE

REPO = Path(__file__).resolve().parents[2]
OPERATOR_DOC = REPO / "docs" / "operator.md"
README = REPO / "README.md"
DOCS = (OPERATOR_DOC, README)
IMAGES_SH = REPO / "scripts" / "images.sh"
KUBECTL = shutil.which("kubectl")
NAMES = ("minibroker", "operator", "analysis")
TAG = yaml.safe_load((REPO / "helm" / "undertow" / "Chart.yaml").read_text())["appVersion"]

CRDS = {crd["spec"]["names"]["kind"]: crd
        for crd in (yaml.safe_load(p.read_text())
                    for p in sorted((REPO / "manifests" / "crds").glob("*.yaml")))}
CLUSTER_SCOPED_KINDS = {"Namespace", "CustomResourceDefinition", "ClusterRole",
                        "ClusterRoleBinding"}
# kubectl's names for what the docs' commands touch: (kind, namespaced).
RESOURCES: dict[str, tuple[str, bool]] = {
    **{name: (kind, True) for kind, crd in CRDS.items()
       for name in (crd["spec"]["names"]["plural"], crd["spec"]["names"]["singular"],
                    *crd["spec"]["names"].get("shortNames", []))},
    **{name: ("Deployment", True) for name in ("deployment", "deployments", "deploy")},
    **{name: ("ConfigMap", True) for name in ("configmap", "configmaps", "cm")},
    **{name: ("Job", True) for name in ("job", "jobs")},
    **{name: ("Pod", True) for name in ("pod", "pods", "po")},
    **{name: ("Event", True) for name in ("event", "events", "ev")},
    **{name: ("Namespace", False) for name in ("namespace", "namespaces", "ns")},
    **{name: ("CustomResourceDefinition", False)
       for name in ("crd", "crds", "customresourcedefinition", "customresourcedefinitions")},
}
# kubectl flags that take a value as the next word.
KUBECTL_VALUE_FLAGS = {"-f", "--filename", "-k", "--kustomize", "-o", "--output", "-p",
                       "--patch", "--type", "-l", "--selector", "--context", "-c",
                       "--container", "--sort-by", "--request-timeout", "--timeout", "--for"}
KUBECTL_SUBCOMMANDS = {"rollout", "config", "auth", "certificate"}
HELM_VALUE_FLAGS = {"-n", "--namespace", "--set", "--set-string", "-f", "--values",
                    "--timeout", "--version", "--kube-context"}
# What may run in front of `| kubectl apply -f -` here: it only rewrites the file.
OFFLINE_PRODUCERS = {"awk", "sed", "cat"}


# ---------------------------------------------------------------------------- reading docs

@dataclass(frozen=True)
class Command:
    """One command line: its pipeline's stages, and where the doc gives it."""

    where: str
    stages: tuple[tuple[str, ...], ...]

    @property
    def argv(self) -> tuple[str, ...]:
        """The last stage: kubectl in ``PRODUCER | kubectl apply -f -``."""
        return self.stages[-1]

    def __str__(self) -> str:
        return f"{self.where}: " + " | ".join(shlex.join(s) for s in self.stages)


FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`]+)`")


def split_line(line: str, where: str) -> list[Command]:
    """A shell line as the shell splits it: commands (``;``, ``&&``, ``||``), pipelines,
    redirections dropped, comments dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[Command] = []
    stages: list[tuple[str, ...]] = []
    words: list[str] = []
    tokens = iter(lexer)
    for token in tokens:
        if token in (";", "&&", "||", "&", "|"):
            if words:
                stages.append(tuple(words))
            words = []
            if token != "|" and stages:
                commands.append(Command(where, tuple(stages)))
                stages = []
        elif token in (">", ">>", "<", "2>", "&>"):
            next(tokens, None)
        else:
            words.append(token)
    if words:
        stages.append(tuple(words))
    if stages:
        commands.append(Command(where, tuple(stages)))
    return commands


def doc_commands(path: Path) -> list[Command]:
    """Every command of ``path``'s shell blocks and console samples, and its inline
    ``kubectl``/``helm`` code."""
    text = path.read_text()
    name = path.relative_to(REPO)
    found: list[Command] = []
    for block in FENCE.finditer(text):
        language, body = block.group(1), block.group(2)
        first = text.count("\n", 0, block.start(2)) + 1
        lines = body.splitlines()
        if language == "":  # a console sample: its "$ " lines are commands
            lines = [line[2:] if line.startswith("$ ") else "" for line in lines]
        elif language not in ("sh", "bash", "shell", "console"):
            continue
        logical, start = "", first
        for number, line in enumerate(lines, first):
            if not logical:
                start = number
            if line.endswith("\\"):
                logical += line[:-1] + " "
                continue
            logical += line
            if logical.strip():
                found.extend(split_line(logical, f"{name}:{start}"))
            logical = ""
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for span in INLINE.finditer(prose):
        code = " ".join(span.group(1).split())
        if code.split()[0] in ("kubectl", "helm"):
            line = prose.count("\n", 0, span.start()) + 1
            found.extend(split_line(code, f"{name}:{line} (inline)"))
    return found


def all_commands() -> list[Command]:
    return [c for doc in DOCS for c in doc_commands(doc)]


def program(command: Command) -> str:
    return command.argv[0] if command.argv else ""


# ------------------------------------------------------------------------------ kubectl

@dataclass
class Kubectl:
    """A kubectl command line, parsed as kubectl parses it."""

    namespace: str | None
    verb: str
    args: list[str]
    """The words after the verb (and its subcommand) that are not flags."""
    flags: dict[str, str | bool]

    @classmethod
    def parse(cls, argv: tuple[str, ...]) -> Kubectl:
        assert argv[0] == "kubectl"
        namespace: str | None = None
        positional: list[str] = []
        flags: dict[str, str | bool] = {}
        words = list(argv[1:])
        while words:
            word = words.pop(0)
            if word in ("-n", "--namespace"):
                namespace = words.pop(0)
            elif word.startswith("--namespace="):
                namespace = word.split("=", 1)[1]
            elif word.startswith("-n") and len(word) > 2 and not word.startswith("--"):
                namespace = word[2:]
            elif word.startswith("-") and word != "-":
                if "=" in word:
                    key, value = word.split("=", 1)
                    flags[key] = value
                elif word in KUBECTL_VALUE_FLAGS:
                    flags[word] = words.pop(0)
                else:
                    flags[word] = True
            else:
                positional.append(word)
        verb = positional[0] if positional else ""
        skip = 2 if verb in KUBECTL_SUBCOMMANDS else 1
        return cls(namespace, verb, positional[skip:], flags)

    def file(self) -> str | None:
        value = self.flags.get("-f", self.flags.get("--filename"))
        return value if isinstance(value, str) else None

    def kustomization(self) -> str | None:
        if self.verb == "kustomize":
            return self.args[0] if self.args else "."
        value = self.flags.get("-k", self.flags.get("--kustomize"))
        return value if isinstance(value, str) else None

    def targets(self) -> list[tuple[str, str | None]]:
        """(resource, name) pairs it acts on; name None for a whole type."""
        if not self.args:
            return []
        if "/" in self.args[0]:
            return [tuple(a.split("/", 1)) for a in self.args if "/" in a]  # type: ignore[misc]
        names = self.args[1:]
        if self.verb in ("label", "annotate"):  # then key=value and key- words
            names = [n for n in names if "=" not in n and not n.endswith("-")]
        types = self.args[0].split(",")
        if not names:
            return [(t, None) for t in types]
        return [(t, n) for t in types for n in names]

    def namespaced(self) -> bool:
        """Whether it acts on namespaced objects (a file's objects are: the docs apply
        BrokerClusters and ChaosExperiments)."""
        if self.file():
            return True
        return any(RESOURCES.get(resource, ("", True))[1] for resource, _ in self.targets())


# ------------------------------------------------------------------------------ installs

@dataclass
class Install:
    """What one install command of the docs makes, and the namespaces its operator
    watches."""

    command: Command
    objects: list[dict[str, Any]]
    watched: list[str]
    notes: str = ""
    release_namespace: str | None = None
    values: dict[str, Any] = field(default_factory=dict)

    def deployment(self) -> dict[str, Any]:
        (deployment,) = (o for o in self.objects if o["kind"] == "Deployment")
        return deployment

    def images(self) -> set[str]:
        """Every image the operator runs or puts in the pods it makes: the brokers' of a
        BrokerCluster that leaves spec.image at its default too."""
        container = self.deployment()["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        return {container["image"], env["UNDERTOW_OPERATOR_IMAGE"],
                env["UNDERTOW_ANALYSIS_IMAGE"], env["UNDERTOW_BROKER_IMAGE"]}

    def pull_policy(self) -> str:
        container = self.deployment()["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert container["imagePullPolicy"] == env["UNDERTOW_IMAGE_PULL_POLICY"]
        return str(container["imagePullPolicy"])


def merge(into: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value
    return into


def helm_args(argv: tuple[str, ...]) -> tuple[list[str], dict[str, list[str]], set[str]]:
    """helm's positional words, its value flags (every occurrence) and its boolean flags."""
    positional: list[str] = []
    values: dict[str, list[str]] = {}
    booleans: set[str] = set()
    words = list(argv[1:])
    while words:
        word = words.pop(0)
        if word.startswith("--") and "=" in word:
            key, value = word.split("=", 1)
            values.setdefault(key, []).append(value)
        elif word in HELM_VALUE_FLAGS:
            values.setdefault({"-n": "--namespace", "-f": "--values"}.get(word, word),
                              []).append(words.pop(0))
        elif word.startswith("-"):
            booleans.add(word)
        else:
            positional.append(word)
    return positional, values, booleans


def is_helm_install(command: Command) -> bool:
    words = helm_args(command.argv)[0] if program(command) == "helm" else []
    return bool(words) and words[0] in ("install", "upgrade", "template")


def render_helm(command: Command) -> Install:
    positional, flags, booleans = helm_args(command.argv)
    verb, release, chart_path = positional[:3]
    assert verb != "upgrade" or "--install" in booleans or "-i" in booleans, command
    (namespace,) = flags.get("--namespace", ["default"])
    values: dict[str, Any] = {}
    for path in flags.get("--values", []):
        merge(values, helm.values_from_yaml((REPO / path).read_text()))
    for expression in flags.get("--set", []):
        merge(values, helm.parse_set_string(expression))
    for expression in flags.get("--set-string", []):
        merge(values, helm.parse_set_string_values(expression))
    chart = helm.Chart.load(REPO / chart_path)
    rendered = chart.render(values, name=release, namespace=namespace, is_install=True)
    objects = [d for name, text in rendered.items() if name.endswith(".yaml")
               for d in yaml.safe_load_all(text) if d]
    notes = next((text for name, text in rendered.items() if name.endswith("NOTES.txt")), "")
    install = Install(command, objects, [], notes, namespace, values)
    env = {e["name"]: e.get("value") for e in
           install.deployment()["spec"]["template"]["spec"]["containers"][0]["env"]}
    install.watched = env["UNDERTOW_NAMESPACES"].split(",")
    return install


def build_kustomization(command: Command, directory: str) -> Install:
    built = subprocess.run([str(KUBECTL), "kustomize", str(REPO / directory)],
                           capture_output=True, text=True, check=True).stdout
    objects = [d for d in yaml.safe_load_all(built) if d]
    install = Install(command, objects, [])
    container = install.deployment()["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    if "UNDERTOW_NAMESPACES" in env:
        install.watched = env["UNDERTOW_NAMESPACES"]["value"].split(",")
    else:  # OperatorConfig.from_env: the pod's own namespace
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.namespace"
        install.watched = [install.deployment()["metadata"]["namespace"]]
    return install


@pytest.fixture(scope="module")
def installs() -> list[Install]:
    found: list[Install] = []
    for command in all_commands():
        if is_helm_install(command):
            found.append(render_helm(command))
        elif program(command) == "kubectl" and KUBECTL is not None:
            directory = Kubectl.parse(command.argv).kustomization()
            if directory is not None:
                found.append(build_kustomization(command, directory))
    return found


@pytest.fixture(scope="module")
def watched(installs: list[Install]) -> set[str]:
    """The namespaces every install of the docs watches."""
    namespaces = {frozenset(i.watched) for i in installs}
    assert len(namespaces) == 1, "the docs' installs watch different namespaces: " + \
        "; ".join(f"{i.command} watches {i.watched}" for i in installs)
    (only,) = namespaces
    return set(only)


def test_the_docs_give_both_installs(installs: list[Install]) -> None:
    """docs/operator.md installs with Helm and with kustomize; the README with Helm."""
    where = {(i.command.where.split(":")[0], program(i.command)) for i in installs}
    assert ("docs/operator.md", "helm") in where and ("README.md", "helm") in where
    if KUBECTL is not None:
        assert ("docs/operator.md", "kubectl") in where


def test_every_install_puts_its_objects_where_its_operator_watches(
        installs: list[Install], watched: set[str]) -> None:
    assert watched == {"undertow"}
    for install in installs:
        deployment = install.deployment()
        home = deployment["metadata"]["namespace"]
        assert deployment["metadata"]["name"] == "undertow-operator", install.command
        for obj in install.objects:
            namespace = obj["metadata"].get("namespace")
            if obj["kind"] in CLUSTER_SCOPED_KINDS:
                assert namespace is None, (install.command, obj["kind"])
            elif obj["kind"] in ("Role", "RoleBinding"):
                assert namespace in install.watched, (install.command, obj["metadata"])
            else:
                assert namespace == home, (install.command, obj["kind"], namespace)
        roles = sorted(o["metadata"]["namespace"] for o in install.objects
                       if o["kind"] == "Role")
        assert roles == sorted(install.watched), install.command
        for binding in (o for o in install.objects
                        if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
            assert binding["subjects"] == [{"kind": "ServiceAccount",
                                            "name": "undertow-operator",
                                            "namespace": home}], install.command
        kinds = {o["kind"] for o in install.objects}
        if program(install.command) == "kubectl":
            # kustomize makes its namespace, labelled for the fault agent
            (namespace,) = (o for o in install.objects if o["kind"] == "Namespace")
            assert namespace["metadata"]["name"] == home
            assert namespace["metadata"]["labels"][
                "pod-security.kubernetes.io/enforce"] == "privileged"
            assert {"CustomResourceDefinition", "Deployment", "Role"} <= kinds
        else:
            assert install.release_namespace == home
            assert {"Deployment", "Role", "ServiceAccount"} <= kinds
            # what `helm install` prints tells the user where to apply experiments
            told = re.findall(r"kubectl -n (\S+)", install.notes)
            assert told and set(told) <= set(install.watched), install.notes


def test_every_helm_install_names_and_creates_its_namespace() -> None:
    installs = [c for c in all_commands() if is_helm_install(c)]
    assert installs
    for command in installs:
        positional, flags, booleans = helm_args(command.argv)
        assert "--namespace" in flags, f"{command}: no --namespace"
        if positional[0] != "template":
            assert "--create-namespace" in booleans, f"{command}: no --create-namespace"


def kubectl_commands() -> list[Command]:
    """The docs' kubectl commands; not prose naming kubectl or a verb ("`kubectl describe`
    of every object")."""
    found = []
    for command in all_commands():
        if program(command) == "kubectl":
            kubectl = Kubectl.parse(command.argv)
            if kubectl.targets() or kubectl.file() or kubectl.kustomization():
                found.append(command)
    return found


@pytest.mark.parametrize("command", kubectl_commands(), ids=str)
def test_every_kubectl_command_names_a_watched_namespace(command: Command,
                                                         watched: set[str]) -> None:
    kubectl = Kubectl.parse(command.argv)
    if kubectl.verb in ("kustomize", "version", "config", "cluster-info") or \
            kubectl.kustomization() is not None:
        return  # cluster-wide, or kustomize names the namespace (checked above)
    if kubectl.namespaced():
        assert kubectl.namespace is not None, f"{command}: no -n (lands in 'default')"
        assert kubectl.namespace in watched, \
            f"{command}: -n {kubectl.namespace}, but the install watches {sorted(watched)}"
    else:  # a namespace itself: one the install watches
        for resource, name in kubectl.targets():
            if RESOURCES.get(resource, ("", True))[0] == "Namespace" and name:
                assert name in watched, command


def applied_objects(command: Command) -> list[dict[str, Any]]:
    """The objects ``kubectl [-n NS] apply|create -f FILE`` sends, with the namespace kubectl
    gives them (``-n``; an object naming another namespace is an error)."""
    kubectl = Kubectl.parse(command.argv)
    source = kubectl.file()
    assert source is not None
    if source == "-":
        producers = command.stages[:-1]
        assert producers, f"{command}: -f - with nothing piped in"
        for stage in producers:
            assert stage[0] in OFFLINE_PRODUCERS, f"{command}: cannot run {stage[0]} here"
        text = subprocess.run(["bash", "-c", " | ".join(shlex.join(s) for s in producers)],
                              cwd=REPO, capture_output=True, text=True, check=True).stdout
    else:
        text = (REPO / source).read_text()
    objects = [d for d in yaml.safe_load_all(text) if d]
    for obj in objects:
        if obj["kind"] in CLUSTER_SCOPED_KINDS:
            continue
        given = obj["metadata"].get("namespace")
        assert given in (None, kubectl.namespace), \
            f"{command}: the object's namespace {given} is not -n {kubectl.namespace}"
        obj["metadata"]["namespace"] = kubectl.namespace or "default"
    return objects


def apply_commands() -> list[Command]:
    return [c for c in kubectl_commands()
            if Kubectl.parse(c.argv).verb in ("apply", "create")
            and Kubectl.parse(c.argv).file() is not None]


@pytest.fixture(scope="module")
def made() -> dict[tuple[str, str], set[str]]:
    """(kind, namespace) -> names of the objects the docs' apply commands make, and those
    the operator then makes for them, by the names it gives them."""
    from undertow.kube.experiment_objects import experiment_names

    objects: dict[tuple[str, str], set[str]] = {}
    for command in apply_commands():
        for obj in applied_objects(command):
            namespace = obj["metadata"].get("namespace", "")
            objects.setdefault((obj["kind"], namespace), set()).add(obj["metadata"]["name"])
            if obj["kind"] == "ChaosExperiment":
                names = experiment_names(obj)
                objects.setdefault(("ConfigMap", namespace), set()).add(names.report)
                objects.setdefault(("Job", namespace), set()).update(
                    (names.runner, names.analysis))
    return objects


def test_the_docs_apply_experiments() -> None:
    assert len(apply_commands()) >= 3  # operator.md: Use, kind, a registry's broker image
    assert any(c.where.startswith("README.md") for c in apply_commands())


@pytest.mark.parametrize("command", apply_commands(), ids=str)
def test_applied_experiments_land_in_a_watched_namespace(command: Command,
                                                         watched: set[str]) -> None:
    from undertow.spec import BrokerCluster, ChaosExperiment

    objects = applied_objects(command)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == ["BrokerCluster", "ChaosExperiment"], command
    clusters = {o["metadata"]["name"]: o for o in objects if o["kind"] == "BrokerCluster"}
    for obj in objects:
        assert obj["metadata"]["namespace"] in watched, command
        if obj["kind"] == "BrokerCluster":
            BrokerCluster.model_validate(obj)
        else:
            experiment = ChaosExperiment.model_validate(obj)
            # the operator finds its cluster in its own namespace
            assert experiment.spec.cluster.ref in clusters, command
    stem = Path(Kubectl.parse(command.argv).file() or "-").stem
    if stem != "-":
        assert set(clusters) == {stem}, command


@pytest.mark.parametrize("command", kubectl_commands(), ids=str)
def test_kubectl_commands_name_objects_the_docs_make(
        command: Command, installs: list[Install],
        made: dict[tuple[str, str], set[str]]) -> None:
    kubectl = Kubectl.parse(command.argv)
    if kubectl.verb in ("apply", "create", "label") or kubectl.namespace is None:
        return
    for resource, name in kubectl.targets():
        kind = RESOURCES.get(resource, ("", True))[0]
        if name is None or name != name.lower():
            continue  # a whole type, or a placeholder (E, C)
        if kind == "Deployment":
            known = {o["metadata"]["name"] for i in installs for o in i.objects
                     if o["kind"] == "Deployment"}
        else:
            known = made.get((kind, kubectl.namespace), set())
        assert name in known, f"{command}: no {kind} {name} in {kubectl.namespace}"


def test_other_helm_commands_name_the_release_namespace(installs: list[Install]) -> None:
    releases = {i.release_namespace for i in installs if i.release_namespace}
    for command in (c for c in all_commands() if program(c) == "helm"
                    and not is_helm_install(c)):
        positional, flags, _ = helm_args(command.argv)
        if len(positional) < 2:
            continue  # the tool named in prose, no release
        assert flags.get("--namespace", [None])[0] in releases, command


# ------------------------------------------------------------------------ the sample output

def test_the_sample_get_output_has_the_crds_columns(watched: set[str]) -> None:
    text = OPERATOR_DOC.read_text()
    (block,) = (m.group(2) for m in FENCE.finditer(text)
                if m.group(1) == "" and m.group(2).startswith("$ kubectl"))
    command_line, *output = block.splitlines()
    kubectl = Kubectl.parse(tuple(shlex.split(command_line[2:])))
    assert kubectl.verb == "get" and kubectl.namespace in watched
    wide = kubectl.flags.get("-o") == "wide"
    tables = "\n".join(output).split("\n\n")
    types = kubectl.args[0].split(",")
    assert len(tables) == len(types), "kubectl prints one table per type, a blank line apart"
    for resource, table in zip(types, tables, strict=True):
        kind = RESOURCES[resource][0]
        crd = CRDS[kind]
        (version,) = crd["spec"]["versions"]
        columns = ["NAME"] + [c["name"].upper() for c in version["additionalPrinterColumns"]
                              if wide or c.get("priority", 0) == 0]
        header, *rows = table.splitlines()
        assert header.split() == columns, (kind, header)
        assert rows
        for row in rows:
            cells = row.split()
            assert len(cells) == len(columns), row
            assert cells[0].startswith(f"{crd['spec']['names']['singular']}."
                                       f"{crd['spec']['group']}/"), row
            # kubectl's columns line up under their headers
            for column in columns[1:]:
                at = header.index(column)
                assert row[at - 1] == " " and row[at] != " ", (row, column)


# ------------------------------------------------------------------- images: registry, kind

def images_sh(*args: str, path: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """scripts/images.sh in dry run, with only the environment given."""
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("IMAGE_REGISTRY", "KIND_CLUSTER", "IMAGE_TAG", "ENGINE",
                                "IMAGES_DRY_RUN")}
    environment.update({"IMAGES_DRY_RUN": "1", "ENGINE": "docker", **env})
    if path is not None:
        environment["PATH"] = path
    return subprocess.run([str(IMAGES_SH), *args], cwd=REPO, env=environment,
                          capture_output=True, text=True, check=False, timeout=60)


def ran(result: subprocess.CompletedProcess[str]) -> list[list[str]]:
    """The commands a dry run printed."""
    assert result.returncode == 0, result.stderr
    return [shlex.split(line[2:]) for line in result.stdout.splitlines()
            if line.startswith("+ ")]


@pytest.fixture
def fake_kind(tmp_path: Path) -> Iterator[str]:
    """A PATH whose kind does nothing (a dry run never calls it, but wants it present)."""
    kind = tmp_path / "bin" / "kind"
    kind.parent.mkdir()
    kind.write_text("#!/bin/sh\nexit 0\n")
    kind.chmod(kind.stat().st_mode | stat.S_IXUSR)
    yield f"{kind.parent}:{os.environ['PATH']}"


def without_kind() -> str:
    """PATH without any kind on it."""
    return ":".join(d for d in os.environ["PATH"].split(":")
                    if not (Path(d) / "kind").exists())


def test_images_sh_builds_locally_by_default() -> None:
    commands = ran(images_sh())
    assert commands[0] == ["scripts/base-image.sh"]
    builds = [c for c in commands if c[:2] == ["docker", "build"]]
    assert [c[c.index("-t") + 1] for c in builds] == [f"undertow/{n}:{TAG}" for n in NAMES]
    assert len(commands) == 1 + len(NAMES)  # no tag, push or load


@pytest.mark.parametrize("flag", [{"IMAGES_DRY_RUN": "1"}, {"IMAGES_DRY_RUN": "0"}])
def test_images_sh_dry_run_flag(flag: dict[str, str]) -> None:
    """--dry-run does what IMAGES_DRY_RUN=1 does."""
    assert ran(images_sh("--dry-run", "operator", **flag)) == ran(images_sh("operator"))


@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_images_sh_tags_and_pushes_to_the_registry(engine: str) -> None:
    commands = ran(images_sh("minibroker", "analysis", ENGINE=engine,
                             IMAGE_REGISTRY="registry.example.com/team/", IMAGE_TAG="7"))
    refs = [f"registry.example.com/team/undertow/{n}:7" for n in ("minibroker", "analysis")]
    assert [c for c in commands if c[1:2] in (["tag"], ["push"])] == [
        cmd for name, ref in zip(("minibroker", "analysis"), refs, strict=True)
        for cmd in ([engine, "tag", f"undertow/{name}:7", ref], [engine, "push", ref])]
    assert not [c for c in commands if c[0] == "kind"]


def test_images_sh_loads_into_kind_with_docker(fake_kind: str) -> None:
    commands = ran(images_sh(path=fake_kind, KIND_CLUSTER="dev"))
    assert [c for c in commands if c[0] == "kind"] == [
        ["kind", "load", "docker-image", f"undertow/{n}:{TAG}", "--name", "dev"]
        for n in NAMES]


def test_images_sh_loads_into_kind_with_podman_as_the_pods_name_them(fake_kind: str) -> None:
    """podman's local name is localhost/undertow/...; the pods ask for undertow/... =
    docker.io/undertow/..., so that is the name in the archive kind loads."""
    commands = ran(images_sh("operator", path=fake_kind, ENGINE="podman", KIND_CLUSTER="dev"))
    ref = f"docker.io/undertow/operator:{TAG}"
    assert ["podman", "tag", f"undertow/operator:{TAG}", ref] in commands
    (save,) = (c for c in commands if c[:2] == ["podman", "save"])
    archive = save[save.index("-o") + 1]
    assert save[-1] == ref and "docker-archive" in save
    assert ["kind", "load", "image-archive", archive, "--name", "dev"] in commands
    assert commands.index(save) < commands.index(
        ["kind", "load", "image-archive", archive, "--name", "dev"])


@pytest.mark.parametrize(("args", "env", "message"), [
    (("bogus",), {}, "unknown image bogus"),
    (("--push",), {}, "unknown option --push"),
    ((), {"IMAGE_REGISTRY": "https://registry.example.com"}, "no scheme"),
    ((), {"KIND_CLUSTER": "dev"}, "kind is not installed"),
])
def test_images_sh_refuses_what_it_cannot_do(args: tuple[str, ...], env: dict[str, str],
                                             message: str) -> None:
    result = images_sh(*args, path=without_kind(), **env)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "+ " not in result.stdout  # refused before building anything


def docker_reference(image: str) -> str:
    """The name a node's runtime gives ``image`` (docker.io for an unqualified one)."""
    first = image.split("/", 1)[0]
    if "/" not in image or not ("." in first or ":" in first or first == "localhost"):
        return f"docker.io/{image}"
    return image


def make_images_commands(path: Path) -> list[tuple[Command, dict[str, str]]]:
    found = []
    for command in doc_commands(path):
        if command.argv[:2] == ("make", "images"):
            found.append((command, dict(a.split("=", 1) for a in command.argv[2:])))
    return found


def test_the_registry_the_docs_push_to_is_the_one_their_pods_pull_from(
        installs: list[Install]) -> None:
    """`make images IMAGE_REGISTRY=R` pushes what the install with images.registry=R runs,
    the brokers of the BrokerClusters the docs apply among it (spec.image left at its
    default: the install's broker image)."""
    pushes = [(c, env) for c, env in make_images_commands(OPERATOR_DOC)
              if "IMAGE_REGISTRY" in env]
    assert pushes, "docs/operator.md does not say how to push the images"
    for _, env in pushes:
        registry = env["IMAGE_REGISTRY"]
        pushed = {c[-1] for c in ran(images_sh(**env)) if c[1:2] == ["push"]}
        assert pushed == {f"{registry}/undertow/{n}:{TAG}" for n in NAMES}
        pulling = [i for i in installs if i.values.get("images", {}).get("registry")]
        assert pulling, "no install of the docs sets images.registry"
        for install in pulling:
            assert install.images() <= pushed, (install.command, install.images(), pushed)
        clusters = [o for c in apply_commands() if c.where.startswith("docs/operator.md")
                    for o in applied_objects(c) if o["kind"] == "BrokerCluster"]
        assert clusters and all(o["spec"].get("image", DEFAULT_IMAGE) == DEFAULT_IMAGE
                                for o in clusters)


def test_the_kind_steps_load_what_the_pods_ask_for(installs: list[Install],
                                                    fake_kind: str) -> None:
    loads = [(c, env) for doc in DOCS for c, env in make_images_commands(doc)
             if "KIND_CLUSTER" in env and env["KIND_CLUSTER"] == env["KIND_CLUSTER"].lower()]
    assert loads, "the docs do not say how to load the images into kind"
    never = [i for i in installs if i.pull_policy() == "Never"]
    assert never, "no kind install of the docs sets images.pullPolicy=Never"
    for command, env in loads:
        kind_commands = [c for c in all_commands() if program(c) == "kind"
                         and c.where.split(":")[0] == command.where.split(":")[0]]
        assert ("kind", "create", "cluster", "--name", env["KIND_CLUSTER"]) in \
            [c.argv for c in kind_commands], command
        for engine in ("docker", "podman"):
            commands = ran(images_sh(path=fake_kind, ENGINE=engine, **env))
            if engine == "docker":
                loaded = {docker_reference(c[3]) for c in commands if c[:3] == [
                    "kind", "load", "docker-image"]}
            else:
                loaded = {c[-1] for c in commands if c[:2] == ["podman", "save"]}
            assert sum(c[0] == "kind" for c in commands) == len(NAMES)
            for install in never:
                wanted = {docker_reference(i) for i in install.images()}
                assert wanted | {docker_reference(DEFAULT_IMAGE)} <= loaded, (engine, loaded)


# --------------------------------------------------------------- what e2e-pods says it runs

def pods_experiments() -> list[tuple[str, str]]:
    """(experiment, expected verdict) as tests/pods parametrizes its end-to-end test."""
    tree = ast.parse((REPO / "tests" / "pods" / "test_e2e_pods.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "parametrize":
            names = ast.literal_eval(node.args[0])
            if "experiment" in names:
                rows = ast.literal_eval(node.args[1])
                return [(row[names.index("experiment")], row[names.index("expected")])
                        for row in rows]
    raise AssertionError("tests/pods/test_e2e_pods.py parametrizes no experiment")


def named(text: str) -> list[str]:
    library = {p.stem for p in (REPO / "experiments").glob("*.yaml")}
    return [m.group(0) for m in re.finditer(r"(?<![\w-])[a-z0-9]+(?:-[a-z0-9]+)+(?![\w-])",
                                            text) if m.group(0) in library]


def test_what_e2e_pods_says_it_runs_is_what_tests_pods_runs() -> None:
    expected = pods_experiments()
    makefile = (REPO / "Makefile").read_text().splitlines()
    target = next(i for i, line in enumerate(makefile) if line.startswith("e2e-pods:"))
    comment_lines: list[str] = []
    for line in reversed(makefile[:target]):
        if not line.startswith("#"):
            break
        comment_lines.insert(0, line)
    comment = "\n".join(comment_lines)
    readme = next(line for line in README.read_text().splitlines()
                  if "make e2e-pods" in line and line.startswith("- "))
    for where, text in (("Makefile", comment), ("README.md", readme)):
        assert named(text) == [e for e, _ in expected], where
        assert re.findall(r"\b(loss|clean)\b", text)[:len(expected)] == \
            [v for _, v in expected], where
