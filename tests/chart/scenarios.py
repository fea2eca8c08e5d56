"""The values the chart's tests render it with: each optional feature switched on alone,
and the other modes of the chart. Every scenario is linted and validated."""

from __future__ import annotations

import json
from typing import Final

SCENARIOS: Final[dict[str, dict[str, str]]] = {
    "default": {},
    "serviceMonitor": {"serviceMonitor.enabled": "true"},
    "operatorBudget": {"replicaCount": "3", "podDisruptionBudget.minAvailable": "2"},
    "networkPolicy": {
        "networkPolicy.enabled": "true",
        "networkPolicy.ingressFrom": json.dumps(
            [{"namespaceSelector": {"matchLabels": {"team": "platform"}}}]
        ),
    },
    "grafanaDashboard": {"grafanaDashboard.enabled": "true"},
    "prometheusRule": {"prometheusRule.enabled": "true"},
    "logs": {"logFormat": '"json"', "accessLog": "true"},
    "allNamespaces": {"watch.allNamespaces": "true"},
    "namespaces": {"watch.namespaces": '["team-a", "team-b"]'},
    "nomadTls": {"nomad.caCert": "true", "nomad.clientCert": "true"},
    "insecureNoAuth": {"apiTokens.insecureNoAuth": "true"},
    "poseidon": {"poseidon.enabled": "true"},
    "poseidonManaged": {
        "poseidon.enabled": "true",
        "poseidon.environments": '"managed"',
        "poseidon.depletingThreshold": "0.25",
        "poseidon.environmentTemplate": json.dumps(
            {"metadata": {"namespace": "codeocean"}, "spec": {"maxRunners": 50}}
        ),
    },
    "apiTls": {
        "apiTls.secretName": '"poolkeeper-api-tls"',
        "serviceMonitor.enabled": "true",
        "serviceMonitor.tlsConfig": '{"serverName": "poolkeeper"}',
    },
    "everything": {
        "serviceMonitor.enabled": "true",
        "networkPolicy.enabled": "true",
        "grafanaDashboard.enabled": "true",
        "prometheusRule.enabled": "true",
        "watch.allNamespaces": "true",
        "nomad.caCert": "true",
        "nomad.namespace": '"runners"',
        "nomad.region": '"eu"',
        "replicaCount": "3",
        "api.autoscaling.enabled": "true",
        "api.nomadTokenSecret": '"poolkeeper-nomad-api"',
    },
    # The layout before the API tier: the operator serves the clients.
    "apiOff": {"api.enabled": "false"},
    "everythingApiOff": {
        "api.enabled": "false",
        "serviceMonitor.enabled": "true",
        "networkPolicy.enabled": "true",
        "prometheusRule.enabled": "true",
    },
    "apiAutoscaling": {
        "api.autoscaling.enabled": "true",
        "api.autoscaling.minReplicas": "3",
        "api.autoscaling.maxReplicas": "12",
        "api.autoscaling.targetCPUUtilizationPercentage": "60",
    },
    "apiNomadToken": {"api.nomadTokenSecret": '"poolkeeper-nomad-api"'},
    "apiPlacement": {
        "api.replicas": "4",
        "api.nodeSelector": '{"pool": "api"}',
        "api.tolerations": '[{"key": "api", "operator": "Exists", "effect": "NoSchedule"}]',
        "api.affinity": json.dumps(
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}
                        ]
                    }
                }
            }
        ),
        "api.podDisruptionBudget.minAvailable": "2",
    },
    "noServiceAccount": {"serviceAccount.create": "false"},
}
