#!/usr/bin/env bash
# Validates the Kubernetes manifests in deploy/k8s/ against Kubernetes' own OpenAPI schemas with
# kubernetes-validate (from PyPI; it ships the schemas, so it works offline once installed) in
# strict mode (an unknown field is an error). The KubeRay example (a RayCluster, a custom
# resource whose schema the package does not have) is checked for the fields this project relies
# on, and its pod templates against the core Pod schema. Installs into
# /opt/palisade-ci/k8s-venv on first use (idempotent). Usage: scripts/k8s-validate.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${PALISADE_K8S_VENV:-/opt/palisade-ci/k8s-venv}
VERSION=1.37.0
K8S=1.34.0
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
if ! [ -x "$dir/bin/kubernetes-validate" ] || [ "$("$dir/bin/pip" show kubernetes-validate 2>/dev/null | sed -n 's/^Version: //p')" != "$VERSION" ]; then
    rm -rf "$dir"
    "$py" -m venv "$dir"
    "$dir/bin/pip" install -q --disable-pip-version-check "kubernetes-validate==$VERSION"
    chmod -R a+rX "$dir"
fi
"$dir/bin/python" - "$K8S" deploy/k8s <<'PY'
import glob, sys
import yaml
import kubernetes_validate as kv

version, root = sys.argv[1], sys.argv[2]
failed = 0
checked = 0
for path in sorted(glob.glob(f"{root}/**/*.yaml", recursive=True)):
    for doc in yaml.safe_load_all(open(path)):
        if not doc:
            continue
        where = f"{path}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}"
        try:
            if doc.get("kind") == "RayCluster":
                spec = doc["spec"]
                groups = [("headGroupSpec", spec["headGroupSpec"])] + [
                    (f"workerGroupSpecs[{i}]", g) for i, g in enumerate(spec.get("workerGroupSpecs", []))]
                for name, g in groups:
                    pod = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": f"raycluster-{name.lower()}".replace("[", "-").replace("]", "")},
                           "spec": g["template"]["spec"]}
                    kv.validate(pod, version, strict=True)
                    checked += 1
            else:
                kv.validate(doc, version, strict=True)
                checked += 1
            print(f"ok    {where}")
        except Exception as e:  # noqa: BLE001 - every failure is printed, then the script fails
            failed += 1
            print(f"FAIL  {where}: {e}")
if checked == 0:
    print(f"no manifests found under {root}")
    failed += 1
sys.exit(1 if failed else 0)
PY
