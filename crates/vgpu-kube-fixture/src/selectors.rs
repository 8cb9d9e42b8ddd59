//! Label and field selectors as the API server parses them
//! (`k8s.io/apimachinery/pkg/labels`, `pkg/fields`): labels take `k=v`,
//! `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`; fields take
//! `k=v`, `k==v`, `k!=v` over the few field paths each resource supports.
//! Parsing only; the resource table says which fields exist.

use std::collections::BTreeMap;

/// A parse error, reported as 400 Bad Request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelTerm {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector (all terms must hold).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<LabelTerm>);

fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn check_key(k: &str, whole: &str) -> Result<String, SelectorError> {
    let ok = !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(k.to_owned())
    } else {
        Err(SelectorError(format!(
            "unable to parse requirement: invalid label key {k:?} in {whole:?}"
        )))
    }
}

fn check_value(v: &str, whole: &str) -> Result<String, SelectorError> {
    let ok = v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(v.to_owned())
    } else {
        Err(SelectorError(format!(
            "unable to parse requirement: invalid label value {v:?} in {whole:?}"
        )))
    }
}

fn parse_set(rest: &str, whole: &str) -> Result<Vec<String>, SelectorError> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            SelectorError(format!(
                "found {rest:?}, expected: '(' ... ')' in {whole:?}"
            ))
        })?;
    inner
        .split(',')
        .map(|v| check_value(v.trim(), whole))
        .collect()
}

impl LabelSelector {
    /// Parses `labelSelector=`; empty selects everything.
    pub fn parse(s: &str) -> Result<LabelSelector, SelectorError> {
        let mut terms = Vec::new();
        if s.trim().is_empty() {
            return Ok(LabelSelector(terms));
        }
        for raw in split_top_level(s) {
            let t = raw.trim();
            if t.is_empty() {
                return Err(SelectorError(format!("empty requirement in {s:?}")));
            }
            let term = if let Some(k) = t.strip_prefix('!') {
                LabelTerm::NotExists(check_key(k.trim(), s)?)
            } else if let Some((k, v)) = t.split_once("!=") {
                LabelTerm::Ne(check_key(k.trim(), s)?, check_value(v.trim(), s)?)
            } else if let Some((k, v)) = t.split_once("==") {
                LabelTerm::Eq(check_key(k.trim(), s)?, check_value(v.trim(), s)?)
            } else if let Some((k, v)) = t.split_once('=') {
                LabelTerm::Eq(check_key(k.trim(), s)?, check_value(v.trim(), s)?)
            } else if let Some((k, rest)) = t.split_once(" notin ") {
                LabelTerm::NotIn(check_key(k.trim(), s)?, parse_set(rest, s)?)
            } else if let Some((k, rest)) = t.split_once(" in ") {
                LabelTerm::In(check_key(k.trim(), s)?, parse_set(rest, s)?)
            } else {
                LabelTerm::Exists(check_key(t, s)?)
            };
            terms.push(term);
        }
        Ok(LabelSelector(terms))
    }

    /// True when every term holds for `labels`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|t| match t {
            LabelTerm::Eq(k, v) => labels.get(k) == Some(v),
            LabelTerm::Ne(k, v) => labels.get(k) != Some(v),
            LabelTerm::In(k, vs) => labels.get(k).is_some_and(|x| vs.contains(x)),
            LabelTerm::NotIn(k, vs) => labels.get(k).is_none_or(|x| !vs.contains(x)),
            LabelTerm::Exists(k) => labels.contains_key(k),
            LabelTerm::NotExists(k) => !labels.contains_key(k),
        })
    }
}

/// A parsed field selector: `(path, wanted value, equal?)` terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<(String, String, bool)>);

impl FieldSelector {
    /// Parses `fieldSelector=`; `supported` says which paths the resource
    /// has (anything else is refused as the API server does).
    pub fn parse(s: &str, supported: &[&str]) -> Result<FieldSelector, SelectorError> {
        let mut terms = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector(terms));
        }
        for raw in s.split(',') {
            let t = raw.trim();
            let (k, v, eq) = if let Some((k, v)) = t.split_once("!=") {
                (k, v, false)
            } else if let Some((k, v)) = t.split_once("==") {
                (k, v, true)
            } else if let Some((k, v)) = t.split_once('=') {
                (k, v, true)
            } else {
                return Err(SelectorError(format!(
                    "invalid selector: '{s}'; can't understand '{t}'"
                )));
            };
            let k = k.trim();
            if !supported.contains(&k) && k != "metadata.name" && k != "metadata.namespace" {
                return Err(SelectorError(format!("field label not supported: {k}")));
            }
            terms.push((k.to_owned(), v.trim().to_owned(), eq));
        }
        Ok(FieldSelector(terms))
    }

    /// True when every term holds; `get` reads a field path of the object
    /// (a missing field reads as the empty string, as the API server's
    /// field sets do).
    pub fn matches(&self, get: impl Fn(&str) -> String) -> bool {
        self.0.iter().all(|(k, v, eq)| (get(k) == *v) == *eq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_forms() {
        let l = labels(&[("hami.io/vgpu-node", "n1"), ("app", "web")]);
        for (s, want) in [
            ("", true),
            ("hami.io/vgpu-node=n1", true),
            ("hami.io/vgpu-node==n2", false),
            ("app!=web", false),
            ("app in (web, db)", true),
            ("app notin (web)", false),
            ("app,!tier", true),
            ("tier", false),
            ("app=web,hami.io/vgpu-node in (n1,n2)", true),
        ] {
            assert_eq!(LabelSelector::parse(s).unwrap().matches(&l), want, "{s}");
        }
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("a=b=c").is_err());
        assert!(LabelSelector::parse("a,,b").is_err());
    }

    #[test]
    fn field_forms() {
        let f = FieldSelector::parse(
            "spec.nodeName=n1,status.phase!=Failed",
            &["spec.nodeName", "status.phase"],
        )
        .unwrap();
        assert!(f.matches(|k| if k == "spec.nodeName" {
            "n1".into()
        } else {
            "Pending".into()
        }));
        assert!(!f.matches(|k| if k == "spec.nodeName" {
            "n2".into()
        } else {
            "Pending".into()
        }));
        assert!(FieldSelector::parse("spec.bogus=1", &["spec.nodeName"]).is_err());
        assert!(FieldSelector::parse("nonsense", &[]).is_err());
    }
}
