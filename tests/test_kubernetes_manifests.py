"""examples/kubernetes/: every manifest is checked against Kubernetes' own API types (the
`kubernetes` client's models, generated from its OpenAPI schema: no unknown field, the
right type at each place, required fields present), and each worker pod's environment,
as Kubernetes fills it in, becomes the job's layout through tf_bps's placement."""

from pathlib import Path

import pytest

kubernetes = pytest.importorskip("kubernetes")
yaml = pytest.importorskip("yaml")

from tf_bps.runtime.config import Config  # noqa: E402

MANIFESTS = sorted((Path(__file__).resolve().parents[1] / "examples/kubernetes").glob("*.yaml"))
_PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float)}


def _check(value, kind: str, where: str) -> list[str]:
    """What in `value` does not fit the API type `kind` (the models' openapi_types)."""
    # The client writes containers as List[T] and Dict[str, T] (list[T], dict(str, T)
    # in older releases).
    if kind.lower().startswith("list["):
        if not isinstance(value, list):
            return [f"{where}: a list expected, not {value!r}"]
        return [e for i, item in enumerate(value) for e in _check(item, kind[5:-1],
                                                                   f"{where}[{i}]")]
    if kind.lower().startswith(("dict(", "dict[")):
        if not isinstance(value, dict):
            return [f"{where}: a map expected, not {value!r}"]
        inner = kind[5:-1].split(", ", 1)[1]
        return [e for key, item in value.items() for e in _check(item, inner,
                                                                  f"{where}.{key}")]
    if kind == "object":  # int-or-string and quantities
        return []
    if kind in _PRIMITIVES:
        fits = isinstance(value, _PRIMITIVES[kind]) and not (kind == "int" and
                                                             isinstance(value, bool))
        return [] if fits else [f"{where}: a {kind} expected, not {value!r}"]
    model = getattr(kubernetes.client.models, kind)
    if not isinstance(value, dict):
        return [f"{where}: a {kind} expected, not {value!r}"]
    fields = {json_name: attribute for attribute, json_name in model.attribute_map.items()}
    errors = [f"{where}.{key}: no such field in {kind}" for key in value if key not in fields]
    return errors + [e for key, item in value.items() if key in fields
                     for e in _check(item, model.openapi_types[fields[key]],
                                     f"{where}.{key}")]


def _documents():
    return [(path.name, index, document) for path in MANIFESTS
            for index, document in enumerate(yaml.safe_load_all(path.read_text()))]


def _model_name(document: dict) -> str:
    version = document["apiVersion"].split("/")[-1]
    return version.capitalize() + document["kind"]


@pytest.mark.parametrize("name,index,document", _documents(),
                         ids=[f"{n}#{i}" for n, i, _ in _documents()])
def test_each_manifest_fits_the_kubernetes_api(name, index, document):
    kind = _model_name(document)
    assert _check(document, kind, kind) == []
    # Required fields: the models refuse to be built without them.
    kubernetes.client.ApiClient()._ApiClient__deserialize(document, kind)


def _pod_environment(job: dict, index: int) -> dict[str, str]:
    """A worker pod's variables as Kubernetes sets them (secrets stand in)."""
    [container] = job["spec"]["template"]["spec"]["containers"]
    env = {"JOB_COMPLETION_INDEX": str(index), "HOSTNAME": f"{job['metadata']['name']}-{index}"}
    for variable in container.get("env", []):
        env[variable["name"]] = variable.get("value", "a-secret-of-the-job-0123456789")
    return env


FIXED_SIZE = [path for path in MANIFESTS if not path.name.startswith("elastic")]


@pytest.mark.parametrize("path", FIXED_SIZE, ids=[p.name for p in FIXED_SIZE])
def test_the_worker_pods_make_one_job(path):
    documents = list(yaml.safe_load_all(path.read_text()))
    [service] = [d for d in documents if d["kind"] == "Service"]
    jobs = [d for d in documents if d["kind"] == "Job"]
    workers = [j for j in jobs if j["spec"]["template"]["spec"].get("subdomain")]
    assert len(workers) == 1, "one Job of worker pods, in the Service"
    [job] = workers
    spec, pod = job["spec"], job["spec"]["template"]
    assert spec["completionMode"] == "Indexed" and spec["parallelism"] == spec["completions"]
    assert pod["spec"]["subdomain"] == service["metadata"]["name"]
    selector = service["spec"]["selector"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    size = spec["completions"]
    layouts = [Config.from_env(_pod_environment(job, index)) for index in range(size)]
    assert [c.rank for c in layouts] == list(range(size))
    assert {(c.size, c.root_uri, c.root_port, c.num_server) for c in layouts} == {
        (size, f"{job['metadata']['name']}-0.{service['metadata']['name']}",
         layouts[0].root_port, layouts[0].num_server)}
    assert [c.cluster.starts_scheduler for c in layouts] == [True] + [False] * (size - 1)
    servers = [j for j in jobs if j is not job]
    if servers:  # Server pods of their own: the workers start none.
        [server_job] = servers
        assert layouts[0].num_server == server_job["spec"]["completions"]
        assert not any(c.cluster.starts_server for c in layouts)
        server_env = _pod_environment(server_job, 0)
        assert server_env["DMLC_ROLE"] == "server"
        server = Config.from_env(server_env)
        assert (server.size, server.root_uri, server.root_port) == (
            size, layouts[0].root_uri, layouts[0].root_port)
    else:
        assert all(c.cluster.starts_server for c in layouts)
        assert layouts[0].num_server == size


def test_the_check_finds_what_kubectl_would_refuse():
    [job] = [d for n, _, d in _documents() if n == "cpu-job.yaml" and d["metadata"]["name"]
             == "mnist"]
    spec = {**job["spec"], "completion": 4, "parallelism": "4"}
    assert _check({**job, "spec": spec}, "V1Job", "V1Job") == [
        "V1Job.spec.completion: no such field in V1JobSpec",
        "V1Job.spec.parallelism: a int expected, not '4'"]


def test_the_elastic_job_discovers_its_worker_pods_and_may_list_them():
    documents = list(yaml.safe_load_all((MANIFESTS[0].parent / "elastic-job.yaml").read_text()))
    by_kind = {d["kind"]: d for d in documents}
    workers, launcher = by_kind["Deployment"], by_kind["Job"]
    [container] = launcher["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    discovery = command[command.index("--host-discovery-script") + 1].split()
    assert discovery[:3] == ["python", "-m", "tf_bps.launch.kubernetes_discovery"]
    selector = dict(pair.split("=") for pair in discovery[discovery.index("-l") + 1].split(","))
    assert selector == workers["spec"]["selector"]["matchLabels"]
    assert selector.items() <= workers["spec"]["template"]["metadata"]["labels"].items()
    # The launcher's account may list pods, which is all the discovery asks.
    account = launcher["spec"]["template"]["spec"]["serviceAccountName"]
    binding = by_kind["RoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    assert binding["roleRef"]["name"] == by_kind["Role"]["metadata"]["name"]
    assert {"list"} <= set(by_kind["Role"]["rules"][0]["verbs"])
    # bpslaunch reaches the pods' sshd on the port the workers open.
    port = workers["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert command[command.index("--ssh-port") + 1] == str(port)


def test_discovery_lists_ready_pods_that_are_not_being_deleted():
    from tf_bps.launch.kubernetes_discovery import ready_hosts

    models = kubernetes.client

    def pod(name, ip, phase="Running", ready="True", deleting=False):
        return models.V1Pod(
            metadata=models.V1ObjectMeta(
                name=name, deletion_timestamp="2026-11-28T00:00:00Z" if deleting else None),
            status=models.V1PodStatus(phase=phase, pod_ip=ip, conditions=[
                models.V1PodCondition(type="Ready", status=ready)]))

    pods = [pod("w-3", "10.0.0.3"), pod("w-1", "10.0.0.1"), pod("w-2", "10.0.0.2",
                                                              ready="False"),
            pod("w-4", "10.0.0.4", deleting=True), pod("w-5", None, phase="Pending"),
            pod("w-6", "10.0.0.6", phase="Succeeded")]
    assert ready_hosts(pods, slots=2) == ["10.0.0.1:2", "10.0.0.3:2"]
