//! The copy rule, in one place: which of a source's labels and annotations travel with its
//! copies, and how a Secret's data is normalised (`stringData` folded into `data`). The hub's
//! copies, the agent's downstream copies and the content hash all read it from here.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;

use crate::labels::is_copied_metadata_key;

/// The labels or annotations of a source that its copies carry.
pub fn copied_metadata(map: Option<&BTreeMap<String, String>>) -> BTreeMap<String, String> {
    map.into_iter()
        .flatten()
        .filter(|(k, _)| is_copied_metadata_key(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// A Secret's data as the apiserver stores it: `data` with `stringData` folded in
/// (`stringData` wins, as on a write).
pub fn secret_data(secret: &Secret) -> BTreeMap<String, ByteString> {
    let mut data = secret.data.clone().unwrap_or_default();
    for (k, v) in secret.string_data.iter().flatten() {
        data.insert(k.clone(), ByteString(v.as_bytes().to_vec()));
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels;

    #[test]
    fn tender_and_kubectl_keys_stay_behind() {
        let source = BTreeMap::from([
            ("app".to_string(), "db".to_string()),
            (labels::MANAGED_BY.to_string(), "helm".to_string()),
            (labels::CONTENT_HASH.to_string(), "x".to_string()),
            (
                "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                "{}".to_string(),
            ),
        ]);
        assert_eq!(
            copied_metadata(Some(&source)),
            BTreeMap::from([("app".to_string(), "db".to_string())])
        );
        assert!(copied_metadata(None).is_empty());
    }

    #[test]
    fn string_data_wins_over_data() {
        let secret = Secret {
            data: Some(BTreeMap::from([
                ("a".to_string(), ByteString(b"1".to_vec())),
                ("b".to_string(), ByteString(b"2".to_vec())),
            ])),
            string_data: Some(BTreeMap::from([("b".to_string(), "3".to_string())])),
            ..Default::default()
        };
        assert_eq!(
            secret_data(&secret),
            BTreeMap::from([
                ("a".to_string(), ByteString(b"1".to_vec())),
                ("b".to_string(), ByteString(b"3".to_vec())),
            ])
        );
    }
}
