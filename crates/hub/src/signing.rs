//! The hub's signing keys (decision 0089-signed-copies): kept in one Secret in the hub's own
//! namespace, created by the leader if absent (create-if-absent: replicas never race), read
//! into [`HubKeys`] which signs every copy the hub writes.
//!
//! The Secret holds `keys.json` ([`KeyFile`]: every key, oldest first, the retired ones
//! without their private half, and which one signs) and `public-keys` (what an agent is
//! registered with, `tender cluster add --hub-signing-keys`). Rolling to a new key is three
//! steps asked for with the annotation [`ROLL`] (`publish`, `switch`, `retire`), carried out
//! by [`roll`] (pure) — see docs/hub.md "Signing keys".

use std::collections::BTreeSet;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use serde::{Deserialize, Serialize};
use tender_types::signing::{CopyClaim, HubKey, KeyChain, TrustedKeys};

use crate::{Error, kube_err};

/// Annotation on the key Secret asking the hub for the next roll step.
pub const ROLL: &str = "tender.dev/signing-key-roll";
/// Annotation on the key Secret: the last roll step carried out (`<step>/<key id>`).
pub const ROLLED: &str = "tender.dev/signing-key-rolled";
/// The key of the Secret's data holding the [`KeyFile`].
const KEYS_KEY: &str = "keys.json";
/// The key of the Secret's data holding the public keys to register agents with.
pub const PUBLIC_KEYS_KEY: &str = "public-keys";

/// Where the hub keeps its signing keys (`--signing-key-secret`, in the hub's namespace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SigningConfig {
    /// Namespace of the Secret (the hub's own).
    pub namespace: String,
    /// Name of the Secret.
    pub secret_name: String,
}

impl Default for SigningConfig {
    fn default() -> Self {
        Self {
            namespace: tender_types::namespaces::DEFAULT_AGENT_NAMESPACE.to_string(),
            secret_name: tender_types::names::HUB_SIGNING_KEY_SECRET.to_string(),
        }
    }
}

/// One key as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredKey {
    /// Public key, base64.
    pub public_key: String,
    /// PKCS#8 private key, base64; empty once retired.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pkcs8: String,
}

/// The Secret's `keys.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyFile {
    /// Every key, oldest first.
    pub keys: Vec<StoredKey>,
    /// Index of the key that signs.
    pub active: usize,
    /// Each key after the first, endorsed by the one before (published in cluster namespaces).
    pub chain: KeyChain,
}

/// The keys in use: the one that signs, the ones whose signatures are still current, the chain.
#[derive(Debug)]
pub struct HubKeys {
    active: HubKey,
    current: BTreeSet<String>,
    /// Published in every cluster namespace ([`tender_types::names::HUB_KEYS_CONFIG_MAP`]).
    pub chain: KeyChain,
    /// Every public key, oldest first, comma-separated: what agents are registered with.
    pub public_keys: String,
    /// Every public key, to check what the hub reads back as its own (a kept copy).
    trusted: TrustedKeys,
}

impl HubKeys {
    /// The keys of `file`.
    pub fn from_file(file: &KeyFile) -> Result<Self, String> {
        let stored = file
            .keys
            .get(file.active)
            .ok_or("keys.json: the active key does not exist")?;
        let pkcs8 = B64
            .decode(&stored.pkcs8)
            .map_err(|_| "keys.json: the active key has no private key")?;
        let active = HubKey::from_pkcs8(&pkcs8)?;
        let current = file
            .keys
            .iter()
            .filter(|k| !k.pkcs8.is_empty())
            .filter_map(|k| B64.decode(&k.public_key).ok())
            .map(|p| tender_types::signing::key_id(&p))
            .collect();
        let public_keys = file
            .keys
            .iter()
            .map(|k| k.public_key.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let trusted = TrustedKeys::parse(&public_keys)?;
        Ok(Self {
            active,
            current,
            chain: file.chain.clone(),
            public_keys,
            trusted,
        })
    }

    /// The [`tender_types::labels::HUB_SIGNATURE`] value for `claim`, with the active key.
    pub fn sign(&self, claim: &CopyClaim<'_>) -> String {
        self.active.sign(claim)
    }

    /// Whether a copy signed with `signature` needs no new signature: its key is not retired.
    pub fn is_current(&self, signature: &str) -> bool {
        tender_types::signing::key_id_of(signature).is_some_and(|id| self.current.contains(id))
    }

    /// Ids of the keys whose signatures stay current.
    pub fn current_ids(&self) -> &BTreeSet<String> {
        &self.current
    }

    /// Every key of this hub, retired ones included: a signature any of them verifies is the
    /// hub's own.
    pub fn trusted(&self) -> &TrustedKeys {
        &self.trusted
    }

    /// Id of the key that signs.
    pub fn active_id(&self) -> &str {
        self.active.id()
    }
}

/// A new key file with one key from `pkcs8`.
pub fn new_file(pkcs8: &[u8]) -> Result<KeyFile, String> {
    let key = HubKey::from_pkcs8(pkcs8)?;
    Ok(KeyFile {
        keys: vec![StoredKey {
            public_key: key.public_key(),
            pkcs8: B64.encode(pkcs8),
        }],
        active: 0,
        chain: KeyChain::default(),
    })
}

/// One roll step on `file` (`publish`: add key `pkcs8`, endorsed by the newest, not signing
/// yet; `switch`: the newest key signs; `retire`: drop the private half of every key before
/// the active one, whose copies are then signed anew). `Err` says why the step cannot be taken.
pub fn roll(file: &KeyFile, step: &str, pkcs8: &[u8]) -> Result<KeyFile, String> {
    let mut next = file.clone();
    match step {
        "publish" => {
            if file.keys.len() > file.active + 1 {
                return Err("a published key is waiting for `switch`".into());
            }
            let newest = file.keys.last().ok_or("no key")?;
            let newest =
                HubKey::from_pkcs8(&B64.decode(&newest.pkcs8).map_err(|e| e.to_string())?)?;
            let key = HubKey::from_pkcs8(pkcs8)?;
            next.chain.links.push(newest.endorse(&key));
            next.keys.push(StoredKey {
                public_key: key.public_key(),
                pkcs8: B64.encode(pkcs8),
            });
        }
        "switch" => {
            if file.keys.len() == file.active + 1 {
                return Err("no published key to switch to: `publish` first".into());
            }
            next.active = file.keys.len() - 1;
        }
        "retire" => {
            for k in next.keys.iter_mut().take(file.active) {
                k.pkcs8.clear();
            }
        }
        other => {
            return Err(format!(
                "unknown roll step {other:?} (publish, switch, retire)"
            ));
        }
    }
    Ok(next)
}

fn secret_body(config: &SigningConfig, file: &KeyFile, rolled: Option<String>) -> Secret {
    let json = serde_json::to_vec(file).expect("key file serializes");
    let public = file
        .keys
        .iter()
        .map(|k| k.public_key.as_str())
        .collect::<Vec<_>>()
        .join(",");
    Secret {
        metadata: ObjectMeta {
            name: Some(config.secret_name.clone()),
            namespace: Some(config.namespace.clone()),
            labels: Some(
                [(
                    tender_types::labels::MANAGED_BY.to_string(),
                    tender_types::labels::MANAGED_BY_VALUE.to_string(),
                )]
                .into(),
            ),
            annotations: rolled.map(|r| [(ROLLED.to_string(), r)].into()),
            ..Default::default()
        },
        data: Some(
            [
                (KEYS_KEY.to_string(), ByteString(json)),
                (PUBLIC_KEYS_KEY.to_string(), ByteString(public.into_bytes())),
            ]
            .into(),
        ),
        ..Default::default()
    }
}

fn file_of(secret: &Secret) -> Result<KeyFile, Error> {
    let raw = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KEYS_KEY))
        .ok_or_else(|| Error::Config(format!("signing key Secret has no {KEYS_KEY}")))?;
    serde_json::from_slice(&raw.0)
        .map_err(|e| Error::Config(format!("signing key Secret: {KEYS_KEY} is not valid: {e}")))
}

fn generate() -> Result<Vec<u8>, Error> {
    let doc = ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new())
        .map_err(|_| Error::Config("cannot generate a signing key".into()))?;
    Ok(doc.as_ref().to_vec())
}

/// The hub's keys from its Secret, created first if absent (a replica that loses the create
/// race reads the winner's), with a requested roll step carried out.
pub async fn load_or_create(client: &Client, config: &SigningConfig) -> Result<HubKeys, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &config.namespace);
    let what = || {
        format!(
            "signing key Secret {}/{}",
            config.namespace, config.secret_name
        )
    };
    let secret = match api
        .get_opt(&config.secret_name)
        .await
        .map_err(kube_err(what()))?
    {
        Some(s) => s,
        None => {
            let file = new_file(&generate()?).map_err(Error::Config)?;
            match api
                .create(&PostParams::default(), &secret_body(config, &file, None))
                .await
            {
                Ok(s) => {
                    tracing::info!(secret = %config.secret_name, namespace = %config.namespace, "created the hub's signing key");
                    s
                }
                Err(kube::Error::Api(e)) if e.code == 409 => api
                    .get(&config.secret_name)
                    .await
                    .map_err(kube_err(what()))?,
                Err(e) => return Err(kube_err(what())(e)),
            }
        }
    };
    let mut file = file_of(&secret)?;
    let asked = secret.annotations().get(ROLL).cloned();
    let done = secret.annotations().get(ROLLED).cloned();
    if let Some(step) =
        asked.filter(|s| done.as_deref().and_then(|d| d.split('/').next()) != Some(s))
    {
        match roll(&file, &step, &generate()?) {
            Ok(next) => {
                let mut body = secret_body(config, &next, None);
                let id = HubKeys::from_file(&next).map_err(Error::Config)?;
                body.metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(ROLLED.into(), format!("{step}/{}", id.active_id()));
                body.metadata.resource_version = secret.resource_version();
                // Keep the request on the Secret: ROLLED says it was carried out.
                body.metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(ROLL.into(), step.clone());
                api.replace(&config.secret_name, &PostParams::default(), &body)
                    .await
                    .map_err(kube_err(what()))?;
                tracing::info!(%step, active = %id.active_id(), "signing key roll step carried out");
                file = next;
            }
            Err(why) => tracing::warn!(%step, %why, "signing key roll step refused"),
        }
    }
    HubKeys::from_file(&file).map_err(Error::Config)
}

/// Keys for unit tests, and a signature by them.
#[cfg(test)]
pub(crate) fn test_keys() -> (HubKeys, String) {
    let keys =
        HubKeys::from_file(&new_file(&generate().expect("key")).expect("file")).expect("keys");
    let sig = keys.sign(&CopyClaim {
        cluster_namespace: "cns",
        bundle_deployment: "app",
        api_version: "v1",
        kind: "Secret",
        name: "db",
        copy_name: "c",
        content_hash: "h1",
        signed_at: 1,
    });
    (keys, sig)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tender_types::signing::TrustedKeys;

    fn pkcs8() -> Vec<u8> {
        generate().unwrap()
    }

    fn claim() -> CopyClaim<'static> {
        CopyClaim {
            cluster_namespace: "ns",
            bundle_deployment: "b",
            api_version: "v1",
            kind: "Secret",
            name: "s",
            copy_name: "b-secret-s",
            content_hash: "h",
            signed_at: 1,
        }
    }

    #[test]
    fn a_roll_publishes_before_it_signs_and_an_old_agent_follows() {
        let file = new_file(&pkcs8()).unwrap();
        let first = HubKeys::from_file(&file).unwrap();
        let registered = TrustedKeys::parse(&first.public_keys).unwrap();
        let old_sig = first.sign(&claim());

        let published = roll(&file, "publish", &pkcs8()).unwrap();
        let keys = HubKeys::from_file(&published).unwrap();
        assert_eq!(
            keys.active_id(),
            first.active_id(),
            "publish does not sign yet"
        );
        assert!(roll(&published, "publish", &pkcs8()).is_err());

        let switched = roll(&published, "switch", &pkcs8()).unwrap();
        let keys = HubKeys::from_file(&switched).unwrap();
        assert_ne!(keys.active_id(), first.active_id());
        let new_sig = keys.sign(&claim());
        // Overlap: both verify for an agent registered with the first key and the chain.
        let trusted = registered.with_chain(&keys.chain);
        assert!(trusted.verify(&claim(), Some(&old_sig)).is_ok());
        assert!(trusted.verify(&claim(), Some(&new_sig)).is_ok());
        assert!(keys.is_current(&old_sig) && keys.is_current(&new_sig));
        // Without the chain the new key is unknown to the old agent.
        assert!(registered.verify(&claim(), Some(&new_sig)).is_err());

        let retired = roll(&switched, "retire", &pkcs8()).unwrap();
        let keys = HubKeys::from_file(&retired).unwrap();
        assert!(
            !keys.is_current(&old_sig),
            "copies signed by the old key are signed anew"
        );
        assert!(keys.is_current(&new_sig));
        assert!(retired.keys[0].pkcs8.is_empty());
        assert!(roll(&retired, "switch", &pkcs8()).is_err());
        assert!(roll(&retired, "bogus", &pkcs8()).is_err());
    }
}
