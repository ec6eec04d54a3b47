//! Readiness of workloads (Deployments, StatefulSets, DaemonSets, ReplicaSets) as `kubectl
//! rollout status` judges it (decision 0099-workload-readiness-as-rollout-status). Pure.

use serde_json::Value;

/// A workload is ready once its controller has observed its latest generation, every replica
/// runs the latest pod template (none of the old ones left) and they are available, as
/// `kubectl rollout status` judges it.
pub(super) fn readiness(kind: &str, obj: &Value) -> Result<(), String> {
    let status = &obj["status"];
    // Scaled to zero: no pods to roll or to be available.
    if kind != "DaemonSet" && obj["spec"]["replicas"].as_i64() == Some(0) {
        return Ok(());
    }
    if obj["metadata"]["generation"].is_i64() && !status["observedGeneration"].is_i64() {
        return Err("the controller has not observed it yet".into());
    }
    let int = |k: &str| status[k].as_i64().unwrap_or(0);
    if kind == "DaemonSet" {
        let want = int("desiredNumberScheduled");
        let (updated, available) = (int("updatedNumberScheduled"), int("numberAvailable"));
        if updated < want {
            return Err(format!("{updated}/{want} pods updated"));
        }
        return if available >= want {
            Ok(())
        } else {
            Err(format!("{available}/{want} pods available"))
        };
    }
    if let Some(c) = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Progressing" && c["reason"] == "ProgressDeadlineExceeded")
    {
        return Err(format!(
            "rollout exceeded its progress deadline: {}",
            c["message"].as_str().unwrap_or_default()
        ));
    }
    let want = obj["spec"]["replicas"].as_i64().unwrap_or(1);
    // A ReplicaSet has one template; a StatefulSet with OnDelete updates when pods are deleted.
    let rolls = kind == "Deployment"
        || (kind == "StatefulSet" && obj["spec"]["updateStrategy"]["type"] != "OnDelete");
    if rolls {
        let partition = obj["spec"]["updateStrategy"]["rollingUpdate"]["partition"]
            .as_i64()
            .unwrap_or(0);
        let updated = int("updatedReplicas");
        if updated < want - partition {
            return Err(format!("{updated}/{want} replicas updated"));
        }
        if kind == "Deployment" && int("replicas") > updated {
            return Err(format!(
                "{} old replicas pending termination",
                int("replicas") - updated
            ));
        }
    }
    let have = status["availableReplicas"]
        .as_i64()
        .or_else(|| status["readyReplicas"].as_i64())
        .unwrap_or(0);
    if have >= want {
        Ok(())
    } else {
        Err(format!("{have}/{want} replicas available"))
    }
}

#[cfg(test)]
mod tests {
    use super::super::readiness;
    use serde_json::{Value, json};

    #[test]
    fn a_workload_is_ready_only_once_rolled_and_available() {
        let deployment = |generation: i64, status: Value| {
            json!({"kind": "Deployment", "metadata": {"generation": generation},
                   "spec": {"replicas": 2}, "status": status})
        };
        let rolled = json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2});
        assert!(readiness(&deployment(2, rolled)).is_ok());
        // A new pod template not yet observed (the old pods are all still available).
        let old = json!({"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2});
        assert!(readiness(&deployment(2, old)).is_err());
        // Never observed at all.
        assert!(readiness(&deployment(1, json!({}))).is_err());
        // Scaled to zero: nothing to wait for.
        let zero = json!({"kind": "Deployment", "metadata": {"generation": 1}, "spec": {"replicas": 0}, "status": {}});
        assert!(readiness(&zero).is_ok());
        // Observed, but the old pods still serve.
        let rolling = json!({"observedGeneration": 2, "replicas": 3, "updatedReplicas": 1, "availableReplicas": 2});
        assert_eq!(
            readiness(&deployment(2, rolling)).unwrap_err(),
            "1/2 replicas updated"
        );
        let terminating = json!({"observedGeneration": 2, "replicas": 3, "updatedReplicas": 2, "availableReplicas": 2});
        assert_eq!(
            readiness(&deployment(2, terminating)).unwrap_err(),
            "1 old replicas pending termination"
        );
        // Rolled but not available again.
        let unavailable = json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 1});
        assert!(readiness(&deployment(2, unavailable)).is_err());
        let stuck = json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2,
            "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "m"}]});
        assert!(
            readiness(&deployment(2, stuck))
                .unwrap_err()
                .contains("progress deadline")
        );
        // DaemonSets and StatefulSets by their own counts.
        let ds = |updated: i64| {
            json!({"kind": "DaemonSet", "metadata": {"generation": 1},
            "status": {"observedGeneration": 1, "desiredNumberScheduled": 2, "updatedNumberScheduled": updated, "numberAvailable": 2}})
        };
        assert!(readiness(&ds(2)).is_ok());
        assert_eq!(readiness(&ds(1)).unwrap_err(), "1/2 pods updated");
        let sts = |updated: i64| {
            json!({"kind": "StatefulSet", "metadata": {"generation": 1}, "spec": {"replicas": 2},
            "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": updated, "readyReplicas": 2}})
        };
        assert!(readiness(&sts(2)).is_ok());
        assert!(readiness(&sts(1)).is_err());
    }
}
