#!/usr/bin/env python3
"""Check rendered manifests against the `restricted` Pod Security Standard
and print what each Job's container runs, as JSON.

    kubectl kustomize deploy/kubernetes/base > rendered.yaml
    python3 deploy/kubernetes/check.py rendered.yaml

The rules are those of the Kubernetes documentation's "Pod Security
Standards", restricted profile (every control of baseline and restricted
that a Pod template can break), plus the read-only root filesystem these
manifests promise. Exit 1 and one line per violation when any Pod template
breaks them; `--allow RULE` (repeatable) accepts a documented exception
(keep-ownership: `runAsNonRoot`, `capabilities`).

The JSON (stdout) maps each Job's name to its container's image, args, env,
mounts (with the volume each comes from), devices, and the effective
security settings (the container's over the Pod's), for tests that run the
containers outside a cluster.
"""

import json
import sys

import yaml

ALLOWED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
    "persistentVolumeClaim", "projected", "secret",
}


def effective(pod, ctr, key):
    c = (ctr.get("securityContext") or {}).get(key)
    return c if c is not None else (pod.get("securityContext") or {}).get(key)


def violations(name, spec):
    out = []
    psc = spec.get("securityContext") or {}
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            out.append(("host-namespaces", f"{flag} is set"))
    for v in spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            out.append(("volume-types", f"volume {v['name']} is {sorted(kinds)}"))
    if psc.get("sysctls"):
        out.append(("sysctls", "sysctls are set"))
    containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
    for c in containers:
        sc = c.get("securityContext") or {}
        where = f"{name}/{c['name']}"
        if sc.get("privileged"):
            out.append(("privileged", f"{where} is privileged"))
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(("allowPrivilegeEscalation", f"{where} may escalate privileges"))
        if effective(spec, c, "runAsNonRoot") is not True:
            out.append(("runAsNonRoot", f"{where} does not set runAsNonRoot: true"))
        if effective(spec, c, "runAsUser") == 0:
            out.append(("runAsNonRoot", f"{where} runs as user 0"))
        sp = effective(spec, c, "seccompProfile") or {}
        if sp.get("type") not in ("RuntimeDefault", "Localhost"):
            out.append(("seccompProfile", f"{where} has no RuntimeDefault seccomp profile"))
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(("capabilities", f"{where} does not drop ALL capabilities"))
        extra = set(caps.get("add") or []) - {"NET_BIND_SERVICE"}
        if extra:
            out.append(("capabilities", f"{where} adds {sorted(extra)}"))
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                out.append(("host-ports", f"{where} uses hostPort {p['hostPort']}"))
        if sc.get("procMount") not in (None, "Default"):
            out.append(("procMount", f"{where} sets procMount"))
        if sc.get("readOnlyRootFilesystem") is not True:
            out.append(("readOnlyRootFilesystem", f"{where} has a writable root filesystem"))
    return out


def describe(spec):
    c = spec["containers"][0]
    vols = {v["name"]: {k: v[k] for k in v if k != "name"} for v in spec.get("volumes") or []}
    caps = (c.get("securityContext") or {}).get("capabilities") or {}
    return {
        "image": c.get("image"),
        "command": c.get("command"),
        "args": c.get("args") or [],
        "env": c.get("env") or [],
        "mounts": [
            {"path": m["mountPath"], "readOnly": bool(m.get("readOnly")), "volume": vols.get(m["name"])}
            for m in c.get("volumeMounts") or []
        ],
        "devices": [
            {"path": d["devicePath"], "volume": vols.get(d["name"])} for d in c.get("volumeDevices") or []
        ],
        "ports": [p["containerPort"] for p in c.get("ports") or []],
        "runAsUser": effective(spec, c, "runAsUser"),
        "runAsGroup": effective(spec, c, "runAsGroup"),
        "readOnlyRootFilesystem": bool(effective(spec, c, "readOnlyRootFilesystem")),
        "allowPrivilegeEscalation": effective(spec, c, "allowPrivilegeEscalation"),
        "capDrop": caps.get("drop") or [],
        "capAdd": caps.get("add") or [],
        "terminationMessagePath": c.get("terminationMessagePath", "/dev/termination-log"),
    }


def main(argv):
    allow = set()
    files = []
    it = iter(argv)
    for a in it:
        if a == "--allow":
            allow.add(next(it))
        else:
            files.append(a)
    jobs, bad = {}, []
    for f in files:
        with open(f) as fh:
            for doc in yaml.safe_load_all(fh):
                if not doc or doc.get("kind") != "Job":
                    continue
                name = doc["metadata"]["name"]
                spec = doc["spec"]["template"]["spec"]
                bad += [(rule, line) for rule, line in violations(name, spec) if rule not in allow]
                jobs[name] = describe(spec)
    for rule, line in bad:
        print(f"restricted: {rule}: {line}", file=sys.stderr)
    json.dump(jobs, sys.stdout, indent=1)
    print()
    return 1 if bad or not jobs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
