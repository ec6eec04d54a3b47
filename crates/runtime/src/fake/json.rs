//! The JSON merging the fake apiserver does: RFC 7386 merge patches, and the "fields a
//! manager stopped applying" half of server-side apply.

use serde_json::Value;

/// Merges `patch` into `target` (RFC 7386: objects merge key by key, `null` removes a key,
/// anything else replaces).
pub(super) fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let Value::Object(map) = target else {
        return;
    };
    for (key, value) in patch {
        if value.is_null() {
            map.remove(key);
        } else {
            merge(map.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Removes from `target` the fields `before` set and `now` no longer does (server-side
/// apply's removal of fields its manager stopped applying; no ownership between managers).
pub(super) fn drop_unapplied(target: &mut Value, before: &Value, now: &Value) {
    let (Value::Object(target), Value::Object(before)) = (target, before) else {
        return;
    };
    for (key, old) in before {
        match now.get(key) {
            None => {
                target.remove(key);
            }
            Some(new) => {
                if let Some(t) = target.get_mut(key) {
                    drop_unapplied(t, old, new);
                }
            }
        }
    }
}

/// `value` without the top-level `keys`.
pub(super) fn without(value: &Value, keys: &[&str]) -> Value {
    let mut value = value.clone();
    if let Value::Object(map) = &mut value {
        for key in keys {
            map.remove(*key);
        }
    }
    value
}
