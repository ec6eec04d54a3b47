//! Condition types, reasons and bookkeeping.
//!
//! Reasons are stable CamelCase words: users search for them and the troubleshooting guide
//! documents each one.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition type: the object is fully deployed and ready.
pub const TYPE_READY: &str = "Ready";
/// Condition type (BundleDeployment): the manifests of the current deploymentID are applied.
pub const TYPE_DEPLOYED: &str = "Deployed";
/// Condition type (BundleDeployment, Bundle): the Secret/ConfigMap copies are in place.
pub const TYPE_RESOURCES_COPIED: &str = "ResourcesCopied";
/// Condition type (Cluster): the agent has reported in recently.
pub const TYPE_AGENT_CONNECTED: &str = "AgentConnected";

/// Condition type (Cluster, push mode): the hub reaches the cluster with its kubeconfig.
pub const TYPE_CLUSTER_CONNECTED: &str = "ClusterConnected";

/// Condition type (Bundle with a rolloutStrategy): a rollout is releasing waves.
pub const TYPE_ROLLOUT_PROGRESSING: &str = "RolloutProgressing";
/// Condition type (Bundle with a rolloutStrategy): the rollout failed and holds its waves.
pub const TYPE_ROLLOUT_HALTED: &str = "RolloutHalted";
/// Condition type (Bundle with a rolloutStrategy): the failed wave was returned to its previous revision.
pub const TYPE_ROLLED_BACK: &str = "RolledBack";

/// Condition reasons.
/// Bundle: whether every targeted cluster published every `upstreamResources` entry.
pub const TYPE_UPSTREAM_PUBLISHED: &str = "UpstreamPublished";
/// A Bundle or HelmOp with `pollingInterval` (or a HelmOp's range without it, looked at once
/// per spec): whether the hub's last look at the chart repository found a version for
/// `helm.version` (which one, from where).
pub const TYPE_POLLED: &str = "Polled";
/// A Bundle or HelmOp whose `pollingInterval` is below the hub's floor: `False` (reason
/// PollingIntervalRaised) while the hub looks at the floor's pace instead; absent otherwise.
pub const TYPE_POLLING_INTERVAL: &str = "PollingInterval";
/// BundleDeployment of a chart with `helm.insecureSkipTLSVerify`: `False` (reason
/// InsecureSkipTLSVerify) while the agent fetches the chart without verifying TLS; absent
/// otherwise. It does not change `Ready`.
pub const TYPE_TLS_VERIFIED: &str = "TLSVerified";

pub mod reason {
    /// Rollout: a wave is released and not yet ready.
    pub const WAVE_PROGRESSING: &str = "WaveProgressing";
    /// Rollout: a ready wave is soaking before the next one is released.
    pub const WAVE_SOAKING: &str = "WaveSoaking";
    /// Rollout: every wave is ready at the Bundle's revision.
    pub const ROLLOUT_COMPLETE: &str = "RolloutComplete";
    /// Rollout: a wave was not ready within progressDeadlineSeconds.
    pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
    /// Rollout: more clusters failed than maxFailures allows.
    pub const FAILURE_BUDGET_EXCEEDED: &str = "FailureBudgetExceeded";
    /// Rollout: the failed wave's clusters are back at their previous revision.
    pub const ROLLED_BACK: &str = "RolledBack";
    /// Rollout: the previous revision could not be kept (too large, or a carried kind), so a
    /// failure pauses instead of rolling back.
    pub const ROLLBACK_UNAVAILABLE: &str = "RollbackUnavailable";
    /// Rollout: the rolloutStrategy has an invalid value; nothing new is released.
    pub const INVALID_ROLLOUT_STRATEGY: &str = "InvalidRolloutStrategy";
    /// Rollout: the state the hub keeps of it (waves, previous revisions) cannot be read or does
    /// not verify (its content does not hash to what it claims); nothing is released and
    /// nothing rolled back until an administrator deletes it (docs/rollouts.md).
    pub const ROLLOUT_STATE_INVALID: &str = "RolloutStateInvalid";
    /// Every upstream entry is published by every targeted cluster.
    pub const UPSTREAM_PUBLISHED: &str = "UpstreamPublished";
    /// `Polled=True`: the hub resolved `helm.version` against the repository.
    pub const VERSION_RESOLVED: &str = "VersionResolved";
    /// `PollingInterval=False`: `pollingInterval` asks for less than the hub's floor (15s);
    /// the hub looks every 15s instead.
    pub const POLLING_INTERVAL_RAISED: &str = "PollingIntervalRaised";
    /// Some entry has not been reported by its cluster's agent yet.
    pub const UPSTREAM_PENDING: &str = "UpstreamPending";
    /// Some downstream object does not exist (its publication was removed).
    pub const UPSTREAM_MISSING: &str = "UpstreamMissing";
    /// The hub refused some placeholder's content (size limit, Secret type).
    pub const UPSTREAM_REJECTED: &str = "UpstreamRejected";
    /// Some cluster is unreachable: its last published content stays, possibly outdated.
    pub const UPSTREAM_STALE: &str = "UpstreamStale";
    /// Some published name is taken by an object tender did not publish.
    pub const UPSTREAM_CONFLICT: &str = "UpstreamConflict";
    /// Everything is ready.
    pub const READY: &str = "Ready";
    /// The manifests are applied.
    pub const DEPLOYED: &str = "Deployed";
    /// Every copy is in place.
    pub const RESOURCES_COPIED: &str = "ResourcesCopied";
    /// Nothing to copy for this deployment.
    pub const NO_RESOURCES_TO_COPY: &str = "NoResourcesToCopy";
    /// A Secret/ConfigMap named in downstreamResources does not exist in the Bundle's namespace.
    pub const SOURCE_NOT_FOUND: &str = "SourceNotFound";
    /// downstreamResources are set but EXPERIMENTAL_COPY_RESOURCES_DOWNSTREAM is off.
    pub const COPY_FEATURE_DISABLED: &str = "CopyFeatureDisabled";
    /// Superseded by [`KIND_NOT_ALLOWED`] (a kind outside `--copyable-kinds`); no longer set.
    pub const UNSUPPORTED_KIND: &str = "UnsupportedKind";
    /// A downstreamResources entry names a kind the hub operator does not allow (`--copyable-kinds`).
    pub const KIND_NOT_ALLOWED: &str = "KindNotAllowed";
    /// A copied object's or a manifest's kind is not served by the downstream cluster (no such
    /// API there, or its CRD was removed).
    pub const KIND_NOT_INSTALLED: &str = "KindNotInstalled";
    /// A downstream namespace objects should land in is being deleted (stuck on a finalizer).
    pub const NAMESPACE_TERMINATING: &str = "NamespaceTerminating";
    /// A BundleDeployment would be larger than the hub's apiserver stores; it is not written.
    pub const TOO_LARGE: &str = "TooLarge";
    /// A Bundle's Helm values template (`${ }`, Fleet's syntax) failed for some clusters:
    /// nothing new is written for them; the message names each cluster and the value's path.
    pub const VALUES_TEMPLATE_FAILED: &str = "ValuesTemplateFailed";
    /// The chart repository or registry could not be reached, or has no such chart (404).
    pub const CHART_REPOSITORY_UNREACHABLE: &str = "ChartRepositoryUnreachable";
    /// The chart repository or registry refused the credentials (401/403).
    pub const CHART_AUTH_FAILED: &str = "ChartAuthFailed";
    /// No chart version matches `helm.version`.
    pub const CHART_VERSION_NOT_FOUND: &str = "ChartVersionNotFound";
    /// The chart archive's sha256 differs from the digest the index or the OCI manifest names.
    pub const CHART_DIGEST_MISMATCH: &str = "ChartDigestMismatch";
    /// `helm template` failed (its message, never the values).
    pub const CHART_RENDER_FAILED: &str = "ChartRenderFailed";
    /// The files carried in `resources` cannot be used: a bad encoding, a file over the
    /// agent's bounds, a chart directory without its `Chart.yaml`, a manifest file whose
    /// document has no apiVersion or kind, or an archive whose Chart.yaml version is not
    /// `helm.version` (decision 0123-files-in-a-bundle). The message names the file.
    pub const FILES_INVALID: &str = "FilesInvalid";
    /// A Helm hook (a Job or Pod) failed, did not complete within the chart's timeout, or its
    /// name is taken by an object that is not tender's: the rollout stops there.
    pub const HOOK_FAILED: &str = "HookFailed";
    /// A chart archive, repository index, OCI tag list or manifest is larger than the agent's
    /// limit (`--max-chart-bytes`, `--max-index-bytes`, `--max-manifest-bytes`).
    pub const CHART_TOO_LARGE: &str = "ChartTooLarge";
    /// `helm template` printed more than the agent's `--max-rendered-bytes`; helm was stopped.
    pub const RENDERED_TOO_LARGE: &str = "RenderedTooLarge";
    /// The chart repository or registry redirected to another origin than its own.
    pub const CHART_REDIRECT_REFUSED: &str = "ChartRedirectRefused";
    /// A chart's `values.schema.json` refers to a document outside itself (`$ref`, `$id` or
    /// `$schema` with a URL), which helm would fetch from the agent's network.
    pub const CHART_SCHEMA_REFUSED: &str = "ChartSchemaRefused";
    /// The `cacerts` key of the `helmSecretName` Secret holds no PEM certificate the agent can
    /// use: nothing is fetched, deployed or removed.
    pub const CHART_REPOSITORY_CA_INVALID: &str = "ChartRepositoryCAInvalid";
    /// `TLSVerified=False`: the chart source's certificate is not verified
    /// (`helm.insecureSkipTLSVerify`).
    pub const INSECURE_SKIP_TLS_VERIFY: &str = "InsecureSkipTLSVerify";
    /// A `valuesFrom` object or key (or the `helmSecretName` Secret) is missing downstream.
    pub const VALUES_FROM_MISSING: &str = "ValuesFromMissing";
    /// A `valuesFrom` key does not hold a YAML map.
    pub const VALUES_INVALID: &str = "ValuesInvalid";
    /// The downstream cluster's agent refuses an object by its owner's policy (a refused kind,
    /// or a namespace it may not write to); everything else is deployed.
    pub const REFUSED_BY_POLICY: &str = "RefusedByPolicy";
    /// The Bundle names a downstream ServiceAccount (`spec.serviceAccount`) that the cluster's
    /// owner does not allow (`--allow-bundle-service-accounts`); nothing of it is applied there.
    pub const SERVICE_ACCOUNT_NOT_ALLOWED: &str = "ServiceAccountNotAllowed";
    /// The downstream cluster's agent refuses to read an object for a Bundle (reverse sync,
    /// `valuesFrom`, `helmSecretName`): it is in the agent's own namespace, in a namespace the
    /// owner does not let Bundles read (`--readable-namespaces`), or a service-account token.
    pub const READ_REFUSED_BY_POLICY: &str = "ReadRefusedByPolicy";
    /// No target of the Bundle selects any cluster.
    pub const NO_CLUSTERS_MATCHED: &str = "NoClustersMatched";
    /// A label selector in a target or group is invalid.
    pub const INVALID_SELECTOR: &str = "InvalidSelector";
    /// A downstream object exists and belongs to someone else.
    pub const CONFLICT: &str = "Conflict";
    /// Copying a Secret/ConfigMap failed.
    pub const COPY_FAILED: &str = "CopyFailed";
    /// A copy on the hub whose hub signature is missing or does not verify (content, identity
    /// or signature edited by someone other than the hub): nothing deployed from it.
    pub const COPY_SIGNATURE_INVALID: &str = "CopySignatureInvalid";
    /// A copy signed by a key the agent does not trust (not registered, not endorsed by the
    /// hub's key chain): nothing deployed from it.
    pub const HUB_KEY_UNKNOWN: &str = "HubKeyUnknown";
    /// A validly signed copy older than the one already deployed from it (a replay): refused.
    pub const COPY_REPLAYED: &str = "CopyReplayed";
    /// Applying a manifest failed.
    pub const APPLY_FAILED: &str = "ApplyFailed";
    /// Deployed objects are not ready yet.
    pub const NOT_READY: &str = "NotReady";
    /// Deployed objects were changed downstream.
    pub const MODIFIED: &str = "Modified";
    /// Waiting for the agent to apply the current deploymentID.
    pub const WAIT_APPLIED: &str = "WaitApplied";
    /// Rollout is paused (Bundle, Cluster or BundleDeployment).
    pub const PAUSED: &str = "Paused";
    /// A Bundle's copies, every targeted cluster's counted, would hold more bytes on the hub
    /// than the hub allows (`--max-copied-bytes-per-bundle`).
    pub const COPY_LIMIT_EXCEEDED: &str = "CopyLimitExceeded";
    /// A `downstreamResources` source exists but is never copied: a Secret a Cluster names
    /// as its kubeconfig, or a ServiceAccount token (decision 0075-credentials-never-copied).
    pub const SOURCE_REFUSED: &str = "SourceRefused";
    /// The Cluster's namespace on the hub exists but the hub did not create it for this
    /// Cluster: nothing is provisioned or written there
    /// (decision 0074-cluster-namespaces-provably-the-hubs).
    pub const NAMESPACE_NOT_OWNED: &str = "NamespaceNotOwned";
    /// The agent has never reported in.
    pub const WAITING_FOR_AGENT: &str = "WaitingForAgent";
    /// The agent has not reported in recently.
    pub const AGENT_OFFLINE: &str = "AgentOffline";
    /// The agent reports in.
    pub const AGENT_CONNECTED: &str = "AgentConnected";
    /// Push mode: the hub reaches the cluster with its kubeconfig.
    pub const CLUSTER_CONNECTED: &str = "ClusterConnected";
    /// HelmOp: a Bundle of the HelmOp's name exists that the HelmOp does not own; it is left alone.
    pub const BUNDLE_CONFLICT: &str = "BundleConflict";
    /// Push mode: the kubeconfig was read and the first probe of the cluster is under way.
    pub const CONNECTING: &str = "Connecting";
    /// Push mode: the kubeconfig Secret (or its key) does not exist.
    pub const KUBECONFIG_MISSING: &str = "KubeconfigMissing";
    /// Push mode: the kubeconfig cannot be parsed or is unusable (no current context, files).
    pub const KUBECONFIG_INVALID: &str = "KubeconfigInvalid";
    /// Push mode: the kubeconfig uses an exec plugin or auth-provider and the hub does not allow it.
    pub const KUBECONFIG_EXEC_NOT_ALLOWED: &str = "KubeconfigExecNotAllowed";
    /// Push mode: the downstream apiserver refuses the kubeconfig's identity (401/403).
    pub const KUBECONFIG_REFUSED: &str = "KubeconfigRefused";
    /// Push mode: the downstream apiserver does not answer in time.
    pub const CLUSTER_UNREACHABLE: &str = "ClusterUnreachable";
    /// Agent log and `tender_agent_hub_access_lost`: the hub refuses the agent's identity
    /// (401/403) or its Cluster no longer exists; nothing is deleted downstream
    /// (decision 0081-an-agent-sweeps-only-for-a-live-cluster).
    pub const HUB_ACCESS_LOST: &str = "HubAccessLost";
    /// A Bundle's `dependsOn` names a Bundle that does not exist in its namespace (or a
    /// selector matches none): nothing is written for it until one does.
    pub const DEPENDENCY_NOT_FOUND: &str = "DependencyNotFound";
    /// A Bundle's `dependsOn` leads back to itself: nothing is written for it until the
    /// cycle is broken.
    pub const DEPENDENCY_CYCLE: &str = "DependencyCycle";
    /// Some clusters wait for a Bundle's dependencies to reach an accepted state there; they
    /// keep what they have meanwhile.
    pub const DEPENDENCY_NOT_READY: &str = "DependencyNotReady";
}

/// The condition of `type_`, if present.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of `type_` is present and `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Sets the condition of `type_`, keeping `lastTransitionTime` when the status is unchanged.
///
/// Returns whether anything changed, so callers can skip a status write when it did not.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
    now: Time,
) -> bool {
    let status = if status { "True" } else { "False" };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => {
            let changed = existing.status != status
                || existing.reason != reason
                || existing.message != message
                || existing.observed_generation != observed_generation;
            if existing.status != status {
                existing.last_transition_time = now;
            }
            existing.status = status.to_string();
            existing.reason = reason.to_string();
            existing.message = message.to_string();
            existing.observed_generation = observed_generation;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: type_.to_string(),
                status: status.to_string(),
                reason: reason.to_string(),
                message: message.to_string(),
                observed_generation,
                last_transition_time: now,
            });
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let mut conds = Vec::new();
        assert!(set_condition(
            &mut conds,
            TYPE_READY,
            false,
            reason::WAIT_APPLIED,
            "waiting",
            Some(1),
            at(10)
        ));
        assert_eq!(conds[0].last_transition_time, at(10));

        // Same status, new reason/message: updated, time kept.
        assert!(set_condition(
            &mut conds,
            TYPE_READY,
            false,
            reason::NOT_READY,
            "1 not ready",
            Some(1),
            at(20)
        ));
        assert_eq!(conds[0].last_transition_time, at(10));
        assert_eq!(conds[0].reason, "NotReady");

        // Nothing changed: reports no change.
        assert!(!set_condition(
            &mut conds,
            TYPE_READY,
            false,
            reason::NOT_READY,
            "1 not ready",
            Some(1),
            at(30)
        ));
        assert_eq!(conds[0].last_transition_time, at(10));

        // Status flips: time moves.
        assert!(set_condition(
            &mut conds,
            TYPE_READY,
            true,
            reason::READY,
            "",
            Some(2),
            at(40)
        ));
        assert_eq!(conds[0].last_transition_time, at(40));
        assert_eq!(conds[0].status, "True");
        assert_eq!(conds[0].observed_generation, Some(2));
        assert!(is_true(&conds, TYPE_READY));
        assert_eq!(conds.len(), 1);
    }

    #[test]
    fn conditions_of_other_types_are_independent() {
        let mut conds = Vec::new();
        set_condition(&mut conds, TYPE_READY, true, reason::READY, "", None, at(1));
        set_condition(
            &mut conds,
            TYPE_DEPLOYED,
            false,
            reason::APPLY_FAILED,
            "boom",
            None,
            at(2),
        );
        assert_eq!(conds.len(), 2);
        assert!(is_true(&conds, TYPE_READY));
        assert!(!is_true(&conds, TYPE_DEPLOYED));
        assert!(!is_true(&conds, TYPE_RESOURCES_COPIED));
        assert_eq!(
            find_condition(&conds, TYPE_DEPLOYED).unwrap().message,
            "boom"
        );
    }
}
