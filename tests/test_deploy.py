"""Static checks of the deployment files in ``deploy/`` (image, compose, Kubernetes, Prometheus,
Grafana) against the code they deploy: setting names and defaults from ``streamdedup.settings``,
metric names and labels from ``streamdedup.stream.metrics`` and faust's sensor.  No network, no
docker; ``promtool`` (Debian's ``prometheus`` package, installed by
``deploy/local/install-debian-packages.sh``) checks the Prometheus files and runs the alert unit
tests, and is required: the test fails, never skips, without it."""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_files import (
    DASHBOARD,
    DEPLOY,
    JOB,
    ROOT,
    dashboard_queries,
    dashboard_variables,
    iter_panels,
    iter_rules,
    known_metrics,
    load_dashboard,
    load_yaml_documents,
    local_prometheus_config,
    promql_label_names,
    promql_label_values,
    promql_metric_names,
)

from streamdedup.settings import ENV_PREFIX, TOPIC_FIELDS, Settings

PROM_DIR = DEPLOY / "prometheus"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
README = DEPLOY / "README.md"
DEFAULTS = Settings()
SETTING_ENV = {f.metadata["env"] for f in fields(Settings)}
#: Process overhead of a worker beyond its index (Python, numpy, faust, batches); see README "Sizing".
PROCESS_OVERHEAD_BYTES = 300_000_000
#: Labels Prometheus adds to every series of a target (job, instance; pod and namespace in k8s).
TARGET_LABELS = {"job", "instance", "pod", "namespace"}


# ---------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool") or "/usr/bin/promtool"
    if not os.access(path, os.X_OK):
        pytest.fail(
            "promtool not found (Debian package prometheus); install it with "
            "deploy/local/install-debian-packages.sh, or run `make install`"
        )
    return path


def run_promtool(promtool: str, *args: str, cwd: Path = PROM_DIR) -> str:
    r = subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"promtool {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def settings_from(env: dict[str, Any], where: str) -> Settings:
    env = {k: str(v) for k, v in env.items() if k.startswith(ENV_PREFIX)}
    try:
        return Settings.from_sources({}, env)
    except ValueError as e:
        pytest.fail(f"{where}: the STREAMDEDUP_* values are not valid settings: {e}")


def env_names_in(text: str) -> set[str]:
    return set(re.findall(rf"\b{ENV_PREFIX}[A-Z0-9_]+", text))


def quantity_bytes(q: str | int) -> int:
    """Kubernetes / compose memory quantities: 4Gi, 512Mi, 2g, 3758096384."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]i?|[kmgt]b?|)", str(q).strip())
    assert m, f"cannot read the memory quantity {q!r}"
    unit = m.group(2)
    power = {"k": 1, "m": 2, "g": 3, "t": 4}.get(unit[:1].lower(), 0)
    base = 1000 if unit[:1].isupper() and not unit.endswith("i") else 1024
    return int(float(m.group(1)) * base**power)


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


def compose_workers() -> dict[str, dict[str, Any]]:
    return {
        name: s
        for name, s in compose()["services"].items()
        if s.get("build", {}).get("dockerfile") == "deploy/Dockerfile"
    }


def k8s_objects() -> dict[str, dict[str, Any]]:
    """kind -> the object, for the manifests kustomization.yaml applies."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    out: dict[str, dict[str, Any]] = {}
    for resource in kustomization["resources"]:
        for doc in load_yaml_documents(K8S / resource):
            assert doc["kind"] not in out, f"two {doc['kind']} objects; the tests expect one of each"
            out[doc["kind"]] = doc
    return out


def worker_container() -> dict[str, Any]:
    (c,) = k8s_objects()["StatefulSet"]["spec"]["template"]["spec"]["containers"]
    return c


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    out = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            op, _, args = line.strip().partition(" ")
            out.append((op.upper(), args.strip()))
    return out


def final_stage() -> list[tuple[str, str]]:
    ins = dockerfile_instructions()
    start = max(i for i, (op, _) in enumerate(ins) if op == "FROM")
    return ins[start:]


def dockerfile_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for op, args in final_stage():
        if op == "ENV":
            for item in shlex.split(args):
                k, _, v = item.partition("=")
                env[k] = v
    return env


def healthcheck_command() -> str:
    (args,) = [a for op, a in final_stage() if op == "HEALTHCHECK"]
    cmd = re.split(r"\bCMD\s+", args, maxsplit=1)[1]
    assert not cmd.startswith("["), "the test runs the shell form of HEALTHCHECK CMD"
    return cmd


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` (relative to the repo root) out of the build context:
    the last pattern that matches the path or one of its parent directories decides."""
    patterns = [
        p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines() if p.strip() and not p.startswith("#")
    ]
    parts = Path(path).parts
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for p in patterns:
        negate, p = p.startswith("!"), p.lstrip("!").strip("/")
        regex = "".join(
            "(?:.*/)?"
            if tok == "**/"
            else ".*"
            if tok == "**"
            else "[^/]*"
            if tok == "*"
            else "[^/]"
            if tok == "?"
            else re.escape(tok)
            for tok in re.findall(r"\*\*/|\*\*|\*|\?|[^*?]+", p)
        )
        if any(re.fullmatch(regex, c) for c in candidates):
            ignored = not negate
    return ignored


def alerting_rules() -> list[dict[str, Any]]:
    return [r for r in iter_rules() if "alert" in r]


def github_anchors(markdown: str) -> set[str]:
    anchors = set()
    for heading in re.findall(r"^#+\s+(.+?)\s*$", markdown, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def all_promql() -> list[tuple[str, str]]:
    """(where, expr) for the dashboard queries, its variable queries and the rules."""
    out = [(f"dashboard panel {title!r} {ref}", expr) for title, ref, expr in dashboard_queries()]
    for v in load_dashboard()["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append((f"dashboard variable {v['name']}", re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", q)))
    out += [(f"rule {r.get('alert') or r.get('record')}", r["expr"]) for r in iter_rules()]
    return out


# ---------------------------------------------------------------------------- every file parses


@pytest.mark.parametrize(
    "path", sorted(p.relative_to(ROOT) for p in DEPLOY.rglob("*.y*ml") if "local" not in p.parts), ids=str
)
def test_yaml_parses(path):
    docs = load_yaml_documents(ROOT / path)
    assert docs, f"{path} is empty"


def test_pyyaml_is_a_test_dependency():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(re.match(r"pyyaml\b", d, re.I) for d in extras["test"])


# ---------------------------------------------------------------------------- settings in the files


@pytest.mark.parametrize("path", [DOCKERFILE, COMPOSE, *sorted(K8S.glob("*.yaml")), README], ids=lambda p: p.name)
def test_every_streamdedup_variable_is_a_setting(path):
    """Comments included: a commented-out example must be right when someone uncomments it."""
    unknown = env_names_in(path.read_text(encoding="utf-8")) - SETTING_ENV
    assert not unknown, (
        f"{path.relative_to(ROOT)} names {sorted(unknown)}, which are not settings "
        f"(fields(Settings) metadata['env']: {sorted(SETTING_ENV)})"
    )


def test_dockerfile_env_and_ports():
    env = dockerfile_env()
    settings_from(env, "Dockerfile ENV")
    assert env["STREAMDEDUP_WEB_HOST"] == "0.0.0.0", (
        "inside a container the web server must listen on all interfaces, or nothing outside reaches /metrics"
    )
    stage = final_stage()
    assert [a for op, a in stage if op == "EXPOSE"] == [str(DEFAULTS.web_port)]
    (volume,) = [json.loads(a) for op, a in stage if op == "VOLUME"]
    assert volume == [env["STREAMDEDUP_DATA_DIR"]], "the data volume must be the snapshot directory"
    assert [a for op, a in stage if op == "WORKDIR"][-1] == env["STREAMDEDUP_DATA_DIR"]
    health = healthcheck_command()
    assert "/metrics" in health and "STREAMDEDUP_WEB_PORT" in health
    assert f"'{DEFAULTS.web_port}'" in health, "the healthcheck's default port must be the web port default"


def test_dockerfile_image_user_and_entrypoint():
    ins = dockerfile_instructions()
    args = dict(a.split("=", 1) for op, a in ins if op == "ARG" and "=" in a)
    bases = [a.split()[0] for op, a in ins if op == "FROM"]
    resolved = [re.sub(r"\$\{?(\w+)\}?", lambda m: args[m.group(1)], b) for b in bases]
    assert resolved[-1] == "python:3.11-slim", resolved
    assert all(b.startswith("python:3.11-slim") for b in resolved)
    users = [a for op, a in final_stage() if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "the worker must not run as root"
    (entrypoint,) = [json.loads(a) for op, a in final_stage() if op == "ENTRYPOINT"]
    assert entrypoint == ["streamdedup", "worker"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "streamdedup" in scripts, "the entrypoint runs the package's console script"
    assert any(op == "RUN" and re.search(r"pip install \.(\s|$)", a) for op, a in ins)
    assert any(op == "COPY" and a.startswith("--from=build") for op, a in final_stage())


def test_dockerfile_builds_the_c_walk_and_ships_no_compiler():
    # deploy/README: the build stage has gcc for the C text walk; the runtime image has no compiler
    ins = dockerfile_instructions()
    final = final_stage()
    build = ins[: len(ins) - len(final)]
    assert any(op == "RUN" and re.search(r"apt-get install .*\bgcc\b", a) for op, a in build)
    assert not any(op == "RUN" and "gcc" in a for op, a in final)
    assert any(op == "COPY" and "setup.py" in shlex.split(a) for op, a in build), "setup.py builds the C walk"


def test_dockerfile_copies_only_what_the_context_has():
    """`docker build -f deploy/Dockerfile .`: every COPY source exists at the repo root and is not
    excluded by .dockerignore, and the context leaves out what must not go in."""
    sources = []
    for op, a in dockerfile_instructions():
        if op == "COPY" and not a.startswith("--from"):
            sources += [s for s in shlex.split(a)[:-1] if not s.startswith("--")]
    assert sources
    for s in sources:
        assert (ROOT / s).exists(), f"COPY {s}: not in the repository root (the build context)"
        assert not dockerignored(s), f"COPY {s}: excluded by .dockerignore"
    readme = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["readme"]
    assert readme in sources, "pip install . reads the readme named in pyproject.toml"
    for p in ["streamdedup/settings.py", "streamdedup/stream/metrics.py"]:
        assert not dockerignored(p), p
    for p in [
        ".venv/bin/python",
        ".git/HEAD",
        "deploy/local/lib/kafka_2.13-3.9.1.jar",
        "bench/README.md",
        "tests/test_deploy.py",
        "streamdedup/__pycache__/cli.cpython-311.pyc",
        "demo-verdicts.jsonl",
    ]:
        assert dockerignored(p), f"{p} would be sent to the docker build"


def test_healthcheck_command_runs(tmp_path):
    """The HEALTHCHECK one-liner (quoting and all) passes on a 200 from /metrics and fails otherwise."""
    status = {"code": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            code = status["code"] if self.path == "/metrics" else 404
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"# metrics\n")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "STREAMDEDUP_WEB_PORT": str(server.server_address[1]),
        }

        def check() -> int:
            return subprocess.run(
                ["/bin/sh", "-c", healthcheck_command()], env=env, capture_output=True, timeout=30
            ).returncode

        assert check() == 0
        status["code"] = 500
        assert check() == 1
    finally:
        server.shutdown()
        server.server_close()
    assert check() == 1  # nothing listening


# ---------------------------------------------------------------------------- compose


def test_compose_services():
    services = compose()["services"]
    assert {"kafka", "prometheus", "grafana"} <= set(services)
    assert len(compose_workers()) >= 2, "two workers, to show the consumer group sharing the partitions"
    assert services["kafka"]["image"] == "apache/kafka:3.9.1"
    for name, s in services.items():
        for port in s.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"


def test_compose_kafka_listeners_match_the_workers():
    kafka = compose()["services"]["kafka"]["environment"]
    assert set(kafka["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}, "KRaft, one node"
    listeners = dict(item.split("://") for item in kafka["KAFKA_LISTENERS"].split(","))
    advertised = dict(item.split("://") for item in kafka["KAFKA_ADVERTISED_LISTENERS"].split(","))
    protocols = dict(item.split(":") for item in kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) == set(protocols) and set(advertised) <= set(listeners)
    assert kafka["KAFKA_CONTROLLER_LISTENER_NAMES"] in listeners
    voter_port = kafka["KAFKA_CONTROLLER_QUORUM_VOTERS"].rsplit(":", 1)[1]
    assert listeners[kafka["KAFKA_CONTROLLER_LISTENER_NAMES"]].endswith(f":{voter_port}")
    for name, w in compose_workers().items():
        s = settings_from(w["environment"], f"compose {name}")
        assert s.brokers == (advertised[kafka["KAFKA_INTER_BROKER_LISTENER_NAME"]],), (
            f"{name} must use the broker's advertised in-network listener"
        )
        assert str(kafka["KAFKA_NUM_PARTITIONS"]) == str(s.partitions), (
            "auto-created topics must get the workers' partition count"
        )


def test_compose_workers():
    workers = compose_workers()
    volumes = compose().get("volumes", {})
    seen = set()
    for name, w in workers.items():
        assert (COMPOSE.parent / w["build"]["context"]).resolve() == ROOT
        assert (ROOT / w["build"]["dockerfile"]).resolve() == DOCKERFILE
        s = settings_from(w["environment"], f"compose {name}")
        assert s.web_host == "0.0.0.0" and s.web_port == DEFAULTS.web_port
        for field in TOPIC_FIELDS:
            assert getattr(s, field) == getattr(DEFAULTS, field), f"{name}: {field}"
        mounts = dict(v.split(":")[:2][::-1] for v in w["volumes"])  # target -> source
        source = mounts.get(str(s.data_dir))
        assert source in volumes, f"{name}: STREAMDEDUP_DATA_DIR must be on a named volume"
        assert source not in seen, f"{name}: shares its data volume with another worker"
        seen.add(source)
        assert s.index_memory_limit > 0
        assert s.index_memory_limit + PROCESS_OVERHEAD_BYTES <= quantity_bytes(w["mem_limit"]), (
            f"{name}: the index limit leaves no room for the process under mem_limit"
        )
        assert s.partitions >= len(workers)
    topics_job = compose()["services"]["topics"]["environment"]
    for field in TOPIC_FIELDS + ("partitions", "brokers"):
        env = Settings.__dataclass_fields__[field].metadata["env"]
        assert {str(w["environment"][env]) for w in workers.values()} == {str(topics_job[env])}, env


def test_compose_prometheus_and_grafana_mounts():
    services = compose()["services"]
    prom = services["prometheus"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in prom["volumes"]}
    config = next(a.split("=", 1)[1] for a in prom["command"] if a.startswith("--config.file="))
    host_dir = mounts[str(Path(config).parent)]
    assert (COMPOSE.parent / host_dir / Path(config).name).resolve() == (PROM_DIR / "prometheus.yml")
    graf = services["grafana"]
    mounts = {
        v.split(":")[1]: (COMPOSE.parent / v.split(":")[0]).resolve() for v in graf["volumes"] if v.startswith(".")
    }
    assert mounts["/etc/grafana/provisioning"] == DEPLOY / "grafana" / "provisioning"
    (provider,) = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/streamdedup.yml").read_text())["providers"]
    assert mounts[provider["options"]["path"]] == DASHBOARD.parent
    home = graf["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(home).parent == Path(provider["options"]["path"]) and Path(home).name == DASHBOARD.name
    (ds,) = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())["datasources"]
    assert ds["url"] == "http://prometheus:9090" and "prometheus" in services


def test_compose_scrape_targets_are_the_workers():
    config = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == JOB]
    targets = {t for sc in job["static_configs"] for t in sc["targets"]}
    expected = {f"{name}:{settings_from(w['environment'], name).web_port}" for name, w in compose_workers().items()}
    assert targets == expected
    assert job.get("metrics_path", "/metrics") == "/metrics"


# ---------------------------------------------------------------------------- kubernetes


def test_k8s_kustomization_lists_every_manifest():
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    examples = {p for p in present if ".example." in p}
    assert listed == present - examples, "every manifest but the examples is applied"
    for p in K8S.glob("*.yaml"):
        for doc in load_yaml_documents(p):
            if doc.get("kind") != "Kustomization":
                assert doc["apiVersion"] and doc["metadata"]["name"], p.name
                assert "namespace" not in doc["metadata"], f"{p.name}: manifests are namespace-agnostic"


def test_k8s_configmap_is_valid_settings():
    cm = k8s_objects()["ConfigMap"]
    s = settings_from(cm["data"], "ConfigMap")
    assert set(cm["data"]) <= SETTING_ENV
    assert s.web_host == "0.0.0.0" and s.web_port == DEFAULTS.web_port
    for field in TOPIC_FIELDS:
        assert getattr(s, field) == getattr(DEFAULTS, field), field
    for b in s.brokers:
        assert b.endswith(":9092"), "brokers on Kafka's default port, as in compose"


def test_k8s_workload_service_and_probes():
    objs = k8s_objects()
    sts, svc, pdb, cm = objs["StatefulSet"], objs["Service"], objs["PodDisruptionBudget"], objs["ConfigMap"]
    s = settings_from(cm["data"], "ConfigMap")
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    for selector in (
        sts["spec"]["selector"]["matchLabels"],
        svc["spec"]["selector"],
        pdb["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= pod_labels.items()
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    c = worker_container()
    assert c["envFrom"] == [{"configMapRef": {"name": cm["metadata"]["name"]}}]
    assert "command" not in c and "args" not in c, "the image's entrypoint, configured by the env only"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": s.web_port}
    (sp,) = svc["spec"]["ports"]
    assert sp["port"] == s.web_port and sp["targetPort"] == "metrics"
    ann = svc["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == str(s.web_port)
    assert ann["prometheus.io/path"] == "/metrics"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}, probe
    assert 1 <= sts["spec"]["replicas"] <= s.partitions, "workers beyond the partition count sit idle"


def test_k8s_memory_sizing_is_consistent():
    s = settings_from(k8s_objects()["ConfigMap"]["data"], "ConfigMap")
    res = worker_container()["resources"]
    limit = quantity_bytes(res["limits"]["memory"])
    assert quantity_bytes(res["requests"]["memory"]) == limit, "memory is not overcommitted"
    assert res["requests"]["cpu"] and res["limits"]["cpu"]
    assert 0 < s.index_memory_limit <= limit - PROCESS_OVERHEAD_BYTES, (
        "STREAMDEDUP_INDEX_MEMORY_LIMIT must leave the process overhead under the container limit"
    )
    # The per-page budget is written in two places (the manifest's arithmetic and the README):
    figures = {
        p.name: set(re.findall(r"~?([\d,]+) bytes per page", p.read_text())) for p in (K8S / "statefulset.yaml", README)
    }
    assert all(figures.values()) and len(set.union(*figures.values())) == 1, figures


def test_k8s_volumes_and_security():
    sts = k8s_objects()["StatefulSet"]
    s = settings_from(k8s_objects()["ConfigMap"]["data"], "ConfigMap")
    pod = sts["spec"]["template"]["spec"]
    c = worker_container()
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts[str(s.data_dir)] in {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
    user = [a for op, a in final_stage() if op == "USER"][-1].split(":")[0]
    assert pod["securityContext"]["runAsUser"] == int(user) and pod["securityContext"]["runAsNonRoot"]
    assert pod["securityContext"]["fsGroup"] == int(user), "the data volume must be writable by the worker"
    # The commented SASL example: the password file is the key of the example Secret, in its mount.
    cm_text = (K8S / "configmap.yaml").read_text()
    (path,) = re.findall(r'STREAMDEDUP_SASL_PASSWORD_FILE:\s*"([^"]+)"', cm_text)
    secret = load_yaml_documents(K8S / "sasl-secret.example.yaml")[0]
    vol = next(v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == secret["metadata"]["name"])
    assert vol["secret"]["optional"] is True, "PLAINTEXT deployments have no Secret"
    assert mounts[str(Path(path).parent)] == vol["name"] and Path(path).name in secret["stringData"]


# ---------------------------------------------------------------------------- prometheus


def test_promtool_check_config(promtool, tmp_path):
    run_promtool(promtool, "check", "config", "prometheus.yml")
    local = tmp_path / "prometheus.yml"
    local.write_text(local_prometheus_config([f"127.0.0.1:{DEFAULTS.web_port}"]))
    run_promtool(promtool, "check", "config", str(local))
    assert yaml.safe_load(local.read_text())["scrape_configs"][0]["static_configs"][0]["targets"] == [
        f"127.0.0.1:{DEFAULTS.web_port}"
    ]


def test_promtool_check_k8s_scrape_config(promtool, tmp_path):
    """Debian's promtool is built without Kubernetes service discovery, so the discovery block is
    swapped for a static one; the relabelling, the job and the rule files are checked as they are."""
    config = yaml.safe_load((PROM_DIR / "prometheus-k8s.yml").read_text())
    config["rule_files"] = [str(PROM_DIR / f) for f in config["rule_files"]]
    (job,) = config["scrape_configs"]
    assert job["job_name"] == JOB and job["kubernetes_sd_configs"] == [{"role": "endpoints"}]
    keep = next(r for r in job["relabel_configs"] if r.get("action") == "keep")
    svc = k8s_objects()["Service"]
    assert keep["regex"] == f"{svc['metadata']['labels']['app.kubernetes.io/name']};{svc['spec']['ports'][0]['name']}"
    del job["kubernetes_sd_configs"]
    job["static_configs"] = [{"targets": ["10.0.0.1:6066"]}]
    path = tmp_path / "prometheus-k8s.yml"
    path.write_text(yaml.safe_dump(config))
    run_promtool(promtool, "check", "config", str(path))


def test_promtool_check_rules(promtool):
    out = run_promtool(promtool, "check", "rules", "alerts.yml")
    assert "SUCCESS" in out


def test_promtool_alert_unit_tests(promtool):
    run_promtool(promtool, "test", "rules", "alerts_test.yml")


def test_alert_unit_tests_cover_every_alert():
    tests = yaml.safe_load((PROM_DIR / "alerts_test.yml").read_text())
    fires, silent = set(), set()
    for case in tests["tests"]:
        for t in case.get("alert_rule_test", []):
            (fires if t["exp_alerts"] else silent).add(t["alertname"])
    alerts = {r["alert"] for r in alerting_rules()}
    assert alerts - fires == set(), "alerts never shown firing"
    assert alerts - silent == set(), "alerts never shown staying silent"


#: runbook_url: the Prometheus external label runbook_base, or the default, then the alert's anchor.
RUNBOOK = re.compile(r'\{\{ or \$externalLabels\.runbook_base "(https://[^"]+)" \}\}#([a-z]+)')


def test_alert_rules_are_complete():
    anchors = github_anchors(README.read_text(encoding="utf-8"))
    required = {
        "StreamdedupWorkerDown",
        "StreamdedupNoWorkers",
        "StreamdedupLagGrowing",
        "StreamdedupDeadLetterSpike",
        "StreamdedupRecoveryStuck",
        "StreamdedupIndexMemoryHigh",
        "StreamdedupMemoryHigh",
        "StreamdedupErrors",
        "StreamdedupVerdictLatencyHigh",
        "StreamdedupCheckLatencyHigh",
    }
    rules = alerting_rules()
    assert required <= {r["alert"] for r in rules}
    defaults = set()
    for r in rules:
        name = r["alert"]
        assert re.fullmatch(r"\d+[smh]", r.get("for", "")), f"{name}: needs a for:"
        assert r["labels"]["severity"] in ("critical", "warning"), name
        ann = r["annotations"]
        assert ann["summary"] and ann["description"], name
        m = RUNBOOK.fullmatch(ann["runbook_url"])
        assert m, f"{name}: runbook_url {ann['runbook_url']!r} is not runbook_base (or the default) + #anchor"
        defaults.add(m.group(1))
        assert m.group(2) == name.lower() and m.group(2) in anchors, (
            f"{name}: runbook_url's anchor #{m.group(2)} is not its heading in deploy/README.md"
        )
    (default,) = defaults
    assert default.endswith("/deploy/README.md"), default
    for config in ("prometheus.yml", "prometheus-k8s.yml"):  # the shipped configs set the default
        labels = yaml.safe_load((PROM_DIR / config).read_text())["global"]["external_labels"]
        assert labels["runbook_base"] == default, config
    assert f"runbook_base: {default}" in README.read_text(encoding="utf-8"), "the default is documented"
    recorded = {r["record"] for r in iter_rules() if "record" in r}
    for r in iter_rules():
        for metric in promql_metric_names(r["expr"]) - recorded:
            uses = re.findall(rf"\b{metric}\b(\s*\{{[^}}]*\}})?", r["expr"])
            assert all(f'job="{JOB}"' in u for u in uses), (
                f'{r.get("alert") or r.get("record")}: select {metric} by job="{JOB}"'
            )
        for topic in promql_label_values(r["expr"], "topic"):
            assert topic == DEFAULTS.pages_topic, "the rules name the pages topic by its default"


# ---------------------------------------------------------------------------- grafana


def test_dashboard_structure():
    d = load_dashboard()
    assert d["schemaVersion"] >= 36 and d["uid"] and d["title"]
    panels = list(iter_panels(d["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells = set()
    for p in panels:
        assert p.get("description", "").strip(), f"panel {p['title']!r} needs a description"
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["refId"], p["title"]
            assert t["datasource"] == p["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine


def test_dashboard_datasource_matches_provisioning():
    (ds,) = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())["datasources"]
    (var,) = [v for v in load_dashboard()["templating"]["list"] if v["type"] == "datasource"]
    assert var["name"] == "DS_PROMETHEUS" and var["query"] == ds["type"] == "prometheus"
    assert var["current"]["value"] == ds["uid"], "the dashboard's default data source is the provisioned one"


def test_dashboard_variables_and_pages_topic():
    values = dashboard_variables()
    assert values["pages_topic"] == DEFAULTS.pages_topic
    for title, ref, expr in dashboard_queries():  # raises KeyError on an undefined variable
        assert "$" not in expr, (title, ref, expr)
    for v in load_dashboard()["templating"]["list"]:
        q = v.get("query")
        if isinstance(q, dict):
            assert f'job="{JOB}"' in q["query"]


def test_dashboard_has_the_panels_the_runbooks_refer_to():
    used = set().union(*(promql_metric_names(e) for _, e in all_promql()))
    required = {
        "streamdedup_verdicts_total",
        "streamdedup_pages_total",
        "streamdedup_verdict_latency_seconds_bucket",
        "streamdedup_consumer_lag_messages",
        "streamdedup_shard_fingerprints",
        "streamdedup_shard_bytes",
        "streamdedup_worker_memory_bytes",
        "streamdedup_worker_memory_limit_bytes",
        "streamdedup_table_groups",
        "streamdedup_check_seconds_bucket",
        "streamdedup_recovery_restored_records",
        "streamdedup_recovery_target_records",
        "streamdedup_dead_letters_total",
        "streamdedup_rebalances_total",
        "streamdedup_batch_seconds_bucket",
        "streamdedup_match_distance_bucket",
        "streamdedup_index_memory_limit_bytes",
    }
    assert required - used == set()
    exprs = " ".join(e for _, _, e in dashboard_queries())
    assert "histogram_quantile(0.5," in exprs and "histogram_quantile(0.99," in exprs
    text = README.read_text(encoding="utf-8")
    for p in iter_panels(load_dashboard()["panels"]):
        assert f"| {p['title']} | {p['description']} |" in text, (
            f"deploy/README.md's panel table does not have the panel {p['title']!r} with its description"
        )
    for r in alerting_rules():
        assert r["alert"] in text


def test_dashboard_queries_are_valid_promql(promtool, tmp_path):
    """promtool parses every dashboard query (variables replaced) as a recording rule."""
    rules = [{"record": f"dashboard:q{i}", "expr": expr} for i, (_, _, expr) in enumerate(dashboard_queries())]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run_promtool(promtool, "check", "rules", str(path))


# ---------------------------------------------------------------------------- metric names


def test_every_metric_in_promql_exists():
    known = known_metrics()
    recorded = {r["record"] for r in iter_rules() if "record" in r}
    problems = []
    for where, expr in all_promql():
        for name in promql_metric_names(expr):
            if name not in known and name not in recorded and name != "up":
                problems.append(f"{where}: {name}")
    assert not problems, (
        "metrics that no worker exports (streamdedup/stream/metrics.py, faust's sensor "
        "with prefix streamdedup_faust, prometheus_client's default collectors):\n" + "\n".join(problems)
    )


def test_every_label_in_promql_exists():
    known = known_metrics()
    problems = []
    for where, expr in all_promql():
        names = promql_metric_names(expr)
        allowed = TARGET_LABELS | {"le"} | set().union(*(known.get(n, set()) for n in names))
        if unknown := promql_label_names(expr) - allowed:
            problems.append(f"{where}: {sorted(unknown)} not among {sorted(allowed)}")
    assert not problems, "\n".join(problems)


def test_dead_letter_reasons_in_the_dashboard_exist():
    from streamdedup.errors import REASONS

    (panel,) = [p for p in iter_panels(load_dashboard()["panels"]) if p["title"] == "Dead letters by reason"]
    named = set(re.findall(r"\b[a-z]+(?:_[a-z]+)+\b", panel["description"]))
    assert named and named <= set(REASONS), named - set(REASONS)


def test_verdict_label_values_exist():
    from streamdedup.engine.dedup import Deduplicator

    verdicts = {
        v.verdict for v in Deduplicator("simhash", k=3).process(["a", "b"], ["u1", "u2"], ["one two three four"] * 2)
    }
    for where, expr in all_promql():
        assert promql_label_values(expr, "verdict") <= verdicts, where


def test_promql_lexer_finds_what_it_should():
    known = known_metrics()
    assert "streamdedup_pages_total" in known and "streamdedup_pages" not in known
    assert "streamdedup_faust_consumer_commit_latency_seconds_bucket" in known
    assert "streamdedup_pages_created" not in known
    assert promql_metric_names(
        'histogram_quantile(0.99, sum by (stage, le) (rate(x_bucket{a="b"}[$__rate_interval])))'
    ) == {"x_bucket"}
    assert promql_metric_names("(sum(rate(a_total[1m])) or vector(0)) / sum(b_total) > 0.5e3") == {"a_total", "b_total"}
    assert promql_metric_names('absent(up{job="x"} == 1)') == {"up"}
    assert promql_label_names('sum by (instance) (a{job="x", topic!~"y"}) / on (job) b') == {"instance", "job", "topic"}


def test_idle_panels_read_zero_not_no_data():
    """On an idle worker rates are 0: a ratio of them and a quantile of them are NaN, which Grafana
    shows as "No data".  Every such query has a fallback (clamp_min on the divisor, or `>= 0`
    dropping NaN and `or` giving 0); tests/integration/test_prometheus.py checks it on a real one."""
    for p in iter_panels(load_dashboard()["panels"]):
        assert p["fieldConfig"]["defaults"].get("noValue") == "0", p["title"]
        for t in p["targets"]:
            e = " ".join(t["expr"].split())
            if "histogram_quantile(" in e:
                assert ">= 0) or " in e, (p["title"], t["refId"], "a quantile of zero rates is NaN")
            if re.search(r"\)\s*/\s*(?!scalar|on)", e) and "rate(" in e:
                assert "clamp_min(" in e, (p["title"], t["refId"], "a ratio of zero rates is NaN")


def test_pages_not_fingerprints_and_whole_counts():
    panels = {p["title"]: p for p in iter_panels(load_dashboard()["panels"])}
    for title in ("Pages stored", "Pages stored per worker"):
        (t,) = panels[title]["targets"]
        assert "streamdedup_shard_fingerprints" in t["expr"] and "streamdedup_table_groups" in t["expr"], title
    (t,) = panels["Match distance distribution"]["targets"]
    assert (
        t["expr"].startswith("round(")
        and panels["Match distance distribution"]["fieldConfig"]["defaults"]["decimals"] == 0
    )
    check = panels["POST /check latency"]
    assert {n for t in check["targets"] for n in promql_metric_names(t["expr"])} >= {
        "streamdedup_check_seconds_bucket",
        "streamdedup_check_seconds_count",
    }
    memory = " ".join(t["expr"] for t in panels["Memory per worker"]["targets"])
    assert "streamdedup_worker_memory_bytes" in memory and "process_resident_memory_bytes" not in memory


def test_exported_metrics_pass_promtool_check_metrics(promtool):
    """Every metric of the worker (ours, faust's sensor, the default collectors), with a sample in
    each label child, as a scrape would give them: `promtool check metrics` finds nothing (the
    live scrape is checked in tests/integration/test_prometheus.py)."""
    from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, generate_latest

    from streamdedup.stream.metrics import Metrics, faust_metrics

    registry = CollectorRegistry()
    Metrics.create(registry).configure(DEFAULTS, 16, 4)
    faust = faust_metrics(registry)
    faust.events_runtime_latency.observe(12.0)  # faust observes milliseconds
    faust.messages_received_per_topics.labels(topic="pages").inc()
    faust.table_operations.labels(table="table.shards", operation="keys_updated").inc()
    faust.http_status_codes.labels(status_code=200).inc()
    faust.topic_partition_end_offset.labels(topic="pages", partition=0).set(5)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    text = generate_latest(registry).decode()
    assert "_created" not in text
    assert "streamdedup_faust_events_runtime_seconds_sum 0.012" in text, "milliseconds become seconds"
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
