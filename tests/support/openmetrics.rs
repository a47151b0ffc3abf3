//! A small parser of the host's OpenMetrics text, so tests can assert exact values and
//! label sets of what `Metrics::encode` (or a node's `GET /metrics`) produced.

use std::collections::BTreeMap;

/// One sample of the text exposition.
#[derive(Debug)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses OpenMetrics text: `name{k="v",...} value` lines; comments skipped. Label values
/// here never hold quotes or commas, so no unescaping is needed.
pub fn parse(text: &str) -> Vec<Sample> {
    assert!(text.ends_with("# EOF\n"), "not OpenMetrics text:\n{text}");
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("a value");
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.strip_suffix('}').expect("closing brace")),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let (key, value) = pair.split_once('=').expect("key=value");
                    (key.to_owned(), value.trim_matches('"').to_owned())
                })
                .collect();
            Sample {
                name: name.to_owned(),
                labels,
                value: value.parse().expect("a number"),
            }
        })
        .collect()
}

/// The value of `name` with exactly `labels`, or `None`.
pub fn find(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    samples
        .iter()
        .find(|s| s.name == name && s.labels == want)
        .map(|s| s.value)
}

/// [`find`], failing with every sample of `name` when it is missing.
pub fn get(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    find(samples, name, labels).unwrap_or_else(|| {
        let of_name: Vec<_> = samples.iter().filter(|s| s.name == name).collect();
        panic!("no {name}{labels:?}; have {of_name:#?}")
    })
}
