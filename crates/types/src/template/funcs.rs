//! The functions a values template may call: Go's builtins and the Sprig functions Fleet's
//! users write. Fleet offers all of Sprig but `env`, `expandenv`, `include`, `tpl` and
//! `getHostByName`; tender offers this list (decision 0100-fleet-values-templating), and an
//! unknown name is refused when the template is parsed.

use serde_json::{Map, Value};

use super::{Budget, MAX_OUTPUT, TemplateError};

/// Every function a template may call.
pub(crate) const NAMES: &[&str] = &[
    // Go's builtins.
    "and",
    "or",
    "not",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "index",
    "len",
    "print",
    "printf",
    // Sprig.
    "default",
    "empty",
    "coalesce",
    "ternary",
    "quote",
    "squote",
    "upper",
    "lower",
    "title",
    "trim",
    "trimPrefix",
    "trimSuffix",
    "trimAll",
    "replace",
    "contains",
    "hasPrefix",
    "hasSuffix",
    "hasKey",
    "get",
    "toString",
    "toJson",
    "trunc",
    "join",
    "splitList",
    "list",
    "dict",
    "int",
    "cat",
    "repeat",
    "nospace",
    "kebabcase",
    "snakecase",
    "uniq",
    "toYaml",
];

pub(crate) fn exists(name: &str) -> bool {
    NAMES.contains(&name)
}

fn bad<T>(f: &str, why: &str) -> Result<T, TemplateError> {
    Err(TemplateError(format!("error calling {f}: {why}")))
}

/// `v` as Go's `%v` prints it (`<no value>` for nil, `map[k:v]`, `[a b]`).
pub(crate) fn print(v: &Value) -> String {
    match v {
        Value::Null => "<no value>".into(),
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Array(a) => format!("[{}]", a.iter().map(print).collect::<Vec<_>>().join(" ")),
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .iter()
                .map(|k| format!("{k}:{}", print(&m[*k])))
                .collect();
            format!("map[{}]", parts.join(" "))
        }
    }
}

/// Go's truth: false, 0, nil and empty strings, lists and maps are false.
pub(crate) fn truth(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => !m.is_empty(),
    }
}

fn string(v: &Value) -> String {
    print(v)
}

fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn num(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

fn equal(a: &Value, b: &Value) -> bool {
    match (num(a), num(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn order(f: &str, a: &Value, b: &Value) -> Result<std::cmp::Ordering, TemplateError> {
    match (a, b) {
        (Value::String(x), Value::String(y)) => Ok(x.cmp(y)),
        _ => match (num(a), num(b)) {
            (Some(x), Some(y)) => x
                .partial_cmp(&y)
                .map_or_else(|| bad(f, "not comparable"), Ok),
            _ => bad(f, "incompatible types for comparison"),
        },
    }
}

fn int_of(f: &str, v: &Value) -> Result<i64, TemplateError> {
    match v {
        Value::Number(n) => Ok(n
            .as_i64()
            .unwrap_or_else(|| n.as_f64().unwrap_or(0.0) as i64)),
        Value::String(s) => Ok(s.trim().parse::<i64>().unwrap_or(0)),
        Value::Bool(b) => Ok(i64::from(*b)),
        Value::Null => Ok(0),
        _ => bad(f, "expected a number"),
    }
}

fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut prev_lower = false;
    for c in s.chars() {
        if !c.is_alphanumeric() {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            prev_lower = false;
            continue;
        }
        if c.is_uppercase() && prev_lower && !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        cur.extend(c.to_lowercase());
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn printf(args: &[Value]) -> Result<String, TemplateError> {
    let Some((fmt, rest)) = args.split_first() else {
        return bad("printf", "missing format");
    };
    let fmt = string(fmt);
    let mut rest = rest.iter();
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some(verb @ ('s' | 'v' | 'd' | 'q')) => {
                let Some(a) = rest.next() else {
                    out.push_str(&format!("%!{verb}(MISSING)"));
                    continue;
                };
                match verb {
                    'q' => out.push_str(&go_quote(&string(a))),
                    'd' => out.push_str(&int_of("printf", a)?.to_string()),
                    _ => out.push_str(&string(a)),
                }
            }
            _ => return bad("printf", "only %s, %v, %d, %q and %% are supported"),
        }
    }
    Ok(out)
}

/// Refuses a result of `bytes` bytes before it is made: larger than the output may be, or more
/// than the budget has left.
fn bounded(f: &str, bytes: usize, budget: &mut Budget) -> Result<(), TemplateError> {
    if bytes > MAX_OUTPUT {
        return bad(f, "the result would be larger than 1 MiB");
    }
    budget.charge_bytes(bytes)
}

/// Calls `f` with `args` (a piped value comes last, as in Go). What a call makes beyond its
/// arguments' size (`repeat`, `replace`, `join`, `splitList`, `uniq`) is paid from `budget`
/// before it is made; the caller pays for the result.
pub(crate) fn call(f: &str, args: Vec<Value>, budget: &mut Budget) -> Result<Value, TemplateError> {
    let n = args.len();
    let need = |k: usize| {
        if n == k {
            Ok(())
        } else {
            bad(f, &format!("wants {k} arguments, got {n}"))
        }
    };
    let s = |i: usize| string(&args[i]);
    Ok(match f {
        "and" => {
            if n == 0 {
                return bad(f, "wants arguments");
            }
            args.iter()
                .find(|a| !truth(a))
                .unwrap_or(&args[n - 1])
                .clone()
        }
        "or" => {
            if n == 0 {
                return bad(f, "wants arguments");
            }
            args.iter()
                .find(|a| truth(a))
                .unwrap_or(&args[n - 1])
                .clone()
        }
        "not" => {
            need(1)?;
            Value::Bool(!truth(&args[0]))
        }
        "eq" => {
            if n < 2 {
                return bad(f, "wants at least 2 arguments");
            }
            Value::Bool(args[1..].iter().any(|b| equal(&args[0], b)))
        }
        "ne" => {
            need(2)?;
            Value::Bool(!equal(&args[0], &args[1]))
        }
        "lt" | "le" | "gt" | "ge" => {
            need(2)?;
            let o = order(f, &args[0], &args[1])?;
            Value::Bool(match f {
                "lt" => o.is_lt(),
                "le" => o.is_le(),
                "gt" => o.is_gt(),
                _ => o.is_ge(),
            })
        }
        "index" => {
            if n == 0 {
                return bad(f, "wants arguments");
            }
            let mut cur = args[0].clone();
            for k in &args[1..] {
                cur = match (&cur, k) {
                    (Value::Object(m), Value::String(key)) => {
                        m.get(key).cloned().unwrap_or(Value::Null)
                    }
                    (Value::Array(a), _) => {
                        let i = int_of(f, k)?;
                        match usize::try_from(i).ok().and_then(|i| a.get(i)) {
                            Some(v) => v.clone(),
                            None => return bad(f, "index out of range"),
                        }
                    }
                    (Value::Null, _) => return bad(f, "index of untyped nil"),
                    _ => return bad(f, "cannot index this value with this key"),
                };
            }
            cur
        }
        "len" => {
            need(1)?;
            Value::from(match &args[0] {
                Value::String(s) => s.len(),
                Value::Array(a) => a.len(),
                Value::Object(m) => m.len(),
                Value::Null => 0,
                _ => return bad(f, "len of a value without a length"),
            })
        }
        "print" | "cat" => {
            let parts: Vec<String> = args
                .iter()
                .filter(|a| !a.is_null() || f == "print")
                .map(string)
                .collect();
            Value::String(parts.join(if f == "cat" { " " } else { "" }))
        }
        "printf" => Value::String(printf(&args)?),
        "default" => match n {
            1 => args[0].clone(),
            2 if truth(&args[1]) => args[1].clone(),
            2 => args[0].clone(),
            _ => return bad(f, "wants 1 or 2 arguments"),
        },
        "empty" => {
            need(1)?;
            Value::Bool(!truth(&args[0]))
        }
        "coalesce" => args
            .iter()
            .find(|a| truth(a))
            .cloned()
            .unwrap_or(Value::Null),
        "ternary" => {
            need(3)?;
            if truth(&args[2]) {
                args[0].clone()
            } else {
                args[1].clone()
            }
        }
        "quote" | "squote" => {
            let parts: Vec<String> = args
                .iter()
                .filter(|a| !a.is_null())
                .map(|a| {
                    if f == "quote" {
                        go_quote(&string(a))
                    } else {
                        format!("'{}'", string(a))
                    }
                })
                .collect();
            Value::String(parts.join(" "))
        }
        "upper" | "lower" | "title" | "trim" | "toString" | "nospace" | "kebabcase"
        | "snakecase" => {
            need(1)?;
            let v = s(0);
            Value::String(match f {
                "upper" => v.to_uppercase(),
                "lower" => v.to_lowercase(),
                "title" => v
                    .split(' ')
                    .map(|w| {
                        let mut c = w.chars();
                        c.next()
                            .map(|h| h.to_uppercase().chain(c).collect())
                            .unwrap_or_default()
                    })
                    .collect::<Vec<String>>()
                    .join(" "),
                "trim" => v.trim().to_string(),
                "nospace" => v.chars().filter(|c| !c.is_whitespace()).collect(),
                "kebabcase" => words(&v).join("-"),
                "snakecase" => words(&v).join("_"),
                _ => v,
            })
        }
        "trimPrefix" | "trimSuffix" | "trimAll" | "contains" | "hasPrefix" | "hasSuffix" => {
            need(2)?;
            let (a, v) = (s(0), s(1));
            match f {
                "trimPrefix" => Value::String(v.strip_prefix(a.as_str()).unwrap_or(&v).to_string()),
                "trimSuffix" => Value::String(v.strip_suffix(a.as_str()).unwrap_or(&v).to_string()),
                "trimAll" => Value::String(v.trim_matches(|c| a.contains(c)).to_string()),
                "contains" => Value::Bool(v.contains(a.as_str())),
                "hasPrefix" => Value::Bool(v.starts_with(a.as_str())),
                _ => Value::Bool(v.ends_with(a.as_str())),
            }
        }
        "replace" => {
            need(3)?;
            let (old, new, v) = (s(0), s(1), s(2));
            // An empty `old` matches between every character.
            let hits = if old.is_empty() {
                v.chars().count() + 1
            } else {
                v.matches(old.as_str()).count()
            };
            let grown = hits.saturating_mul(new.len());
            bounded(f, v.len().saturating_add(grown), budget)?;
            Value::String(v.replace(&old, &new))
        }
        "hasKey" | "get" => {
            need(2)?;
            let Value::Object(m) = &args[0] else {
                return bad(f, "the first argument must be a map");
            };
            let v = m.get(&s(1));
            if f == "hasKey" {
                Value::Bool(v.is_some())
            } else {
                v.cloned().unwrap_or_else(|| Value::String(String::new()))
            }
        }
        "toJson" => {
            need(1)?;
            Value::String(args[0].to_string())
        }
        "trunc" => {
            need(2)?;
            let k = int_of(f, &args[0])?;
            let v: Vec<char> = s(1).chars().collect();
            let len = v.len() as i64;
            let out: String = if k >= 0 {
                v[..k.min(len) as usize].iter().collect()
            } else {
                v[(len + k).max(0) as usize..].iter().collect()
            };
            Value::String(out)
        }
        "join" => {
            need(2)?;
            let list = match &args[1] {
                Value::Array(a) => a.iter().map(string).collect::<Vec<_>>(),
                v => vec![string(v)],
            };
            let sep = s(0);
            let parts: usize = list.iter().map(String::len).sum();
            let seps = list.len().saturating_sub(1).saturating_mul(sep.len());
            bounded(f, parts.saturating_add(seps), budget)?;
            Value::String(list.join(&sep))
        }
        "splitList" => {
            need(2)?;
            let (sep, v) = (s(0), s(1));
            // Each piece is a value of its own: a step apiece, paid before the list is made.
            let pieces = if sep.is_empty() {
                v.chars().count() + 2
            } else {
                v.matches(sep.as_str()).count() + 1
            };
            budget.charge(pieces as u64)?;
            Value::Array(
                v.split(sep.as_str())
                    .map(|p| Value::String(p.to_string()))
                    .collect(),
            )
        }
        "list" => Value::Array(args),
        "uniq" => {
            need(1)?;
            let Value::Array(a) = &args[0] else {
                return bad(f, "wants a list");
            };
            let mut out: Vec<Value> = Vec::new();
            for v in a {
                // Quadratic: each entry is compared with those kept so far.
                budget.charge(1 + (out.len() / 16) as u64)?;
                if !out.contains(v) {
                    out.push(v.clone());
                }
            }
            Value::Array(out)
        }
        "toYaml" => {
            need(1)?;
            // JSON is YAML: one line, read back as the same value.
            Value::String(args[0].to_string())
        }
        "dict" => {
            let mut m = Map::new();
            for pair in args.chunks(2) {
                m.insert(
                    string(&pair[0]),
                    pair.get(1).cloned().unwrap_or(Value::String(String::new())),
                );
            }
            Value::Object(m)
        }
        "int" => {
            need(1)?;
            Value::from(int_of(f, &args[0])?)
        }
        "repeat" => {
            need(2)?;
            let k = int_of(f, &args[0])?.clamp(0, 10_000) as usize;
            let v = s(1);
            bounded(f, v.len().saturating_mul(k), budget)?;
            Value::String(v.repeat(k))
        }
        _ => return bad(f, "not defined"),
    })
}
