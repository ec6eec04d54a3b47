//! Fields of Fleet's Bundle and HelmOp that tender does not implement: declared in tender's
//! schemas so that each is refused by name with its reason (a CEL rule), or accepted where
//! accepting it with no effect is the truth — never left to structural pruning or to "field
//! not declared in schema" (decision 0125-fleet-defaults-and-forms). The test
//! `tests/fleet_schema.rs` walks Fleet's own CRDs and fails when one of their fields is
//! neither implemented nor listed here (or in `crate::helm`'s release options).

use schemars::Schema;

use crate::schema::{Unsupported, refuse_fields};

/// Fields of Fleet's Bundle spec that its targets have too (and so a HelmOp's, which inlines
/// the Bundle's spec).
const SPEC_AND_TARGET: &[Unsupported] = &[
    Unsupported::when_false("createNamespace", "the agent always creates the namespace"),
    Unsupported::present(
        "forceSyncGeneration",
        "integer",
        "not needed: any change of spec or of a copied source redeploys",
    ),
    Unsupported::present("ignore", "object", "conditions cannot be ignored"),
    Unsupported::when_true(
        "deleteNamespace",
        "namespaces the agent creates are never deleted",
    ),
    Unsupported::when_true(
        "deleteCRDResources",
        "CRDs are deleted like any other object unless keepResources",
    ),
    Unsupported::present(
        "yaml",
        "object",
        "tender applies no overlays: put the patched manifests in resources",
    ),
    Unsupported::present(
        "kustomize",
        "object",
        "tender does not run kustomize: put the rendered manifests in resources",
    ),
    Unsupported::present(
        "allowedTargetNamespaceSelector",
        "object",
        "Fleet copies it from a GitRepoRestriction, and tender has no GitRepo",
    ),
    Unsupported::present("overwrites", "array", "Fleet sets it internally"),
];

/// Fields of Fleet's Bundle spec only.
const SPEC: &[Unsupported] = &[
    Unsupported::unless(
        "targetCustomizationMode",
        "FirstMatch",
        "the first matching target always wins",
    ),
    Unsupported::present(
        "targetRestrictions",
        "array",
        "Fleet's GitRepo controller writes it, and tender has no GitRepo: list the allowed clusters in targets",
    ),
    Unsupported::present(
        "contentsId",
        "string",
        "Fleet's reference to contents kept in an OCI registry; a tender Bundle carries its contents",
    ),
    Unsupported::present(
        "helmOpOptions",
        "object",
        "Fleet's HelmOp controller writes it: write a HelmOp, or set helm.helmSecretName and helm.insecureSkipTLSVerify",
    ),
    Unsupported::present(
        "valuesHash",
        "string",
        "Fleet's hash of the values it rendered; tender hashes what it deploys itself",
    ),
];

/// Fields of Fleet's targets only.
const TARGET: &[Unsupported] = &[
    Unsupported::present(
        "serviceAccount",
        "string",
        "the ServiceAccount is the Bundle's (spec.serviceAccount), not a target's",
    ),
    Unsupported::present(
        "correctDrift",
        "object",
        "set correctDrift for the whole Bundle or HelmOp",
    ),
    Unsupported::present("diff", "object", "set diff for the whole Bundle or HelmOp"),
];

/// Fleet's drift options that describe Helm rollbacks.
const CORRECT_DRIFT: &[Unsupported] = &[
    Unsupported::when_true(
        "force",
        "drift is corrected by applying the object again, never by a Helm rollback",
    ),
    Unsupported::when_true("keepFailHistory", crate::helm::RELEASE),
];

/// Fleet's rollout options with no counterpart.
const ROLLOUT: &[Unsupported] = &[Unsupported::ignored(
    "maxNew",
    "integer",
    "Fleet's cap on BundleDeployments created per reconcile; the hub writes every released one, and the waves are what paces a rollout",
)];

/// `spec` of a Bundle: Fleet's fields and its `helm` release options.
pub(crate) fn bundle_spec(schema: &mut Schema) {
    refuse_fields(schema, "spec", SPEC_AND_TARGET);
    refuse_fields(schema, "spec", SPEC);
    crate::helm::fleet_only_helm_fields(schema);
}

/// `spec` of a HelmOp: the Bundle's, and `extra` (the HelmOp's own).
pub(crate) fn helmop_spec(schema: &mut Schema, extra: &[Unsupported]) {
    refuse_fields(schema, "spec", extra);
    bundle_spec(schema);
}

/// `targets[]` of a Bundle or HelmOp.
pub(crate) fn target(schema: &mut Schema) {
    refuse_fields(schema, "spec.targets[]", SPEC_AND_TARGET);
    refuse_fields(schema, "spec.targets[]", TARGET);
}

/// `correctDrift` of a Bundle or HelmOp.
pub(crate) fn correct_drift(schema: &mut Schema) {
    refuse_fields(schema, "spec.correctDrift", CORRECT_DRIFT);
}

/// `rolloutStrategy` of a Bundle or HelmOp.
pub(crate) fn rollout_strategy(schema: &mut Schema) {
    refuse_fields(schema, "spec.rolloutStrategy", ROLLOUT);
}
