//! The JSON merging the fake apiserver does: RFC 7386 merge patches, and the "fields a
//! manager stopped applying" half of server-side apply.

use serde_json::Value;

/// Merges `patch` into `target` (RFC 7386: objects merge key by key, `null` removes a key,
/// anything else replaces).
pub(super) fn merge(target: &mut Value, patch: &Value) {
    merge_into(target, patch, false);
}

/// Merges an applied object into `target` as server-side apply does: like [`merge`], except
/// that the lists of [`LIST_MAPS`] merge entry by entry (an applied entry merges into the
/// entry with its key, or is added).
pub(super) fn merge_applied(target: &mut Value, patch: &Value) {
    merge_into(target, patch, true);
}

/// Lists tender's CRDs declare `x-kubernetes-list-type: map`, and their key: server-side
/// apply merges them entry by entry, so each field manager owns its own entries (the poller's
/// `Polled` condition beside the Bundle controller's, one `shards` entry per replica). Every
/// other list is atomic: an apply replaces it.
const LIST_MAPS: &[(&str, &str)] = &[("conditions", "type"), ("shards", "id")];

fn list_key(field: &str) -> Option<&'static str> {
    LIST_MAPS
        .iter()
        .find(|(name, _)| *name == field)
        .map(|(_, key)| *key)
}

fn merge_into(target: &mut Value, patch: &Value, list_maps: bool) {
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
    for (field, value) in patch {
        if value.is_null() {
            map.remove(field);
            continue;
        }
        let slot = map.entry(field.clone()).or_insert(Value::Null);
        let key = list_key(field).filter(|_| list_maps);
        match (key, value, &mut *slot) {
            (Some(key), Value::Array(entries), Value::Array(list)) => {
                for entry in entries {
                    match list.iter_mut().find(|e| same_entry(e, entry, key)) {
                        Some(existing) => merge_into(existing, entry, true),
                        None => list.push(entry.clone()),
                    }
                }
            }
            _ => merge_into(slot, value, list_maps),
        }
    }
}

fn same_entry(a: &Value, b: &Value, key: &str) -> bool {
    a.get(key).is_some() && a.get(key) == b.get(key)
}

/// Removes from `target` the fields `before` set and `now` no longer does (server-side
/// apply's removal of fields its manager stopped applying; no ownership between managers).
/// In the lists of [`LIST_MAPS`] only the entries it stopped applying go.
pub(super) fn drop_unapplied(target: &mut Value, before: &Value, now: &Value) {
    let (Value::Object(target), Value::Object(before)) = (target, before) else {
        return;
    };
    for (field, old) in before {
        if let (Some(key), Some(Value::Array(list)), Value::Array(old_entries)) =
            (list_key(field), target.get_mut(field), old)
        {
            let new_entries = now.get(field).and_then(Value::as_array);
            for old_entry in old_entries {
                let applied =
                    new_entries.and_then(|n| n.iter().find(|e| same_entry(e, old_entry, key)));
                match applied {
                    Some(new_entry) => {
                        if let Some(t) = list.iter_mut().find(|e| same_entry(e, old_entry, key)) {
                            drop_unapplied(t, old_entry, new_entry);
                        }
                    }
                    None => list.retain(|e| !same_entry(e, old_entry, key)),
                }
            }
            if list.is_empty() {
                target.remove(field);
            }
            continue;
        }
        match now.get(field) {
            None => {
                target.remove(field);
            }
            Some(new) => {
                if let Some(t) = target.get_mut(field) {
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

/// Applies an RFC 6902 JSON patch (`add`, `remove`, `replace`, `test`; kube's finalizer helper
/// sends `test` + `add`/`remove`) to `target`; why it fails otherwise. A `test` of a missing
/// path against `null` holds, as on the apiserver.
pub(super) fn json_patch(target: &mut Value, patch: &Value) -> Result<(), String> {
    let ops = patch.as_array().ok_or("a JSON patch is an array")?;
    for op in ops {
        let path = op["path"]
            .as_str()
            .ok_or("a JSON patch operation needs a path")?;
        let pointer: Vec<String> = path
            .split('/')
            .skip(1)
            .map(|t| t.replace("~1", "/").replace("~0", "~"))
            .collect();
        match op["op"].as_str() {
            Some("test") => {
                let found = target.pointer(path).cloned().unwrap_or(Value::Null);
                if found != op["value"] {
                    return Err(format!("test failed at {path}"));
                }
            }
            Some("remove") => {
                remove_at(target, &pointer).ok_or(format!("nothing to remove at {path}"))?;
            }
            Some("replace") => {
                remove_at(target, &pointer).ok_or(format!("nothing to replace at {path}"))?;
                add_at(target, &pointer, op["value"].clone())?;
            }
            Some("add") => add_at(target, &pointer, op["value"].clone())?,
            other => return Err(format!("JSON patch operation {other:?} is not supported")),
        }
    }
    Ok(())
}

fn parent<'a>(target: &'a mut Value, pointer: &[String]) -> Option<(&'a mut Value, String)> {
    let (last, path) = pointer.split_last()?;
    let mut at = target;
    for token in path {
        at = match at {
            Value::Object(m) => m.get_mut(token)?,
            Value::Array(a) => a.get_mut(token.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some((at, last.clone()))
}

fn remove_at(target: &mut Value, pointer: &[String]) -> Option<Value> {
    match parent(target, pointer)? {
        (Value::Object(m), key) => m.remove(&key),
        (Value::Array(a), i) => {
            let i = i.parse::<usize>().ok().filter(|i| *i < a.len())?;
            Some(a.remove(i))
        }
        _ => None,
    }
}

fn add_at(target: &mut Value, pointer: &[String], value: Value) -> Result<(), String> {
    if pointer.is_empty() {
        *target = value;
        return Ok(());
    }
    let missing = || format!("no parent for /{}", pointer.join("/"));
    match parent(target, pointer).ok_or_else(missing)? {
        (Value::Object(m), key) => {
            m.insert(key, value);
        }
        (Value::Array(a), i) if i == "-" => a.push(value),
        (Value::Array(a), i) => {
            let i = i
                .parse::<usize>()
                .ok()
                .filter(|i| *i <= a.len())
                .ok_or_else(missing)?;
            a.insert(i, value);
        }
        _ => return Err(missing()),
    }
    Ok(())
}
