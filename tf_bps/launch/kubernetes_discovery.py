"""A host discovery script for elastic jobs on Kubernetes: prints the ready pods that a
label selector picks, one `address:slots` a line, as `bpslaunch --host-discovery-script`
reads them.

    bpslaunch --host-discovery-script \
        "python -m tf_bps.launch.kubernetes_discovery -l tf-bps/job=mnist,tf-bps/role=worker" \
        --min-np 2 --max-np 8 python train.py

It asks the Kubernetes API (the `kubernetes` client, `pip install tf_bps[kubernetes]`) with
the pod's service account, which needs to list pods in the namespace, or with
~/.kube/config outside a cluster. A pod counts once it is Running and Ready, and stops
counting as soon as it is being deleted (a preemption or `kubectl delete`), so that the
job lets its workers go at their next commit instead of losing them mid-step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def ready_hosts(pods, slots: int) -> list[str]:
    """`address:slots` for each ready pod that is not being deleted, by pod name."""
    hosts = []
    for pod in sorted(pods, key=lambda p: p.metadata.name):
        status = pod.status
        if pod.metadata.deletion_timestamp is not None or status is None or \
                status.phase != "Running" or not status.pod_ip:
            continue
        ready = any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])
        if ready:
            hosts.append(f"{status.pod_ip}:{slots}")
    return hosts


def _namespace(given: str | None) -> str:
    if given:
        return given
    try:
        return _NAMESPACE_FILE.read_text().strip() or "default"
    except OSError:
        return "default"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tf_bps.launch.kubernetes_discovery",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("-l", "--selector", required=True, help="the worker pods' labels")
    parser.add_argument("-n", "--namespace", help="default: the pod's own")
    parser.add_argument("--slots", type=int, default=1, help="workers per pod (default 1)")
    args = parser.parse_args(argv)
    try:
        import kubernetes
    except ImportError:
        print("kubernetes_discovery needs the kubernetes client: pip install kubernetes",
              file=sys.stderr)
        return 2
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    pods = kubernetes.client.CoreV1Api().list_namespaced_pod(
        _namespace(args.namespace), label_selector=args.selector, timeout_seconds=10)
    for host in ready_hosts(pods.items, args.slots):
        print(host)
    return 0


if __name__ == "__main__":
    sys.exit(main())
