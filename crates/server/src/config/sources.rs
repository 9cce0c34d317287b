//! Where the settings come from: the defaults, the file, then the environment, merged by
//! figment in that order (a later layer wins), and the name a value is blamed by in a
//! message: `FLASHSALE_<KEY>` when it came from the environment (or is the default),
//! `<key> (config file)` when it came from the file.

use std::collections::HashMap;
use std::fmt::Display;

use figment::error::{Actual, Kind};
use figment::providers::{Format, Serialized, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};

use super::settings::{Settings, DEFAULTS};
use super::ConfigError;

/// The prefix of every variable the service reads.
const PREFIX: &str = "FLASHSALE_";

/// `FLASHSALE_` variables of the project's own tools, passed over rather than refused as
/// unknown: the integration tests' (`FLASHSALE_IT_…`, in the environment of the binary
/// they start), the simulator's, the fuzzer's, scripts/galera.sh's, the benchmarks'
/// binary and the OpenAPI test's switch. A name ending in `_` is a prefix.
const TOOL_VARIABLES: &[&str] = &[
    "FLASHSALE_IT_",
    "FLASHSALE_SIM_",
    "FLASHSALE_FUZZ_",
    "FLASHSALE_GALERA_",
    "FLASHSALE_BIN",
    "FLASHSALE_WRITE_OPENAPI",
];

/// The layers' names: a value's layer decides the name it is blamed by.
const DEFAULTS_LAYER: &str = "defaults";
const FILE_LAYER: &str = "config file";
const ENV_LAYER: &str = "environment";

/// Least similarity (Jaro, as clap's suggestions) of a known name to an unknown one
/// for it to be suggested: below it the names share too little to be a typo.
const SUGGESTION_SIMILARITY_MIN: f64 = 0.7;

/// A layer under its name.
struct Layer<P>(&'static str, P);

impl<P: Provider> Provider for Layer<P> {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.0)
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        self.1.data()
    }
}

/// The environment's layer: every `FLASHSALE_` variable but the tools', by its key (the
/// rest of its name in lower case). A name with lower-case letters is not the service's
/// and is passed over, as any other variable.
fn environment(env: &HashMap<String, String>) -> Layer<Serialized<Dict>> {
    let tool = |var: &str| {
        TOOL_VARIABLES.iter().any(|t| match t.ends_with('_') {
            true => var.starts_with(t),
            false => var == *t,
        })
    };
    let values: Dict = env
        .iter()
        .filter(|(var, _)| !tool(var))
        .filter_map(|(var, value)| {
            let key = var.strip_prefix(PREFIX)?;
            let ours = !key.is_empty() && !key.bytes().any(|b| b.is_ascii_lowercase());
            ours.then(|| (key.to_ascii_lowercase(), Value::from(value.as_str())))
        })
        .collect();
    Layer(ENV_LAYER, Serialized::defaults(values))
}

/// The settings of the defaults, the file's text (if any) and the environment, with
/// where each came from.
pub(super) fn read(
    file: Option<&str>,
    env: &HashMap<String, String>,
) -> Result<(Settings, Origin), ConfigError> {
    let defaults: Dict = DEFAULTS
        .iter()
        .map(|(key, value)| ((*key).to_owned(), Value::from(*value)))
        .collect();
    let mut figment = Figment::from(Layer(DEFAULTS_LAYER, Serialized::defaults(defaults)));
    if let Some(text) = file {
        figment = figment.merge(Layer(FILE_LAYER, Toml::string(text)));
    }
    let origin = Origin(figment.merge(environment(env)));
    let settings = origin.0.extract().map_err(|e| origin.explain(e))?;
    Ok((settings, origin))
}

/// The merged layers, asked where a value came from.
pub(super) struct Origin(Figment);

impl Origin {
    fn layer(&self, key: &str) -> Option<&str> {
        self.0.find_metadata(key).map(|m| m.name.as_ref())
    }

    /// The name a message blames `key` by.
    pub(super) fn name(&self, key: &str) -> String {
        name(self.layer(key), key)
    }

    /// Whether the file or the environment set `key` (rather than its default).
    pub(super) fn is_set(&self, key: &str) -> bool {
        matches!(self.layer(key), Some(FILE_LAYER | ENV_LAYER))
    }

    /// `key`'s value as given (a whole number in the file as its digits).
    pub(super) fn given(&self, key: &str) -> String {
        match self.0.find_value(key) {
            Ok(Value::String(_, text)) => text,
            Ok(value) => value
                .to_i128()
                .map_or_else(|| value.to_actual().to_string(), |n| n.to_string()),
            Err(_) => String::new(),
        }
    }

    /// A refusal of `key`'s value: its name, then `message`.
    pub(super) fn refuse(&self, key: &str, message: impl Display) -> ConfigError {
        ConfigError(format!("{}: {message}", self.name(key)))
    }

    /// A figment error as a message that names the variable or key, quotes the value
    /// and says what is allowed.
    fn explain(&self, error: figment::Error) -> ConfigError {
        let layer = error.metadata.as_ref().map(|m| m.name.as_ref());
        let message = match error.kind {
            Kind::UnknownField(field, known) => return self.unknown(&field, known),
            Kind::InvalidType(actual, expected) | Kind::InvalidValue(actual, expected) => {
                format!("{} is not {expected}", shown(&actual))
            }
            Kind::UnknownVariant(given, allowed) => {
                format!("{given:?} is not {}", alternatives(allowed))
            }
            kind => kind.to_string(),
        };
        match error.path.first() {
            Some(key) => ConfigError(format!("{}: {message}", name(layer, key))),
            None => ConfigError(format!("{}: {message}", layer.unwrap_or("configuration"))),
        }
    }

    /// The refusal of a key no setting has, with the nearest known one.
    fn unknown(&self, key: &str, known: &[&str]) -> ConfigError {
        let nearest = known
            .iter()
            .map(|k| (strsim::jaro(key, k), *k))
            .filter(|(similarity, _)| *similarity >= SUGGESTION_SIMILARITY_MIN)
            .max_by(|a, b| a.0.total_cmp(&b.0));
        let (unknown, suggestion) = match self.layer(key) {
            Some(FILE_LAYER) => (
                format!("config file: unknown key {key:?}"),
                nearest.map(|(_, k)| format!("{k:?}")),
            ),
            _ => (
                format!("unknown variable {}", name(None, key)),
                nearest.map(|(_, k)| name(None, k)),
            ),
        };
        ConfigError(match suggestion {
            Some(s) => format!("{unknown}; did you mean {s}?"),
            None => format!("{unknown} (docs/configuration.md lists every setting)"),
        })
    }
}

/// `key`'s name in a message, as its `layer` gave it.
fn name(layer: Option<&str>, key: &str) -> String {
    match layer {
        Some(FILE_LAYER) => format!("{key} (config file)"),
        _ => format!("{PREFIX}{}", key.to_ascii_uppercase()),
    }
}

/// A value in a message: text quoted, anything else as figment describes it.
fn shown(actual: &Actual) -> String {
    match actual {
        Actual::Str(text) => format!("{text:?}"),
        other => other.to_string(),
    }
}

/// `a`, `a or b`, `a, b or c`.
fn alternatives(allowed: &[&str]) -> String {
    match allowed.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => "nothing".to_owned(),
    }
}
