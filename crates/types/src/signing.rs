//! The hub's signatures over its copies, and the agent's check of them (decision
//! 0089-signed-copies). Pure: keys come in as bytes, nothing here reads a clock or a random
//! source.
//!
//! A copy on the hub carries [`labels::HUB_SIGNATURE`] = `<keyId>.<signedAt>.<signature>`: an
//! Ed25519 signature (ring) over its [`CopyClaim`] — the cluster namespace, the
//! BundleDeployment, the copy's entry (apiVersion, kind, downstream name, copy name), the
//! content hash and `signedAt`. The agent recomputes the content hash from the copy's content,
//! so an edited copy, a copy moved to another entry or namespace and a forged annotation all
//! fail. Trusted keys are the ones the agent was registered with plus those the hub's key
//! chain ([`KeyChain`], ConfigMap [`crate::names::HUB_KEYS_CONFIG_MAP`]) endorses from them.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::conditions::reason;
use crate::hash::canonical_json;

/// Domain of a copy signature (never valid as anything else).
const COPY_DOMAIN: &str = "tender.dev/copy-signature/v1\n";
/// Domain of a key endorsement in the chain.
const KEY_DOMAIN: &str = "tender.dev/hub-key-endorsement/v1\n";

/// What the hub vouches for when it signs one copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyClaim<'a> {
    /// The cluster namespace on the hub the copy is in.
    pub cluster_namespace: &'a str,
    /// The BundleDeployment whose entry the copy serves.
    pub bundle_deployment: &'a str,
    /// `apiVersion` of the source (`v1` for Secrets and ConfigMaps).
    pub api_version: &'a str,
    /// Kind of the source.
    pub kind: &'a str,
    /// Name of the source, which is its name downstream.
    pub name: &'a str,
    /// Name of the copy (or carrier) on the hub.
    pub copy_name: &'a str,
    /// Content hash of what the copy holds ([`crate::hash`]).
    pub content_hash: &'a str,
    /// Issued by the hub, increasing for each copy: a copy older than the one deployed is a replay.
    pub signed_at: u64,
}

impl CopyClaim<'_> {
    /// The bytes signed: a domain line, then the claim as canonical JSON.
    pub fn message(&self) -> Vec<u8> {
        let body = json!({
            "clusterNamespace": self.cluster_namespace,
            "bundleDeployment": self.bundle_deployment,
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "copyName": self.copy_name,
            "contentHash": self.content_hash,
            "signedAt": self.signed_at,
        });
        format!("{COPY_DOMAIN}{}", canonical_json(&body)).into_bytes()
    }
}

/// Why a copy is not trusted; `reason` is a stable word from [`reason`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// [`reason::COPY_SIGNATURE_INVALID`], [`reason::HUB_KEY_UNKNOWN`] or [`reason::COPY_REPLAYED`].
    pub reason: &'static str,
    /// What is wrong, for status (never key material or content).
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}

fn refusal(reason: &'static str, message: impl Into<String>) -> Refusal {
    Refusal {
        reason,
        message: message.into(),
    }
}

/// Id of a public key: the first 16 hex digits of its SHA-256.
pub fn key_id(public_key: &[u8]) -> String {
    crate::digest::sha256_hex(public_key)[..16].to_string()
}

/// One of the hub's private keys (PKCS#8, as kept in the hub's key Secret).
pub struct HubKey {
    pair: Ed25519KeyPair,
    id: String,
}

impl std::fmt::Debug for HubKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubKey").field("id", &self.id).finish()
    }
}

impl HubKey {
    /// The key in PKCS#8 v2 document `pkcs8` (what `ring`'s generator returns).
    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<Self, String> {
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8)
            .or_else(|_| Ed25519KeyPair::from_pkcs8_maybe_unchecked(pkcs8))
            .map_err(|e| format!("not an Ed25519 PKCS#8 key: {e}"))?;
        let id = key_id(pair.public_key().as_ref());
        Ok(Self { pair, id })
    }

    /// [`key_id`] of this key.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The public key, base64.
    pub fn public_key(&self) -> String {
        B64.encode(self.pair.public_key().as_ref())
    }

    /// The [`labels::HUB_SIGNATURE`](crate::labels::HUB_SIGNATURE) value for `claim`.
    pub fn sign(&self, claim: &CopyClaim<'_>) -> String {
        let sig = self.pair.sign(&claim.message());
        format!(
            "{}.{}.{}",
            self.id,
            claim.signed_at,
            B64.encode(sig.as_ref())
        )
    }

    /// This key's endorsement of `next` (the next key in the chain).
    pub fn endorse(&self, next: &HubKey) -> ChainLink {
        let public_key = next.public_key();
        let sig = self
            .pair
            .sign(format!("{KEY_DOMAIN}{public_key}").as_bytes());
        ChainLink {
            public_key,
            endorsed_by: self.id.clone(),
            endorsement: B64.encode(sig.as_ref()),
        }
    }
}

/// One link of the hub's key chain: a public key endorsed by an earlier key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChainLink {
    /// The endorsed public key, base64.
    pub public_key: String,
    /// [`key_id`] of the endorsing key.
    pub endorsed_by: String,
    /// Signature of the endorsing key over the domain and `public_key`, base64.
    pub endorsement: String,
}

/// The chain the hub publishes in each cluster namespace: every key after the first, each
/// endorsed by the one before.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyChain {
    /// Links in order.
    pub links: Vec<ChainLink>,
}

/// The public keys an agent trusts, by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedKeys {
    keys: BTreeMap<String, Vec<u8>>,
}

impl TrustedKeys {
    /// The keys an agent was registered with (base64 public keys, comma or whitespace separated).
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut keys = BTreeMap::new();
        for item in list
            .split([',', ' ', '\n'])
            .filter(|s| !s.trim().is_empty())
        {
            let bytes = B64
                .decode(item.trim())
                .map_err(|e| format!("hub signing key {item:?} is not base64: {e}"))?;
            if bytes.len() != 32 {
                return Err(format!(
                    "hub signing key {item:?} is not an Ed25519 public key (32 bytes)"
                ));
            }
            keys.insert(key_id(&bytes), bytes);
        }
        Ok(Self { keys })
    }

    /// Whether no key is trusted.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The ids of the trusted keys.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// These keys plus every key `chain` endorses from them, transitively (a link endorsed by an
    /// untrusted key, or whose endorsement does not verify, adds nothing).
    pub fn with_chain(&self, chain: &KeyChain) -> Self {
        let mut trusted = self.clone();
        loop {
            let before = trusted.keys.len();
            for link in &chain.links {
                let Some(endorser) = trusted.keys.get(&link.endorsed_by) else {
                    continue;
                };
                let (Ok(public), Ok(sig)) =
                    (B64.decode(&link.public_key), B64.decode(&link.endorsement))
                else {
                    continue;
                };
                let message = format!("{KEY_DOMAIN}{}", link.public_key);
                if public.len() == 32
                    && UnparsedPublicKey::new(&ED25519, endorser)
                        .verify(message.as_bytes(), &sig)
                        .is_ok()
                {
                    trusted.keys.insert(key_id(&public), public);
                }
            }
            if trusted.keys.len() == before {
                return trusted;
            }
        }
    }

    /// Checks `signature` (a [`labels::HUB_SIGNATURE`](crate::labels::HUB_SIGNATURE) value)
    /// over `claim` (whose `signed_at` is ignored: it comes from the signature); returns the
    /// `signedAt` it was signed at.
    pub fn verify(&self, claim: &CopyClaim<'_>, signature: Option<&str>) -> Result<u64, Refusal> {
        let Some(signature) = signature else {
            return Err(refusal(
                reason::COPY_SIGNATURE_INVALID,
                format!("copy {} carries no hub signature", claim.copy_name),
            ));
        };
        let malformed = || {
            refusal(
                reason::COPY_SIGNATURE_INVALID,
                format!("copy {}: malformed hub signature", claim.copy_name),
            )
        };
        let mut parts = signature.splitn(3, '.');
        let (Some(id), Some(at), Some(sig)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(malformed());
        };
        let signed_at: u64 = at.parse().map_err(|_| malformed())?;
        let sig = B64.decode(sig).map_err(|_| malformed())?;
        let Some(public) = self.keys.get(id) else {
            return Err(refusal(
                reason::HUB_KEY_UNKNOWN,
                format!(
                    "copy {} is signed by key {id}, which this agent does not trust",
                    claim.copy_name
                ),
            ));
        };
        let claim = CopyClaim {
            signed_at,
            ..claim.clone()
        };
        UnparsedPublicKey::new(&ED25519, public)
            .verify(&claim.message(), &sig)
            .map_err(|_| {
                refusal(
                    reason::COPY_SIGNATURE_INVALID,
                    format!(
                        "copy {}: the hub's signature does not match its content or identity",
                        claim.copy_name
                    ),
                )
            })?;
        Ok(signed_at)
    }
}

/// A copy signed at `signed_at` may be deployed over one deployed from a copy signed at
/// `deployed` (`None`: nothing recorded): only if it is not older.
pub fn not_replayed(copy: &str, signed_at: u64, deployed: Option<u64>) -> Result<(), Refusal> {
    match deployed {
        Some(d) if signed_at < d => Err(refusal(
            reason::COPY_REPLAYED,
            format!(
                "copy {copy} was signed at {signed_at}, before the one deployed (signed at {d}): an old copy replayed"
            ),
        )),
        _ => Ok(()),
    }
}

/// The `signedAt` of a signature value, unverified (the hub reads its own to stay monotonic).
pub fn signed_at_of(signature: &str) -> Option<u64> {
    signature.split('.').nth(1)?.parse().ok()
}

/// The key id of a signature value, unverified.
pub fn key_id_of(signature: &str) -> Option<&str> {
    signature.split('.').next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;

    fn key() -> HubKey {
        let doc = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        HubKey::from_pkcs8(doc.as_ref()).unwrap()
    }

    fn claim() -> CopyClaim<'static> {
        CopyClaim {
            cluster_namespace: "cluster-ns",
            bundle_deployment: "app",
            api_version: "v1",
            kind: "Secret",
            name: "db",
            copy_name: "app-secret-db",
            content_hash: "h1",
            signed_at: 7,
        }
    }

    fn trusting(k: &HubKey) -> TrustedKeys {
        TrustedKeys::parse(&k.public_key()).unwrap()
    }

    #[test]
    fn a_signed_copy_verifies_and_any_tampered_field_is_refused() {
        let k = key();
        let sig = k.sign(&claim());
        let trusted = trusting(&k);
        assert_eq!(trusted.verify(&claim(), Some(&sig)), Ok(7));
        let tampered: Vec<CopyClaim<'static>> = vec![
            CopyClaim {
                cluster_namespace: "other-ns",
                ..claim()
            },
            CopyClaim {
                bundle_deployment: "other",
                ..claim()
            },
            CopyClaim {
                api_version: "v2",
                ..claim()
            },
            CopyClaim {
                kind: "ConfigMap",
                ..claim()
            },
            CopyClaim {
                name: "other",
                ..claim()
            },
            CopyClaim {
                copy_name: "app-secret-other",
                ..claim()
            },
            CopyClaim {
                content_hash: "h2",
                ..claim()
            },
        ];
        for c in tampered {
            let err = trusted.verify(&c, Some(&sig)).unwrap_err();
            assert_eq!(err.reason, reason::COPY_SIGNATURE_INVALID, "{c:?}");
        }
        // signedAt forged in the annotation.
        let forged_at = sig.replacen(".7.", ".9.", 1);
        assert_eq!(
            trusted
                .verify(&claim(), Some(&forged_at))
                .unwrap_err()
                .reason,
            reason::COPY_SIGNATURE_INVALID
        );
        // Signature bytes changed, missing, malformed.
        let mut bytes = B64.decode(sig.rsplit('.').next().unwrap()).unwrap();
        bytes[0] ^= 1;
        let flipped = format!("{}.7.{}", k.id(), B64.encode(bytes));
        for bad in [Some(flipped.as_str()), None, Some("x"), Some("a.b.c")] {
            let err = trusted.verify(&claim(), bad).unwrap_err();
            assert_eq!(err.reason, reason::COPY_SIGNATURE_INVALID, "{bad:?}");
        }
    }

    #[test]
    fn another_key_is_unknown_even_with_its_own_valid_signature() {
        let hub = key();
        let attacker = key();
        let sig = attacker.sign(&claim());
        let err = trusting(&hub).verify(&claim(), Some(&sig)).unwrap_err();
        assert_eq!(err.reason, reason::HUB_KEY_UNKNOWN);
        // Claiming the hub's key id with the attacker's signature is a bad signature.
        let claimed = sig.replacen(attacker.id(), hub.id(), 1);
        let err = trusting(&hub).verify(&claim(), Some(&claimed)).unwrap_err();
        assert_eq!(err.reason, reason::COPY_SIGNATURE_INVALID);
    }

    #[test]
    fn the_chain_extends_trust_only_through_endorsements() {
        let (k1, k2, k3, stranger) = (key(), key(), key(), key());
        let chain = KeyChain {
            links: vec![k2.endorse(&k3), k1.endorse(&k2)],
        };
        let trusted = trusting(&k1).with_chain(&chain);
        for k in [&k1, &k2, &k3] {
            assert_eq!(trusted.verify(&claim(), Some(&k.sign(&claim()))), Ok(7));
        }
        // A link endorsed by a key nobody trusts adds nothing; a forged endorsement neither.
        let mut forged = stranger.endorse(&key());
        let chain = KeyChain {
            links: vec![forged.clone()],
        };
        assert_eq!(trusting(&k1).with_chain(&chain), trusting(&k1));
        forged.endorsed_by = k1.id().to_string();
        let chain = KeyChain {
            links: vec![forged],
        };
        assert_eq!(trusting(&k1).with_chain(&chain), trusting(&k1));
        // Registered with k2: k1's signatures are not trusted.
        let chain = KeyChain {
            links: vec![k1.endorse(&k2)],
        };
        let err = trusting(&k2)
            .with_chain(&chain)
            .verify(&claim(), Some(&k1.sign(&claim())))
            .unwrap_err();
        assert_eq!(err.reason, reason::HUB_KEY_UNKNOWN);
    }

    #[test]
    fn an_older_copy_than_the_deployed_one_is_a_replay() {
        assert!(not_replayed("c", 5, None).is_ok());
        assert!(not_replayed("c", 5, Some(5)).is_ok());
        assert!(not_replayed("c", 6, Some(5)).is_ok());
        assert_eq!(
            not_replayed("c", 4, Some(5)).unwrap_err().reason,
            reason::COPY_REPLAYED
        );
    }

    #[test]
    fn keys_parse_and_signature_parts_read_back() {
        let k = key();
        assert!(TrustedKeys::parse("not base64!").is_err());
        assert!(TrustedKeys::parse(&B64.encode([1u8; 5])).is_err());
        let two = TrustedKeys::parse(&format!("{}, {}", k.public_key(), key().public_key()));
        assert_eq!(two.unwrap().ids().count(), 2);
        let sig = k.sign(&claim());
        assert_eq!(signed_at_of(&sig), Some(7));
        assert_eq!(key_id_of(&sig), Some(k.id()));
        assert_eq!(format!("{k:?}"), format!("HubKey {{ id: {:?} }}", k.id()));
    }
}
